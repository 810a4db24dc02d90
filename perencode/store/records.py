"""The records of a run directory, one Pydantic model each, with a format version.

    eval.json       EvalRecord     the run's identity fields, its held-out scores, iteration
    status.json     StatusRecord   finished, diverged or unfinished, and what says so
    identity.json   IdentityRecord the recipe, code and data that made it (perencode.store.identity)
    metrics.jsonl   MetricsRow     one row per log step: step, loss, accuracy, lr, gradient
                                   norm, seconds, and the periodic held-out scores
    plugins.json    PluginsRecord  the plugins the run's kinds came from, what each provides
                                   and its kinds' labels (perencode.config.plugins.entries)
    sweep.json      SweepRecord    the sweep that made the run: grid, name, tag, cell, axes
    env.json        EnvRecord      the environment report of its first start
                                   (perencode.store.environment), seed, every start, end time

Every writer builds the model and every reader gets it back: a file an earlier perencode
wrote goes through its record's one migration (`migrate_eval`, `migrate_status`,
`migrate_identity`, `migrate_metrics_row`, `migrate_plugins`, `migrate_sweep`,
`migrate_env`), so that a reader only ever sees the current format. What each earlier
version lacked is said beside its version number below.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from perencode.common.errors import UserError
from perencode.config.recipe import Recipe


def now() -> str:
    """The time in UTC, to the second (ISO 8601): a run's records' timestamps."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


# eval.json opens with the run's identity, eval key -> recipe field (results.py reads the
# recipe's own copy and leaves these out of the metrics).
EVAL_IDENTITY = {"task": "task.name", "arch": "model.arch", "encoding": "encoding.kind",
                 "vocab_size": "task.vocab_size", "seed": "train.seed"}
# metrics.jsonl keys of the periodic held-out scores (train.eval_every), drawn as held_out/
HELD_OUT = "held_out_"

# Format versions. 1 is every file written before records carried a version (no "version"
# key); identity.json had one from the start.
EVAL_VERSION = 2      # 1: no version; the earliest runs' eval.json has no iteration either
STATUS_VERSION = 2    # 1: no version; before status.json existed a run had none (`infer_status`)
METRICS_VERSION = 2   # 1: no version and no grad_norm (the step's gradient norm)
IDENTITY_VERSION = 2  # 1: no `modules` (the perencode modules of the run's path)
PLUGINS_VERSION = 2   # 1: no version (and before labels were recorded, no `labels`)
SWEEP_VERSION = 2     # 1: no version
ENV_VERSION = 2       # 1: no version
IDENTITY_FORMAT = "perencode-identity"

FINISHED, DIVERGED, UNFINISHED = "finished", "diverged", "unfinished"  # StatusRecord.state


def _version(data: dict, current: int, path: str | Path, what: str) -> int:
    """A record's format version (1 without the key); UserError for one this perencode
    cannot read (a newer perencode's, or not a number)."""
    version = data.get("version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= current:
        raise UserError(f"{path}: {what} format version {version!r} is not supported (this "
                        f"perencode reads versions 1 to {current})")
    return version


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# --------------------------------------------------------------------------------------
# eval.json
# --------------------------------------------------------------------------------------

def eval_identity(recipe: Recipe) -> dict[str, Any]:
    """The identity fields eval.json opens with (EVAL_IDENTITY)."""
    out = {}
    for key, field in EVAL_IDENTITY.items():
        section, name = field.split(".")
        out[key] = getattr(getattr(recipe, section), name)
    return out


class EvalRecord(BaseModel):
    """eval.json: the identity fields, the task's scores (extra keys, in the task's order:
    numbers, and lists of rows such as by_band), the iteration scored, and the code changes
    `eval --accept-code` accepted."""

    model_config = ConfigDict(extra="allow")

    version: int = EVAL_VERSION
    task: str | None = None
    arch: str | None = None
    encoding: str | None = None
    vocab_size: int | None = None
    seed: int | None = None
    iteration: int | None = None  # None only in the earliest perencode's eval.json
    code_changes_accepted: list[str] | None = None

    @classmethod
    def of(cls, recipe: Recipe, scores: dict[str, Any], iteration: int,
           code_changes_accepted: list[str] | None = None) -> EvalRecord:
        return cls(**{**eval_identity(recipe), **scores}, iteration=iteration,
                   code_changes_accepted=code_changes_accepted or None)

    def identity(self) -> dict[str, Any]:
        """The identity fields the file holds."""
        return {key: getattr(self, key) for key in EVAL_IDENTITY
                if getattr(self, key) is not None}

    def scores(self) -> dict[str, Any]:
        """The task's scores (no identity field, no iteration)."""
        return dict(self.__pydantic_extra__ or {})

    def result(self) -> dict[str, Any]:
        """What `train` and `eval` return and print: the file's object without its version,
        in the file's order."""
        return {**self.identity(), **self.scores(),
                **({"iteration": self.iteration} if self.iteration is not None else {}),
                **({"code_changes_accepted": self.code_changes_accepted}
                   if self.code_changes_accepted else {})}

    def as_dict(self) -> dict[str, Any]:
        """The object written to eval.json."""
        return {**self.result(), "version": self.version}


def migrate_eval(data: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """An eval.json object of any perencode version as the current version: 1 (no version
    key) holds what 2 does; a score that is a string is damage (UserError)."""
    _version(data, EVAL_VERSION, path, "eval.json")
    iteration = data.get("iteration")
    if "iteration" in data and not (isinstance(iteration, int)
                                    and not isinstance(iteration, bool)):
        raise UserError(f"{path}: no whole-number 'iteration' (damaged)")
    for key, value in data.items():
        if key not in EVAL_IDENTITY and isinstance(value, str):
            raise UserError(f"{path}: '{key}' is {value!r}, not a number (damaged)")
    return {**data, "version": EVAL_VERSION}


def read_eval(path: str | Path) -> EvalRecord:
    """eval.json as the current EvalRecord; UserError naming the file when it is missing,
    not JSON, or damaged."""
    data = read_json(path)
    try:
        return EvalRecord.model_validate(migrate_eval(data, path))
    except ValueError as exc:  # pydantic's ValidationError: an identity field of a wrong type
        raise UserError(f"{path}: not an eval.json ({_first_error(exc)}); damaged") from None


# --------------------------------------------------------------------------------------
# status.json
# --------------------------------------------------------------------------------------

class StatusRecord(BaseModel):
    """status.json: the run's state and what goes with it (perencode.store.runs' layout)."""

    version: int = STATUS_VERSION
    state: Literal["finished", "diverged", "unfinished"]
    iteration: int | None = None
    reason: str | None = None             # diverged: what was not finite
    checkpoint: str | None = None         # diverged: the last finite checkpoint kept
    eval_sha256: str | None = None        # finished: the hash of the eval.json it wrote
    inferred: str | None = None           # a run of an earlier perencode: inferred from what
    time: str | None = None
    pruned: dict[str, Any] | None = None  # what `perencode prune` deleted
    missing: str | None = None            # not written: a finished run's eval.json deleted

    def as_dict(self) -> dict[str, Any]:
        """The object written to status.json (`missing` is found, never written)."""
        return self.model_dump(exclude_none=True, exclude={"missing"})


def migrate_status(data: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """A status.json object of any perencode version as the current version (1, no version
    key, holds what 2 does). A run without status.json predates it: `infer_status`."""
    _version(data, STATUS_VERSION, path, "status.json")
    return {**data, "version": STATUS_VERSION}


def read_status(path: str | Path) -> StatusRecord:
    """status.json as the current StatusRecord; UserError when it is not one."""
    data = read_json(path)
    try:
        return StatusRecord.model_validate(migrate_status(data, path))
    except ValueError:
        raise UserError(f"{path}: not a run status") from None


def infer_status(total: int, rows: list[MetricsRow], eval_iteration: int | None,
                 has_eval: bool, last_checkpoint: int | None, ended: bool) -> StatusRecord:
    """The state of a run written before perencode kept status.json, from its other files
    (`inferred` says which): diverged when metrics.jsonl holds a loss that is not a number;
    finished when eval.json is of the final iteration `total` (one without an iteration:
    when the final iteration's checkpoint is there, the rule of those versions); finished
    without eval.json when env.json's end time (`ended`) and the final metrics row say so;
    else unfinished."""
    for row in rows:
        if not math.isfinite(row.loss):
            return StatusRecord(state=DIVERGED, iteration=row.step,
                                reason=f"loss is {row.loss}", inferred="metrics.jsonl")
    if has_eval:
        if eval_iteration == total or (eval_iteration is None and last_checkpoint == total):
            return StatusRecord(state=FINISHED, iteration=total,
                                inferred="eval.json of the final iteration")
        return StatusRecord(state=UNFINISHED)
    if ended and rows and rows[-1].step == total:
        return StatusRecord(state=FINISHED, iteration=total, missing="eval.json",
                            inferred="env.json's end time and metrics.jsonl's final step")
    return StatusRecord(state=UNFINISHED)


# --------------------------------------------------------------------------------------
# identity.json
# --------------------------------------------------------------------------------------

class IdentityRecord(BaseModel):
    """identity.json (perencode.store.identity says what each part holds)."""

    format: Literal["perencode-identity"] = "perencode-identity"
    version: int = IDENTITY_VERSION
    created: str | None = None
    fingerprint: str
    recipe: dict[str, Any] = {}
    code: dict[str, dict[str, Any] | None] = {}
    modules: dict[str, str] | None = None  # None: a run made before they were recorded
    data: dict[str, Any] | None = None     # a task that reads prepared data only
    accepted: list[dict[str, Any]] = []    # changes of code or data a command accepted

    def as_dict(self) -> dict[str, Any]:
        out = self.model_dump()
        if out["data"] is None:
            del out["data"]
        return out


def migrate_identity(data: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """An identity.json object of any perencode version as the current version: 1 has no
    `modules` (only its kinds' modules are compared: perencode.store.identity.code_changes)."""
    if data.get("format") != IDENTITY_FORMAT:
        raise UserError(f"{path}: not a perencode run identity")
    _version(data, IDENTITY_VERSION, path, "identity.json")
    return {"modules": None, **data, "version": IDENTITY_VERSION}


def read_identity(path: str | Path) -> IdentityRecord:
    """identity.json as the current IdentityRecord; UserError when it is not one."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not readable JSON ({exc}); the run's identity is lost: "
                        "restore the file from a copy of the run") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a perencode run identity")
    try:
        return IdentityRecord.model_validate(migrate_identity(data, path))
    except ValueError as exc:
        raise UserError(f"{path}: not a perencode run identity ({_first_error(exc)})") \
            from None


# --------------------------------------------------------------------------------------
# metrics.jsonl
# --------------------------------------------------------------------------------------

class MetricsRow(BaseModel):
    """One metrics.jsonl row: the log step, its training loss and accuracy, the learning
    rate, the gradient norm before clipping (None without clipping), the seconds since the
    (re)start, and on train.eval_every steps the held-out scores (extra keys HELD_OUT...)."""

    model_config = ConfigDict(extra="allow")

    step: int
    loss: float
    accuracy: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    seconds: float
    version: int = METRICS_VERSION

    def held_out(self) -> dict[str, Any]:
        """The held-out scores of the row, by their metrics.jsonl keys."""
        return {k: v for k, v in (self.__pydantic_extra__ or {}).items()
                if k.startswith(HELD_OUT)}

    def as_dict(self) -> dict[str, Any]:
        """The row as written: None fields left out, the version last."""
        fields = self.model_dump(exclude_none=True, exclude={"version"})
        return {**fields, "version": self.version}

    def line(self) -> str:
        return json.dumps(self.as_dict())


def migrate_metrics_row(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics.jsonl row of any perencode version as the current version: 1 (no version
    key) has no grad_norm."""
    return {**row, "version": METRICS_VERSION}


def metrics_row(line: bytes | str) -> MetricsRow | str:
    """A metrics.jsonl line's row, or what is wrong with it."""
    try:
        row = json.loads(line.decode("utf-8") if isinstance(line, bytes) else line)
    except UnicodeDecodeError:
        return "not UTF-8 text"
    except ValueError:
        return "not JSON"
    if not isinstance(row, dict):
        return "not a row"
    for key in ("step", "loss", "seconds"):
        if not _number(row.get(key)):
            return f"no number '{key}'" if key in row else f"no '{key}'"
    if not isinstance(row["step"], int):
        return "a step that is not a whole number"
    version = row.get("version", 1)
    if not isinstance(version, int) or not 1 <= version <= METRICS_VERSION:
        return f"format version {version!r} (this perencode reads 1 to {METRICS_VERSION})"
    try:
        return MetricsRow.model_validate(migrate_metrics_row(row))
    except ValueError as exc:
        return f"not a metrics row ({_first_error(exc)})"


# --------------------------------------------------------------------------------------
# Plain JSON
# --------------------------------------------------------------------------------------

# --------------------------------------------------------------------------------------
# plugins.json
# --------------------------------------------------------------------------------------

class PluginEntry(BaseModel):
    """One plugin of a run: where it came from (perencode.config.plugins.Plugin's fields),
    the recipe fields it provides ("encoding.kind = 'lin_ramp'") and its kinds' labels
    ({"encoding": {"lin_ramp": "Linear ramp"}})."""

    module: str
    file: str | None = None
    package: str | None = None
    version: str | None = None  # the installed package's version, not the record's
    entry_point: str | None = None
    provides: list[str] = []
    labels: dict[str, dict[str, str]] = {}

    def origin(self) -> dict[str, Any]:
        """The fields of perencode.config.plugins.Plugin."""
        return self.model_dump(exclude={"provides", "labels"})


class PluginsRecord(BaseModel):
    """plugins.json: the plugins a run's kinds came from (a run of the package's own kinds
    has no file)."""

    version: int = PLUGINS_VERSION
    plugins: list[PluginEntry]

    def as_dict(self) -> dict[str, Any]:
        return {"plugins": [entry.model_dump() for entry in self.plugins],
                "version": self.version}


def migrate_plugins(data: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """A plugins.json object of any perencode version as the current version: 1 (no version
    key) holds what 2 does, less `labels` in the earliest (read as none)."""
    _version(data, PLUGINS_VERSION, path, "plugins.json")
    return {**data, "version": PLUGINS_VERSION}


def read_plugins(path: str | Path) -> PluginsRecord:
    """plugins.json as the current PluginsRecord; UserError `PATH: damaged (why)` when it is
    not UTF-8, not JSON, not an object or not a plugins.json, or of a version this perencode
    cannot read."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: damaged (not UTF-8 text)") from None
    except json.JSONDecodeError:
        raise UserError(f"{path}: damaged (not JSON)") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: damaged (not a JSON object)")
    try:
        return PluginsRecord.model_validate(migrate_plugins(data, path))
    except ValueError as exc:
        raise UserError(f"{path}: damaged (not a plugins.json: {_first_error(exc)})") from None


# --------------------------------------------------------------------------------------
# sweep.json
# --------------------------------------------------------------------------------------

class SweepRecord(BaseModel):
    """sweep.json: the sweep that made a run (perencode.config.grid.Cell.record): its grid
    file, its runs' folder name (the grid's stem, @tag with a tag), the tag, the cell's
    folder below it and the cell's axis values as written."""

    version: int = SWEEP_VERSION
    grid: str
    name: str
    tag: str | None = None
    cell: str
    axes: dict[str, str] = {}

    def as_dict(self) -> dict[str, Any]:
        return {**self.model_dump(exclude={"version"}), "version": self.version}


def migrate_sweep(data: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """A sweep.json object of any perencode version as the current version (1, no version
    key, holds what 2 does)."""
    _version(data, SWEEP_VERSION, path, "sweep.json")
    return {**data, "version": SWEEP_VERSION}


def read_sweep(path: str | Path) -> SweepRecord:
    """sweep.json as the current SweepRecord; UserError naming the file when it is not one."""
    data = read_json(path)
    try:
        return SweepRecord.model_validate(migrate_sweep(data, path))
    except ValueError as exc:
        raise UserError(f"{path}: not a sweep.json ({_first_error(exc)}); damaged") from None


# --------------------------------------------------------------------------------------
# env.json
# --------------------------------------------------------------------------------------

class StartEntry(BaseModel):
    """One start (or restart) of a run's training: when, on what device, at which commit."""

    model_config = ConfigDict(extra="allow")

    time: str
    device: str | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None


class EnvRecord(BaseModel):
    """env.json: the environment report of the run's first start (its fields as
    perencode.store.environment.report writes them, kept as extra fields: they follow the
    report), the seed, every start, and the end time once eval.json is written."""

    model_config = ConfigDict(extra="allow")

    version: int = ENV_VERSION
    seed: int | None = None
    start_time: str | None = None
    starts: list[StartEntry] = []
    end_time: str | None = None  # absent until the run finished

    def get(self, key: str, default: Any = None) -> Any:
        """A field of the report by name ("device", "device_name", ...), or `default`."""
        return self.as_dict().get(key, default)

    def as_dict(self) -> dict[str, Any]:
        """The object written to env.json (the record's own fields left out while unset)."""
        own = {key: value for key, value in (("seed", self.seed),
                                             ("start_time", self.start_time),
                                             ("end_time", self.end_time)) if value is not None}
        starts = {"starts": [s.model_dump() for s in self.starts]} if self.starts else {}
        return {**(self.__pydantic_extra__ or {}), **own, **starts, "version": self.version}


def migrate_env(data: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """An env.json object of any perencode version as the current version (1, no version
    key, holds what 2 does)."""
    _version(data, ENV_VERSION, path, "env.json")
    return {**data, "version": ENV_VERSION}


def read_env(path: str | Path) -> EnvRecord:
    """env.json as the current EnvRecord; UserError naming the file when it is missing, not
    JSON or not an env.json."""
    data = read_json(path)
    try:
        return EnvRecord.model_validate(migrate_env(data, path))
    except ValueError as exc:
        raise UserError(f"{path}: not an env.json ({_first_error(exc)}); damaged") from None


def read_json(path: str | Path) -> dict[str, Any]:
    """A JSON object from a file; UserError naming the file when it is missing, not UTF-8,
    not JSON, or JSON of another shape (a list, a string, null)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
                        f"offset {exc.start}); damaged") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a JSON object (holds {_shape(data)}); damaged or "
                        "not written by perencode")
    return data


def _shape(value: Any) -> str:
    if value is None:
        return "null"
    return {list: "a list", str: "a string", bool: "a boolean"}.get(type(value), "a number")


def _first_error(exc: ValueError) -> str:
    """The first complaint of a pydantic ValidationError: the field and what is wrong."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "the record"
        return f"{where}: {first.get('msg', '')}"
    return str(exc).splitlines()[0]
