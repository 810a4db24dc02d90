"""Recipes: the only configuration of a run, Pydantic-validated and loaded from TOML.

Defaults are what the authors' code did (docs/paper-facts.md#training-settings); the paper-text
values are one option away (e.g. `optim.betas = [0.9, 0.999]`, `optim.schedule = "cosine"`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from rapidfuzz import process

from perencode import kinds
from perencode.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

import tomli_w


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

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
        raise ValueError(f"Input should be {kinds.choices(kind)}")
    return name


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


def options_of_others(kind: str, chosen: str, section: BaseModel) -> None:
    """An option of another kind that is set here (not None) is a mistake worth a line."""
    for other in kinds.registry(kind).values():
        for option in other.options:
            if other.name != chosen and getattr(section, option, None) is not None and \
                    type(section).model_fields[option].default is None and \
                    option not in kinds.get(kind, chosen).options:
                owners = [k.name for k in kinds.registry(kind).values() if option in k.options]
                raise ValueError(f"field '{option}': not an option of {kinds.FIELDS[kind]} = "
                                 f"'{chosen}' (only of {', '.join(map(repr, owners))})")


class TaskConfig(Section):
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
    min_length: int | None = Field(
        None, ge=1,
        description="variable_length only: the shortest input length (lengths uniform in "
        "min_length..length, docs/paper-facts.md#variable-length-task).",
    )
    held_out: int = Field(
        1024, ge=1,
        description="Distinct held-out test sequences drawn before training and never "
        "trained on (per length for variable_length; dual_frequency uses held_out_per_cell).",
    )
    rarity: float = Field(
        0.125, gt=0.0, lt=1.0,
        description="dual_frequency only: probability that a training token is RARE "
        "(FREQUENT = first K/2 ids, RARE = the rest; "
        "docs/paper-facts.md#dual-frequency-task).",
    )
    held_out_per_cell: int = Field(
        16, ge=1,
        description="dual_frequency only: test sequences per (target type, disturbant type, "
        "target position) cell: 16 gives the caption's 4,096; 4 gives the authors' 1,024.",
    )
    data: str | None = Field(
        None, description="Prepared data folder for `lm` (made by `perencode lm-prepare`)."
    )

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str, info: ValidationInfo) -> str:
        return registered("task", name, info)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        """The variants of reverse were flags before they were tasks: say the new name."""
        if isinstance(data, dict):
            if "dual_frequency" in data:
                raise ValueError("field 'dual_frequency': the flag is gone; the task is named "
                                 "now: task.name = \"dual_frequency\"")
            if data.get("name", "reverse") == "reverse" and data.get("min_length") is not None:
                raise ValueError("field 'min_length': variable length is a task of its own "
                                 "now: task.name = \"variable_length\"")
        return data

    @model_validator(mode="after")
    def _consistent(self) -> TaskConfig:
        """The task's own rules (its registration), then: held-out rows must leave some to
        train on."""
        kind = kinds.registry("task").get(self.name)
        if kind is None:  # read as a result only (`registered`): its rules are unknown
            return self
        options_of_others("task", self.name, self)
        if kind.check is not None:
            kind.check(self)
        if kind.distinct is not None:
            distinct = kind.distinct(self)
            if self.held_out >= distinct:
                raise ValueError(
                    f"field 'held_out': {self.held_out} held-out sequences leave nothing to "
                    f"train on: only {distinct} distinct sequences exist (must be < {distinct})"
                )
        return self

    def distinct_sequences(self) -> int | None:
        """How many distinct held-out rows the task can draw (its registration says; None
        where the task has no held-out count)."""
        kind = kinds.get("task", self.name)
        return kind.distinct(self) if kind.distinct is not None else None


class ModelConfig(Section):
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
    d_state: int = Field(
        64, ge=2, le=4096,
        description="S4D state size N (N/2 complex conjugate-pair modes per channel).",
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
        kind = kinds.registry("model").get(self.arch)
        if kind is not None and kind.check is not None:
            kind.check(self)
        return self


class EncodingConfig(Section):
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


class OptimConfig(Section):
    lr: float = Field(1e-3, gt=0.0, le=10.0, description="Peak learning rate of Adam.")
    betas: tuple[float, float] = Field(
        (0.9, 0.98),
        description="Adam betas. Code: [0.9, 0.98]; paper text: [0.9, 0.999].",
    )
    eps: float = Field(1e-9, gt=0.0, le=1.0, description="Adam epsilon (code: 1e-9).")
    weight_decay: float = Field(0.0, ge=0.0, description="Adam weight decay.")
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
    seed: int = Field(111, ge=0, description="Seed of initialisation, held-out set and batches.")
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
            raise ValueError(f"field 'keep_checkpoints': \"all\" or an integer >= 1, got "
                             f"{value!r}")
        return value


class Recipe(Section):
    description: str = Field("", description="What this recipe reproduces (free text).")
    task: TaskConfig = Field(default_factory=TaskConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    encoding: EncodingConfig = Field(default_factory=EncodingConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    def identity(self) -> dict[str, Any]:
        """What makes two runs the same run (see `identity`)."""
        return identity(self.to_dict())

    def checkpoints_kept(self) -> int | None:
        """How many periodic checkpoints a run keeps; None: all (train.keep_checkpoints)."""
        keep = self.train.keep_checkpoints
        if keep is None:
            keep = "all" if self.task.name == "dual_frequency" else 1
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


def _model_at(model: type[BaseModel], path: list[str]) -> type[BaseModel] | None:
    """The Pydantic model of the table at `path` inside `model` (None if not a table)."""
    for part in path:
        field = model.model_fields.get(part)
        model = field.annotation if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
    return model


def format_validation_error(exc: ValidationError, source: str,
                            model: type[BaseModel] | None = None, table: str = "",
                            top: str = "the top level") -> str:
    """One line for any of our Pydantic models (recipes, grid tables, claims): the file,
    the field and what is allowed, with "did you mean" for an unknown key.

    `model` is the validated class (default Recipe); `table` names it inside its file
    (e.g. "slurm" for a grid's [slurm] table) when it is not the whole file; `top` is how
    an unknown key's place is named when it is not in a table (e.g. "the claim").
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
        owner = _model_at(model, loc[:-1])
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
        raise UserError(format_validation_error(exc, source, model, table, top)) from None


def validate(data: dict[str, Any], source: str, any_kind: bool = False) -> Recipe:
    """A recipe; `any_kind` accepts kinds no registration knows (reading results)."""
    return validate_table(Recipe, data, source, context={"any_kind": any_kind})


def read_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: recipe file not found")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file") from None


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read a TOML recipe, apply `--set` overrides, validate; UserError on any mistake."""
    data = read_toml(path)
    if overrides:
        data = apply_overrides(data, overrides)
    source = f"{path}" + (" (with --set)" if overrides else "")
    return validate(data, source)


def schema_rows() -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every recipe field, for docs and the CLI."""
    rows = []
    for section in SECTIONS:
        model = Recipe.model_fields[section].annotation
        for name, field in model.model_fields.items():
            ann = field.annotation
            type_name = getattr(ann, "__name__", None) or str(ann).replace("typing.", "")
            if "Literal" in str(ann):
                type_name = " | ".join(repr(a) for a in ann.__args__)
            description = field.description or ""
            names = field.json_schema_extra
            if isinstance(names, KindNames):  # whatever registered them
                type_name = " | ".join(repr(n) for n in kinds.names(names.kind))
                description = names.describe(description)
            rows.append((f"{section}.{name}", type_name, repr(field.default), description))
    return rows
