"""Recipes: the only configuration of a run, Pydantic-validated and loaded from TOML.

The sections are here; the open tagged union of the kind sections is perencode.config.sections, the
one-line errors perencode.config.validation, the schema (`perencode recipe-schema`)
perencode.config.schema.

Defaults are what the authors' code did (docs/paper-facts.md#training-settings); the paper-text
values are one option away (e.g. `optim.betas = [0.9, 0.999]`, `optim.schedule = "cosine"`).
"""

from __future__ import annotations

import difflib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, SerializeAsAny, ValidationInfo, field_validator, model_validator

from perencode.common.errors import UserError
from perencode.config import registry
from perencode.config.sections import KindConfig, KindNames, Section
from perencode.config.validation import validate_table

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

import tomli_w


class TaskConfig(KindConfig):
    """[task]: what every task has. A task's own options are in its config class: held-out
    counts (perencode.kinds.tasks.base.HeldOutConfig), `min_length`, `rarity`, `data`..."""

    KIND: ClassVar[str] = "task"
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
    S4D's `d_state`, perencode.kinds.models.s4d)."""

    KIND: ClassVar[str] = "model"

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

    @model_validator(mode="after")
    def _even(self) -> ModelConfig:
        if self.embed_size % 2:
            raise ValueError(f"field 'embed_size': must be even (sines and cosines), got "
                             f"{self.embed_size}")
        return self


class EncodingConfig(KindConfig):
    """[encoding]: the positional encoding and how it joins the embedding."""

    KIND: ClassVar[str] = "encoding"

    kind: str = Field(
        "sinusoidal", description="Positional encoding (docs/paper-facts.md#positional-encodings)",
        json_schema_extra=KindNames("encoding"),
    )
    mode: Literal["concat", "add"] = Field(
        "concat", description="Combine the encoding with the embedding by concat or add."
    )

    @model_validator(mode="after")
    def _mode(self) -> EncodingConfig:
        kind = registry.registry("encoding").get(self.kind)
        modes = kind.modes if kind is not None else (self.mode,)
        if self.mode not in modes:
            raise ValueError(f"field 'mode': encoding.kind = '{self.kind}' needs mode = "
                             f"{' or '.join(repr(m) for m in modes)}")
        return self


# The largest float32: torch's optimizers turn their coefficients into float32 numbers.
FLOAT32_MAX = 3.4028234663852886e38
# Seeds are 32-bit, so that the offset streams (checkpoints.TRAINING_SEED_OFFSET, ...) of every
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
    # At most a billion: 3,000 times the paper's longest training; a larger number is a typo
    # (1e18 would overflow the step counters and promise an ETA of geological length).
    iterations: int = Field(300_000, ge=1, le=1_000_000_000,
                            description="Optimizer steps (batches).")
    batch_size: int = Field(512, ge=1, description="Fresh random sequences per iteration.")
    checkpoint_every: int = Field(
        5000, ge=1, description="Save checkpoints/step-<k>.pt every this many iterations."
    )
    seed: int = Field(111, ge=0, le=MAX_SEED, description="Seed of initialisation, held-out "
                      "set and batches (0 to 4294967295).")
    log_every: int = Field(100, ge=1, description="Write a metrics.jsonl row every N steps.")
    eval_batch_size: int = Field(1024, ge=1, description="Batch size when scoring held-out.")
    eval_every: int | None = Field(
        None, ge=1, description="Also score the held-out set every N iterations (a multiple "
        "of log_every): held_out_* columns in metrics.jsonl, held_out/ curves in TensorBoard. "
        "Training is the same with or without it (scoring the fixed held-out set draws no "
        "random number). Unset: only at the end. Not part of the run's identity.")
    precision: Literal["authors", "tf32"] = Field(
        "authors", description="Numerics on an Ampere or newer GPU: \"authors\" (torch's "
        "defaults, as the paper's runs: cuDNN's recurrent kernels in TF32, matmuls and the "
        "heads in fp32) or \"tf32\" (the matmuls and heads in TF32 too: faster, about 3 "
        "decimal digits per product; `perencode plan` shows what it saves). No effect on a "
        "CPU. Part of the run's identity when not \"authors\".")
    keep_checkpoints: int | Literal["all"] | None = Field(
        None, description="Periodic checkpoints kept on disk: \"all\" or the newest N >= 1 "
        "(older ones are deleted once a newer one is written). Unset: all for dual_frequency "
        "(the gradient-stability analysis of Fig. 4-5 reads every one), 1 otherwise (an "
        "LSTM at K = 16,384 takes about 240 MB a checkpoint). Not part of the run's identity.")
    deterministic: bool = Field(
        True, description="cuDNN's deterministic mode (torch.backends.cudnn.deterministic) for "
        "training, as the authors' training template sets it; no effect on the CPU. Not part "
        "of the run's identity (it picks kernels, not what they compute).")

    @field_validator("keep_checkpoints")
    @classmethod
    def _at_least_one(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 1:
            raise ValueError("\"all\" or an integer >= 1")
        return value

    @model_validator(mode="after")
    def _scored_on_log_steps(self) -> TrainConfig:
        # The held-out scores ride on the metrics.jsonl row of their step.
        if self.eval_every is not None and self.eval_every % self.log_every:
            raise ValueError(f"field 'eval_every': {self.eval_every} is not a multiple of "
                             f"log_every ({self.log_every}); the held-out scores are written "
                             "on the log steps")
        return self


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
        base = kind_base(str(info.field_name))
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
        keep: int | str | None = self.train.keep_checkpoints
        if keep is None:
            keep = self.task.KEEP_CHECKPOINTS
        return keep if isinstance(keep, int) else None  # "all", the one word allowed


# Training fields that change nothing a run computes: its checkpoint retention and its
# periodic held-out scores (training is bit-identical with or without them), and which of
# cuDNN's kernels compute it (train.deterministic): outside its identity.
NOT_IDENTITY = ("keep_checkpoints", "eval_every", "deterministic")
AUTHORS_PRECISION = "authors"  # train.precision's default: torch's TF32 defaults
# Fields that change nothing a figure or a claim compares, never a reason to split a figure:
# those outside the identity, the seed (runs of several seeds repeat one setting), how often
# a run logs and checkpoints, and the batches it scores held-out in. All but NOT_IDENTITY's
# are still part of a run's identity: another seed, for one, is another run.
BOOKKEEPING = ("train.seed", "train.log_every", "train.checkpoint_every",
               "train.eval_batch_size", *(f"train.{name}" for name in NOT_IDENTITY))


def identity(data: dict[str, Any]) -> dict[str, Any]:
    """What makes two runs the same run: the resolved recipe dict without its free-text
    description and its NOT_IDENTITY training fields, so editing those never turns a
    finished run into "a different recipe". The one definition used by run directories,
    checkpoints, sweeps and results."""
    out = {k: v for k, v in data.items() if k != "description"}
    # The authors' precision is left out, so that runs recorded before train.precision
    # existed keep their identity; any other precision makes another run.
    train = out.get("train", {})
    if set(NOT_IDENTITY) & set(train) or train.get("precision") == AUTHORS_PRECISION:
        out["train"] = {k: v for k, v in train.items() if k not in NOT_IDENTITY
                        and not (k == "precision" and v == AUTHORS_PRECISION)}
    return out


def differences(a: dict, b: dict, prefix: str = "",
                 names: tuple[str, str] = ("there", "now")) -> list[str]:
    """The fields in which two recipe dicts differ: "task.vocab_size: 8 there vs 16 now"."""
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += differences(va, vb, f"{prefix}{key}.", names)
        elif va != vb:
            out.append(f"{prefix}{key}: {va!r} {names[0]} vs {vb!r} {names[1]}")
    return out


def run_key(recipe: Recipe) -> str:
    """`identity` as a hashable string (sweeps and results index runs by it)."""
    return json.dumps(recipe.identity(), sort_keys=True)


SECTIONS = ("task", "model", "encoding", "optim", "train")
KIND_SECTIONS = ("task", "model", "encoding")  # each a KindConfig: an open tagged union


def section_class(section: str) -> type[Section]:
    """The class of a recipe section, as `Recipe` declares it."""
    cls = Recipe.model_fields[section].annotation
    assert isinstance(cls, type) and issubclass(cls, Section), section
    return cls


def kind_base(section: str) -> type[KindConfig]:
    """The base class of a kind section (`task`, `model`, `encoding`): its tagged union."""
    cls = section_class(section)
    assert issubclass(cls, KindConfig), section
    return cls


def foreign_options(data: dict[str, Any]) -> list[str]:
    """The dotted keys of recipe dict `data` that are options of another kind than the one
    its section names (e.g. `task.rarity` in a reverse task's table)."""
    out = []
    for section in KIND_SECTIONS:
        table, base = data.get(section), kind_base(section)
        if isinstance(table, dict):
            out += [f"{section}.{key}" for key in base.foreign_in(table)]
    return out


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
            close = difflib.get_close_matches(parts[0], SECTIONS, n=1)
            raise UserError(f"{source} '{item}': key must be section.key with section one of "
                            f"{', '.join(SECTIONS)}"
                            + (f"; did you mean '{close[0]}.{'.'.join(parts[1:])}'?"
                               if close and len(parts) == 2 else ""))
        section = out.setdefault(parts[0], {})
        if not isinstance(section, dict):
            raise UserError(f"{source} '{item}': [{parts[0]}] is not a table")
        section[parts[1]] = parse_value(value.strip())
    return out


def validate(data: dict[str, Any], source: str, any_kind: bool = False) -> Recipe:
    """A recipe; `any_kind` accepts kinds no registration knows (reading results). One a run
    stored is migrated first (`migrate_stored`)."""
    return validate_table(Recipe, data, source, context={"any_kind": any_kind})


def migrate_stored(data: dict[str, Any]) -> dict[str, Any]:
    """A recipe dict as a run stored it (its recipe.toml, a checkpoint's), in this version's
    keys. Before each kind had its own config class, every kind section carried every
    kind's options (a reverse GRU's `rarity`, `d_state`): such a file still reads as the
    same run, without them. In a recipe a user writes they are refused
    (KindConfig.dispatch)."""
    out = dict(data)
    for section in KIND_SECTIONS:
        table, base = out.get(section), kind_base(section)
        if isinstance(table, dict):
            foreign = base.foreign_in(table)
            out[section] = {k: v for k, v in table.items() if k not in foreign}
    return out


def read_toml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a folder; give a recipe file (e.g. "
                        f"recipes/gru_vocab256.toml)")
    if not path.is_file():
        raise UserError(f"{path}: recipe file not found")
    try:
        # utf-8-sig: an editor's byte-order mark (Windows Notepad) is not TOML's to see.
        return tomllib.loads(path.read_text(encoding="utf-8-sig"))
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        line = exc.object[:exc.start].count(b"\n") + 1
        raise UserError(f"{path}: not a UTF-8 text file (byte {exc.object[exc.start]:#04x} "
                        f"on line {line}); save it as UTF-8") from None


# Top-level keys of a grid file (perencode.config.grid), never of a recipe.
GRID_KEYS = ("base", "grid", "sweep", "slurm")


def load_recipe(path: str | Path, overrides: list[str] | None = None,
                check: Callable[[dict], None] | None = None) -> Recipe:
    """Read a TOML recipe, apply `--set` overrides, validate; UserError on any mistake.
    `check`: called with the table as read (overrides applied) before validation; nothing
    beside the file is read here (a run's plugins.json is the store's:
    perencode.store.runs.require_plugins)."""
    data = read_toml(path)
    found = [key for key in GRID_KEYS if key in data]
    if found:
        raise UserError(f"{path}: this is a grid (it has {', '.join(found)}), not a recipe: "
                        f"run its cells with `perencode sweep {path}`")
    if overrides:
        data = apply_overrides(data, overrides)
        changed = [item for item in overrides if item.partition("=")[0].strip() != "description"]
        if changed and data.get("description") and isinstance(data["description"], str):
            # The file's text describes the file: say what --set changed after it.
            data["description"] = (f"{data['description'].rstrip()} Changed by --set: "
                                   f"{', '.join(item.strip() for item in changed)}.")
    if check is not None:  # e.g. a run's recipe.toml: the plugin it needs (perencode.store.runs)
        check(data)
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
        model = section_class(section)
        own = model.options() if issubclass(model, KindConfig) else {}
        out += [f"{section}.{name}" for name in [*model.model_fields, *own]]
    return out
