"""Recipes: the only configuration of a run, Pydantic-validated and loaded from TOML.

Defaults are what the authors' code did (docs/paper-facts.md#training-settings); the paper-text
values are one option away (e.g. `optim.betas = [0.9, 0.999]`, `optim.schedule = "cosine"`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, ClassVar, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)
from rapidfuzz import process

from perencode import kinds, plugins
from perencode.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

import tomli_w


class Section(BaseModel):
    # Every number of a recipe is a physical quantity (a rate, a decay, a size): inf and nan
    # are refused before anything is written, never trained on.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        """`true` where a number is meant is a mistake, not 1 (Pydantic would take it)."""
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name)
                values = value if isinstance(value, (list, tuple)) else [value]
                if field is not None and any(isinstance(v, bool) for v in values) and \
                        bool not in (field.annotation, *get_args(field.annotation)):
                    raise ValueError(f"field '{name}': expected a number, got a boolean "
                                     f"({json.dumps(value)})")
        return data


def registered(kind: str, name: str, info: ValidationInfo) -> str:
    """A field validator's check that `name` is a registered kind (perencode.kinds), unless
    the validation reads results (context `any_kind`: a run made with a kind the reader has
    not imported is still a result, under its raw name)."""
    if name not in kinds.registry(kind) and not (info.context or {}).get("any_kind"):
        raise ValueError(f"Input should be {kinds.choices(kind)}; {kinds.PLUGIN_HINT}")
    return name


class KindConfig(Section):
    """Base of a section that names a registered kind in its tag field (`task.name`,
    `model.arch`, `encoding.kind`). The section is a union tagged by that field: each kind's
    registration (perencode.kinds) names the config class that holds its own options, a
    subclass of the section's base beside the kind's code (e.g. the dual-frequency task's
    `rarity`), and `Recipe` validates a table with the class its tag names. The union is
    open: a study's `register_*` call adds a member, which a union fixed when `Recipe` is
    defined could not take; `json_schema` writes it as a discriminated `oneOf`."""

    KIND: ClassVar[str]  # "task", "model" or "encoding"
    TAG: ClassVar[str]   # the field that names the kind

    @classmethod
    def named(cls, table: dict) -> Any:
        """The kind a table names: its tag, or the tag's default."""
        return table.get(cls.TAG, cls.model_fields[cls.TAG].default)

    @classmethod
    def foreign(cls, table: dict, chosen: type[KindConfig]) -> dict[str, list[str]]:
        """The keys of `table` that the class `chosen` lacks and other kinds have, each
        with those kinds' names (none for a kind no registration holds: it keeps all)."""
        owners = cls.options() if chosen is not _OPEN.get(cls) else {}
        return {k: owners[k] for k in table if k not in chosen.model_fields and k in owners}

    @classmethod
    def default(cls) -> KindConfig:
        """The section a recipe gets when it leaves the table out (the tag's default)."""
        return cls.class_for(cls.model_fields[cls.TAG].default)()

    @classmethod
    def class_for(cls, name: Any, any_kind: bool = False) -> type[KindConfig]:
        """The config class of the kind named `name`; with `any_kind`, a name no
        registration holds (a result made by a study the reader has not imported) gets a
        class that keeps whatever options the table has."""
        kind = kinds.registry(cls.KIND).get(name)
        if kind is not None:
            return kind.config or cls
        if any_kind and isinstance(name, str):
            return _open_class(cls)
        raise ValueError(f"field '{cls.TAG}': Input should be {kinds.choices(cls.KIND)} "
                         f"(got {name!r}); {kinds.PLUGIN_HINT}")

    @classmethod
    def of(cls, **fields: Any) -> KindConfig:
        """The section of the kind `fields` names, validated by its class (as in a recipe):
        `TaskConfig.of(name="dual_frequency", rarity=0.25)`."""
        return cls.dispatch(fields, {})

    @classmethod
    def options(cls) -> dict[str, list[str]]:
        """Each option a kind adds to the base, with the names of the kinds that have it."""
        out: dict[str, list[str]] = {}
        for name, kind in kinds.registry(cls.KIND).items():
            for option in (kind.config or cls).model_fields:
                if option not in cls.model_fields:
                    out.setdefault(option, []).append(name)
        return out

    @classmethod
    def renamed(cls, data: dict) -> None:
        """Keys of earlier versions that now have another home: a ValueError naming it."""

    @classmethod
    def dispatch(cls, data: Any, context: dict) -> Any:
        """Validate the table `data` with the class its tag names.

        An option of another kind is refused with a line naming its owners, except in a
        stored recipe (`context["stored"]`: a run directory's or a checkpoint's), where it
        is dropped: before each kind had its own class, every section carried every kind's
        options, and such a file must still read as the same run."""
        if isinstance(data, KindConfig):
            if type(data) is cls.class_for(getattr(data, cls.TAG), True):
                return data
            data = data.model_dump()
        if not isinstance(data, dict):
            return cls.model_validate(data)  # "must be a table"
        cls.renamed(data)
        name = cls.named(data)
        chosen = cls.class_for(name, bool(context.get("any_kind")))
        foreign = cls.foreign(data, chosen)
        if foreign and not context.get("stored"):
            key, owners = next(iter(foreign.items()))
            raise ValueError(f"field '{key}': not an option of {kinds.FIELDS[cls.KIND]} = "
                             f"{name!r} (only of {', '.join(map(repr, owners))})")
        data = {k: v for k, v in data.items() if k not in foreign}
        return chosen.model_validate(data, context=context)


_OPEN: dict[type, type] = {}


def _open_class(base: type[KindConfig]) -> type[KindConfig]:
    """`base` taking any extra option: the section of a kind no registration holds."""
    if base not in _OPEN:
        _OPEN[base] = type(f"Unregistered{base.__name__}", (base,),
                           {"model_config": ConfigDict(extra="allow"), "__module__": __name__})
    return _OPEN[base]


def foreign_options(data: dict[str, Any]) -> list[str]:
    """The dotted keys of recipe dict `data` that are options of another kind than the one
    its section names (e.g. `task.rarity` in a reverse task's table)."""
    out = []
    for section in ("task", "model", "encoding"):
        table, base = data.get(section), Recipe.model_fields[section].annotation
        if not isinstance(table, dict):
            continue
        try:
            chosen = base.class_for(base.named(table))
        except ValueError:
            continue  # an unknown kind: validation names it
        out += [f"{section}.{key}" for key in base.foreign(table, chosen)]
    return out


class KindNames:
    """`json_schema_extra` of a field that names a registered kind: the JSON schema lists
    the names registered when it is generated, and `schema_rows` their summaries."""

    def __init__(self, kind: str):
        self.kind = kind

    def __call__(self, schema: dict) -> None:
        schema["enum"] = kinds.names(self.kind)
        schema["description"] = self.describe(schema.get("description", ""))

    def describe(self, description: str) -> str:
        """The field's description followed by each registered kind's summary."""
        return description + ": " + "; ".join(
            f"{k.name} = {k.summary or k.label}" for k in kinds.registry(self.kind).values()
        ) + "."


class TaskConfig(KindConfig):
    """[task]: what every task has. A task's own options are in its config class: held-out
    counts (perencode.tasks.base.HeldOutConfig), `min_length`, `rarity`, `data`..."""

    KIND: ClassVar[str] = "task"
    TAG: ClassVar[str] = "name"
    # Periodic checkpoints a run keeps when train.keep_checkpoints is unset: the newest one,
    # or "all" for a task whose analysis reads every one (dual_frequency's stability).
    KEEP_CHECKPOINTS: ClassVar[int | str] = 1

    name: str = Field(
        "reverse",
        description="Task (docs/paper-facts.md#tasks and #language-modelling)",
        json_schema_extra=KindNames("task"),
    )
    vocab_size: int = Field(
        256, ge=2, le=1 << 20,
        description="K, the number of distinct input/output tokens (lm: the SentencePiece "
        "vocabulary V; the head then has V - 1 classes, "
        "docs/paper-facts.md#language-modelling).",
    )
    length: int = Field(
        64, ge=1, le=4096,
        description="L, input length (the longest one for variable_length; for lm the "
        "maximum input tokens per paragraph, equal to `lm-prepare --max-tokens`).",
    )

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str, info: ValidationInfo) -> str:
        return registered("task", name, info)

    @classmethod
    def renamed(cls, data: dict) -> None:
        """The variants of reverse were flags before they were tasks: say the new name."""
        if "dual_frequency" in data:
            raise ValueError("field 'dual_frequency': the flag is gone; the task is named "
                             "now: task.name = \"dual_frequency\"")
        if data.get("name", "reverse") == "reverse" and data.get("min_length") is not None:
            raise ValueError("field 'min_length': variable length is a task of its own "
                             "now: task.name = \"variable_length\"")

    def distinct_sequences(self) -> int | None:
        """How many distinct held-out rows the task can draw; None where it has no
        held-out count (its test set is structured, or a data split)."""
        return None


class ModelConfig(KindConfig):
    """[model]: what every model has; a model's own options are in its config class (the
    S4D's `d_state`, perencode.models.s4d)."""

    KIND: ClassVar[str] = "model"
    TAG: ClassVar[str] = "arch"

    arch: str = Field(
        "gru", description="Sequence model, single layer (docs/paper-facts.md#common-model "
        "and #s4d-model)", json_schema_extra=KindNames("model"),
    )
    hidden_size: int = Field(
        512, ge=1, le=65536, description="Hidden size of the RNN, d_model of the S4D layer."
    )
    embed_size: int = Field(
        512, ge=2, le=65536, description="E, token embedding size (the PE has the same size)."
    )

    @field_validator("arch")
    @classmethod
    def _registered(cls, arch: str, info: ValidationInfo) -> str:
        return registered("model", arch, info)

    @model_validator(mode="after")
    def _even(self) -> ModelConfig:
        if self.embed_size % 2:
            raise ValueError(f"field 'embed_size': must be even (sines and cosines), got "
                             f"{self.embed_size}")
        return self


class EncodingConfig(KindConfig):
    """[encoding]: the positional encoding and how it joins the embedding."""

    KIND: ClassVar[str] = "encoding"
    TAG: ClassVar[str] = "kind"

    kind: str = Field(
        "sinusoidal", description="Positional encoding (docs/paper-facts.md#positional-encodings)",
        json_schema_extra=KindNames("encoding"),
    )
    mode: Literal["concat", "add"] = Field(
        "concat", description="Combine the encoding with the embedding by concat or add."
    )

    @field_validator("kind")
    @classmethod
    def _registered(cls, kind: str, info: ValidationInfo) -> str:
        return registered("encoding", kind, info)

    @model_validator(mode="after")
    def _mode(self) -> EncodingConfig:
        kind = kinds.registry("encoding").get(self.kind)
        modes = kind.modes if kind is not None else (self.mode,)
        if self.mode not in modes:
            raise ValueError(f"field 'mode': encoding.kind = '{self.kind}' needs mode = "
                             f"{' or '.join(repr(m) for m in modes)}")
        return self


# The largest float32: torch's optimizers turn their coefficients into float32 numbers.
FLOAT32_MAX = 3.4028234663852886e38
# Seeds are 32-bit, so that the offset streams (runs.TRAINING_SEED_OFFSET, ...) of every
# seed stay within what torch.manual_seed takes, as NumPy-style seeds do.
MAX_SEED = 2**32 - 1


class OptimConfig(Section):
    lr: float = Field(1e-3, gt=0.0, le=10.0, description="Peak learning rate of Adam.")
    betas: tuple[float, float] = Field(
        (0.9, 0.98),
        description="Adam betas. Code: [0.9, 0.98]; paper text: [0.9, 0.999].",
    )
    eps: float = Field(1e-9, gt=0.0, le=1.0, description="Adam epsilon (code: 1e-9).")
    weight_decay: float = Field(0.0, ge=0.0, description="Adam weight decay "
                                "(a float32 number: torch's Adam converts it).")
    warmup: int = Field(1000, ge=0, description="Linear warm-up iterations.")
    schedule: Literal["timm", "cosine"] = Field(
        "timm",
        description="timm = the authors' timm CosineLRScheduler stepped after each "
        "iteration (last lr about 2.7e-8, docs/paper-facts.md#learning-rate-schedule); "
        "cosine = warm-up then cosine reaching 0 at the last iteration.",
    )
    clip_norm: float = Field(
        1.0, ge=0.0, description="Global gradient-norm clip (0 disables; code: 1.0)."
    )

    @field_validator("weight_decay", "clip_norm")
    @classmethod
    def _float32(cls, value: float) -> float:
        if value > FLOAT32_MAX:
            raise ValueError("must be at most 3.4e38 (torch's Adam takes it as a float32)")
        return value

    @field_validator("betas", mode="before")
    @classmethod
    def _two_betas(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)) and len(value) != 2:
            raise ValueError("expects two numbers [beta1, beta2], e.g. [0.9, 0.98]")
        return value

    @model_validator(mode="after")
    def _betas(self) -> OptimConfig:
        if not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"field 'betas': each must be in [0, 1), got {list(self.betas)}")
        return self


class TrainConfig(Section):
    iterations: int = Field(300_000, ge=1, description="Optimizer steps (batches).")
    batch_size: int = Field(512, ge=1, description="Fresh random sequences per iteration.")
    checkpoint_every: int = Field(
        5000, ge=1, description="Save checkpoints/step-<k>.pt every this many iterations."
    )
    seed: int = Field(111, ge=0, le=MAX_SEED, description="Seed of initialisation, held-out "
                      "set and batches (0 to 4294967295).")
    log_every: int = Field(100, ge=1, description="Write a metrics.jsonl row every N steps.")
    eval_batch_size: int = Field(1024, ge=1, description="Batch size when scoring held-out.")
    keep_checkpoints: int | Literal["all"] | None = Field(
        None, description="Periodic checkpoints kept on disk: \"all\" or the newest N >= 1 "
        "(older ones are deleted once a newer one is written). Unset: all for dual_frequency "
        "(the gradient-stability analysis of Fig. 4-5 reads every one), 1 otherwise (an "
        "LSTM at K = 16,384 takes about 240 MB a checkpoint). Not part of the run's identity.")

    @field_validator("keep_checkpoints")
    @classmethod
    def _at_least_one(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 1:
            raise ValueError("\"all\" or an integer >= 1")
        return value


class Recipe(Section):
    description: str = Field("", description="What this recipe reproduces (free text).")
    # SerializeAsAny: a section dumps the fields of its kind's class, not only the base's.
    task: SerializeAsAny[TaskConfig] = Field(default_factory=TaskConfig.default)
    model: SerializeAsAny[ModelConfig] = Field(default_factory=ModelConfig.default)
    encoding: SerializeAsAny[EncodingConfig] = Field(default_factory=EncodingConfig.default)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)

    @field_validator("task", "model", "encoding", mode="wrap")
    @classmethod
    def _tagged(cls, data: Any, handler: Any, info: ValidationInfo) -> KindConfig:
        """Each kind section is validated by the class its tag names (KindConfig)."""
        base = cls.model_fields[info.field_name].annotation
        return base.dispatch(data, info.context or {})

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    def to_toml_every_field(self) -> str:
        """`to_toml` plus a comment line for each unset field (TOML has no null), so that
        every field of the recipe is shown (`perencode show`)."""
        data = self.model_dump(mode="json")
        parts = [tomli_w.dumps({"description": data.pop("description")})]
        for section, values in data.items():
            text = tomli_w.dumps({section: {k: v for k, v in values.items() if v is not None}})
            unset = [k for k, v in values.items() if v is None]
            parts.append(text + "".join(f"# {key} = unset (see `perencode recipe-schema`)\n"
                                        for key in unset))
        return "\n".join(parts)

    def identity(self) -> dict[str, Any]:
        """What makes two runs the same run (see `identity`)."""
        return identity(self.to_dict())

    def checkpoints_kept(self) -> int | None:
        """How many periodic checkpoints a run keeps; None: all (train.keep_checkpoints)."""
        keep = self.train.keep_checkpoints
        if keep is None:
            keep = self.task.KEEP_CHECKPOINTS
        return None if keep == "all" else keep


def identity(data: dict[str, Any]) -> dict[str, Any]:
    """What makes two runs the same run: the resolved recipe dict without its free-text
    description and its checkpoint retention, so editing those never turns a finished run
    into "a different recipe". The one definition used by run directories, checkpoints,
    sweeps and results."""
    out = {k: v for k, v in data.items() if k != "description"}
    if "keep_checkpoints" in out.get("train", {}):
        out["train"] = {k: v for k, v in out["train"].items() if k != "keep_checkpoints"}
    return out


def run_key(recipe: Recipe) -> str:
    """`identity` as a hashable string (sweeps and results index runs by it)."""
    return json.dumps(recipe.identity(), sort_keys=True)


SECTIONS = ("task", "model", "encoding", "optim", "train")


def parse_value(text: str) -> Any:
    """A `--set` value, read as a TOML literal (`64`, `1e-3`, `true`, `[0.9, 0.999]`, `"x"`);
    a bare word that is not TOML (`lstm`) is taken as a string. The recipe's fields then
    check the type: no string or boolean where a number is meant."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str], source: str = "--set") -> dict:
    """Apply dotted `section.key=value` overrides to a recipe dict (a new dict is returned)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items()}
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(f"{source} '{item}': expected section.key=value "
                            f"(sections: {', '.join(SECTIONS)})")
        parts = key.split(".")
        if len(parts) == 1 and parts[0] == "description":
            out["description"] = parse_value(value.strip())
            continue
        if len(parts) != 2 or parts[0] not in SECTIONS:
            raise UserError(f"{source} '{item}': key must be section.key with section one of "
                            f"{', '.join(SECTIONS)}")
        section = out.setdefault(parts[0], {})
        if not isinstance(section, dict):
            raise UserError(f"{source} '{item}': [{parts[0]}] is not a table")
        section[parts[1]] = parse_value(value.strip())
    return out


def _model_at(model: type[BaseModel], path: list[str], data: Any = None) -> type[BaseModel] | None:
    """The Pydantic model of the table at `path` inside `model` (None if not a table); a
    kind section's is the class its tag names in `data`, the validated input."""
    for part in path:
        field = model.model_fields.get(part)
        model = field.annotation if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        data = data.get(part) if isinstance(data, dict) else None
        if issubclass(model, KindConfig) and isinstance(data, dict):
            try:
                model = model.class_for(model.named(data), any_kind=True)
            except ValueError:
                pass
    return model


def format_validation_error(exc: ValidationError, source: str,
                            model: type[BaseModel] | None = None, table: str = "",
                            top: str = "the top level", data: Any = None) -> str:
    """One line for any of our Pydantic models (recipes, grid tables, claims): the file,
    the field and what is allowed, with "did you mean" for an unknown key.

    `model` is the validated class (default Recipe); `table` names it inside its file
    (e.g. "slurm" for a grid's [slurm] table) when it is not the whole file; `top` is how
    an unknown key's place is named when it is not in a table (e.g. "the claim"); `data`,
    the validated input, tells which class a kind section was validated with.
    """
    model = model or Recipe
    errors = exc.errors()
    # A misspelt key is both unknown and (its right spelling) missing: name the unknown one.
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = [str(p) for p in err["loc"]]
    where = ".".join(loc)
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if msg.startswith("field '"):  # a model validator naming the field it is about
        field, _, msg = msg[len("field '"):].partition("': ")
        where = ".".join([*loc, field])
    if err["type"] == "extra_forbidden":
        owner = _model_at(model, loc[:-1], data)
        allowed = list(owner.model_fields) if owner is not None else []
        guess = process.extractOne(loc[-1], allowed) if allowed else None
        hint = f"; did you mean '{guess[0]}'?" if guess and guess[1] >= 70 else ""
        inside = ".".join([table, *loc[:-1]] if table else loc[:-1])
        name = f"[{inside}]" if inside else top
        msg = f"unknown key '{loc[-1]}' in {name} (allowed: {', '.join(allowed)}){hint}"
    elif err["type"] in ("model_attributes_type", "dict_type", "model_type"):
        msg = f"must be a table, got {err.get('input')!r}"
    elif "input" in err and err["type"] != "missing" and not isinstance(err["input"], dict):
        msg = f"{msg} (got {err['input']!r})"
    if table:
        where = f"[{table}] {where}".rstrip()
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: {where or 'recipe'}: {msg}{more}"


def validate_table(model: type[BaseModel], data: Any, source: str, table: str = "",
                   top: str = "the top level", context: dict | None = None):
    """`model.model_validate(data, context=context)`, any mistake as a one-line UserError."""
    if not isinstance(data, dict):
        name = f"[{table}]" if table else "it"
        raise UserError(f"{source}: {name} must be a table, got {data!r}")
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise UserError(format_validation_error(exc, source, model, table, top, data)) from None


def validate(data: dict[str, Any], source: str, any_kind: bool = False,
             stored: bool = False) -> Recipe:
    """A recipe; `any_kind` accepts kinds no registration knows (reading results); `stored`
    reads one a run wrote (a run directory's or a checkpoint's: see KindConfig.dispatch)."""
    return validate_table(Recipe, data, source,
                          context={"any_kind": any_kind, "stored": stored})


def read_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a folder; give a recipe file (e.g. "
                        f"recipes/gru_vocab256.toml)")
    if not path.is_file():
        raise UserError(f"{path}: recipe file not found")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file") from None


# Top-level keys of a grid file (perencode.grid), never of a recipe.
GRID_KEYS = ("base", "grid", "sweep", "slurm")


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read a TOML recipe, apply `--set` overrides, validate; UserError on any mistake."""
    data = read_toml(path)
    found = [key for key in GRID_KEYS if key in data]
    if found:
        raise UserError(f"{path}: this is a grid (it has {', '.join(found)}), not a recipe: "
                        f"run its cells with `perencode sweep {path}`")
    if overrides:
        data = apply_overrides(data, overrides)
    plugins.require(Path(path).parent, data)  # a run's recipe.toml: the plugin it needs
    source = f"{path}" + (" (with --set)" if overrides else "")
    recipe = validate(data, source)
    if "name" not in data.get("task", {}):
        # An empty file would otherwise be every default: a full 300,000-iteration run.
        raise UserError(f"{source}: names no task; a recipe needs at least [task] name = ... "
                        f"(`perencode recipe-schema` lists every field and its default)")
    return recipe


def field_names() -> list[str]:
    """Every recipe field as a dotted key, the options of every registered kind among them."""
    out = []
    for section in SECTIONS:
        model = Recipe.model_fields[section].annotation
        own = model.options() if issubclass(model, KindConfig) else {}
        out += [f"{section}.{name}" for name in [*model.model_fields, *own]]
    return out


def _type_text(ann: Any) -> str:
    """A field type as a recipe writer reads it: `int | 'all' | unset`, `[float, float]`."""
    origin, args = get_origin(ann), get_args(ann)
    if ann is type(None):
        return "unset"
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, UnionType):
        return " | ".join(_type_text(a) for a in args)
    if origin in (tuple, list):
        inner = ", ".join(_type_text(a) for a in args if a is not Ellipsis)
        return f"[{inner}{', ...' if origin is list or Ellipsis in args else ''}]"
    return getattr(ann, "__name__", None) or str(ann).replace("typing.", "")


def _type_name(field) -> str:
    return _type_text(field.annotation)


def _default_text(value: Any) -> str:
    """A default as it is written in a recipe (TOML has no None: unset)."""
    if value is None:
        return "unset"
    return repr(list(value)) if isinstance(value, tuple) else repr(value)


def schema_rows() -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every recipe field, for docs and the CLI: a
    kind section's own fields, then each option a registered kind adds, named with the
    kinds that have it."""
    rows = []
    for section in SECTIONS:
        model = Recipe.model_fields[section].annotation
        for name, field in model.model_fields.items():
            type_name, description = _type_name(field), field.description or ""
            names = field.json_schema_extra
            if isinstance(names, KindNames):  # whatever registered them
                type_name = " | ".join(repr(n) for n in kinds.names(names.kind))
                description = names.describe(description)
            rows.append((f"{section}.{name}", type_name, _default_text(field.default),
                         description))
        if issubclass(model, KindConfig):
            for name, owners in model.options().items():
                field = model.class_for(owners[0]).model_fields[name]
                where = f"{kinds.FIELDS[model.KIND]} = {', '.join(owners)} only"
                rows.append((f"{section}.{name}", _type_name(field), _default_text(field.default),
                             f"({where}) {field.description or ''}".rstrip()))
    return rows


def json_schema() -> dict[str, Any]:
    """The recipe's JSON Schema: each kind section a `oneOf` discriminated by its tag, one
    member per registered kind, with that kind's own fields."""
    sections = {}
    for section in ("task", "model", "encoding"):
        base = Recipe.model_fields[section].annotation
        members, tag = [], base.model_fields[base.TAG]
        for name, kind in kinds.registry(base.KIND).items():
            members.append(create_model(
                f"{name.title().replace('_', '')}{base.__name__}", __base__=kind.config or base,
                **{base.TAG: (Literal[name], Field(name, description=tag.description))}))
        union = Union[tuple(members)] if len(members) > 1 else members[0]  # noqa: UP007
        sections[section] = (Annotated[union, Field(discriminator=base.TAG)],
                             Field(default_factory=base.default))
    tagged = create_model("Recipe", __base__=Section, description=(str, Recipe.model_fields[
        "description"]), **sections, optim=(OptimConfig, Field(default_factory=OptimConfig)),
        train=(TrainConfig, Field(default_factory=TrainConfig)))
    return tagged.model_json_schema()
