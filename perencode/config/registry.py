"""One registry per kind of thing a recipe names: tasks (`task.name`), models (`model.arch`)
and positional encodings (`encoding.kind`).

Each kind is registered once, beside its code (a `register_*` call at the end of its
module), and everything that lists kinds reads these registries: the recipe's allowed values,
rules and schema, the figures' labels and orders, the stability analysis's hooks, bench's
guard. A study that adds a kind registers it from its own module and touches no other file;
code that meets a name no registry holds (runs made by an extension that is not imported)
shows the raw name instead of dropping the run.

The package's own kinds register when their modules are imported. The registries import
those modules on first use (by name, as plug-in entry points are loaded), so that
`perencode.config.recipe`, which the kinds' modules import, can validate a recipe without
importing them back.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from perencode.common.errors import UserError

# The modules whose import registers the package's own kinds.
BUILTIN_MODULES = ("perencode.kinds.tasks", "perencode.kinds.models", "perencode.kinds.encoding")


@dataclass(frozen=True)
class TaskKind:
    """A task: `make(task_cfg, seed, device)` builds it (its held-out set drawn from seed)."""

    name: str
    make: Callable[..., Any]
    label: str                      # figures and reports
    summary: str = ""               # one phrase for `perencode recipe-schema`
    # The [task] table's class: a subclass of perencode.config.recipe.TaskConfig holding the task's
    # own options and rules (None: the base, which has no held-out count).
    config: type | None = None
    # What the task feeds a model, from its config alone (perencode.kinds.shapes.Shapes):
    # (task_cfg) -> Shapes; None: the task is built once on the CPU and measured.
    shapes: Callable[[Any], Any] | None = None
    # Its own results (perencode.analysis.results): (row, metrics, tables) -> None adds to a run's
    # row of results.csv (a dict), reading its metrics.jsonl rows, and changes the run's
    # tables (name -> pandas DataFrame: eval.json's lists, stability) or adds one (a list of
    # row dicts will do); None: nothing.
    results: Callable[[dict, list, dict], None] | None = None
    # The prepared data a run reads (perencode.store.identity): (task_cfg) -> {"field": its
    # [task] key, "path": the absolute folder, "manifest_sha256": that of its manifest, or
    # None where it has none, and optionally "content_sha256": that of what training reads,
    # compared instead of the manifest's}; None: the task generates its data.
    data: Callable[[Any], dict] | None = None
    # `perencode stability` analyses its runs: pairs of sequences that differ in one rare or
    # frequent token (the dual-frequency bands, docs/paper-facts.md#gradient-stability);
    # `prune` keeps a run's checkpoints until the analysis has read them.
    stability: bool = False
    # `bench --baseline`'s bare reference loop has its shapes: L random input tokens, then L
    # command tokens, and L outputs over the K input tokens (the reverse task's layout).
    baseline: bool = False


# The TF32 switches of torch (`ModelKind.tf32`): cuDNN's (its RNN kernels) and cuBLAS's (the
# products of linear layers and matmuls).
TF32_SWITCHES = ("cudnn", "matmul")


@dataclass(frozen=True)
class ModelKind:
    """A sequence model: `build(model_cfg, encoding_cfg, sizes)` -> nn.Module (models/)."""

    name: str
    build: Callable[..., Any]
    label: str
    summary: str = ""
    # The [model] table's class: a subclass of perencode.config.recipe.ModelConfig with the model's
    # own options and rules (None: the base).
    config: type | None = None
    # Multiply-adds per sample and time step of the sequence layer: (model_cfg, inputs D,
    # steps T) -> float, for sweep cost estimates; None: one per parameter of the model
    # outside its embedding, encoding and head (a recurrent cell's count).
    flops_per_step: Callable[[Any, int, int], float] | None = None
    # Gradient-stability hook: (model, tokens [B, T], target_step, chunk_size) ->
    # (J [B, D_out, D_z], output [B, D_out]); None: `perencode stability` refuses the model.
    jacobians: Callable[..., Any] | None = None
    # Steps shared by a stability pair before the target (the S4D's 22-token prefix).
    stability_prefix: int = 0
    # Memory preflight: floats per sample and time step, in units of H, that the model keeps
    # for its backward pass; None: the largest of the registered models' is assumed.
    saved_per_step: int | None = None
    # Which of TF32_SWITCHES its products follow on an Ampere or newer GPU (`perencode
    # doctor` sets its equivalence tolerance by it): "cudnn" (torch.backends.cudnn.allow_tf32,
    # on by default) for a model cuDNN runs, "matmul" (torch.backends.cuda.matmul.allow_tf32,
    # off by default) for one of linear layers.
    tf32: str = "matmul"
    # Its own [model] options that keep it small in `perencode doctor`'s checks, which set
    # the common sizes themselves (the S4D's state size); none: its defaults.
    tiny: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self):
        if self.tf32 not in TF32_SWITCHES:
            raise ValueError(f"model {self.name!r}: tf32 = {self.tf32!r}; expected "
                             f"{' or '.join(map(repr, TF32_SWITCHES))}")


@dataclass(frozen=True)
class EncodingKind:
    """A positional encoding: how the embedding [B, T, E] becomes the cell input."""

    name: str
    label: str
    summary: str = ""
    # The [encoding] table's class: a subclass of perencode.config.recipe.EncodingConfig with the
    # encoding's own options (None: the base).
    config: type | None = None
    # One vector per position: (positions, dim) -> [positions, dim]; a parameter named
    # `cfg` receives the validated [encoding] table (its `config` class); None: no table.
    table: Callable[..., Any] | None = None
    trained: bool = False           # the table is a parameter
    stored: bool = True             # a fixed table is saved in checkpoints (False: recomputed)
    # What an encoding without a table joins to the embedding: (x [B, T, E]) -> [B, T, E]
    # (the duplicate kind's: x itself; `cfg` as a table's); None: the table's rows, or nothing.
    vectors: Callable[..., Any] | None = None
    # An encoding with parameters of its own: (cfg, dim E, positions T) -> an nn.Module
    # called as module(x [B, T, E], offset) -> vectors [T, E] (or [B, T, E]) joined to x as
    # `encoding.mode` says. Its parameters train with the model and are saved in its
    # checkpoints (docs/extending.md, a learned-frequency sinusoid).
    module: Callable[[Any, int, int], Any] | None = None
    # The joins (`encoding.mode`, perencode.kinds.encoding.JOINS) it allows.
    modes: tuple[str, ...] = ("concat", "add")

    @property
    def adds_input(self) -> bool:
        """Whether it changes the cell input at all (False for vanilla)."""
        return self.table is not None or self.vectors is not None or self.module is not None


TASKS: dict[str, TaskKind] = {}
MODELS: dict[str, ModelKind] = {}
ENCODINGS: dict[str, EncodingKind] = {}
REGISTRIES: dict[str, dict[str, Any]] = {"task": TASKS, "model": MODELS, "encoding": ENCODINGS}
# The field of each kind's recipe section that names the kind: the tag of its union
# (perencode.config.sections: each section's TAG is read from here), and the field as recipes spell
# it.
TAGS = {"task": "name", "model": "arch", "encoding": "kind"}
FIELDS = {kind: f"{kind}.{tag}" for kind, tag in TAGS.items()}
_loaded: list[bool] = []
# (registry, name) -> where a kind not of the package came from: a perencode.config.plugins.Plugin
# (LOADING holds the one being imported) or (module, file) of the code that registered it.
ORIGINS: dict[tuple[str, str], Any] = {}
LOADING: list[Any] = []
# (registry, name) -> label: what the runs being read (perencode.analysis.results.collect) recorded
# in their plugins.json for a plugin's kinds, for `label` where the plugin is not loaded.
RECORDED: dict[tuple[str, str], str] = {}
# (registry, name) -> the module whose register_* call registered it (perencode.store.identity
# hashes a package kind's code from it).
MODULES: dict[tuple[str, str], str] = {}
# Loads the installed plugins and those PERENCODE_PLUGINS names on first use, by name as
# the package's own modules are (it imports this module).
PLUGIN_LOADER = "perencode.config.plugins"
# Set (to anything but "" or "0"), installed plugins' entry points are not loaded, as
# pytest's PYTEST_DISABLE_PLUGIN_AUTOLOAD; --plugin and PERENCODE_PLUGINS still load.
AUTOLOAD_OFF = "PERENCODE_DISABLE_PLUGIN_AUTOLOAD"
# Where an unknown name sends the user (perencode.config.plugins).
PLUGIN_HINT = ("a plugin's kinds load with `perencode --plugin FILE_OR_MODULE`, "
               "PERENCODE_PLUGINS or an installed package's perencode.kinds entry point "
               "(docs/extending.md)")


def _register(registry: dict, kind):
    if not kind.name or not kind.name.replace("_", "").isalnum():
        raise ValueError(f"kind name {kind.name!r}: letters, digits and '_' only")
    # Where it came from (a run's plugins.json): the plugin being loaded, else the module
    # that called register_*; nothing for the package's own kinds.
    key = (next(k for k, v in REGISTRIES.items() if v is registry), kind.name)
    caller = sys._getframe(2).f_globals
    module = caller.get("__name__", "")
    if LOADING:
        origin = LOADING[-1]
    elif module == "perencode" or module.startswith("perencode."):
        origin = None
    else:
        origin = (module, caller.get("__file__"))
    if kind.name in registry and _origin_text(key) != _origin_text(key, origin, module):
        # A name stays with its first origin: a run's score never depends on which of two
        # registrations happened to load last.
        raise UserError(f"{FIELDS[key[0]]} = {kind.name!r} is registered by "
                        f"{_origin_text(key)} and again by {_origin_text(key, origin, module)}; "
                        "a kind's name cannot be taken over: give the new one another name")
    registry[kind.name] = kind
    MODULES[key] = module
    if origin is None:
        ORIGINS.pop(key, None)
    else:
        ORIGINS[key] = origin
    return kind


_NOT_GIVEN: Any = object()


def _origin_text(key: tuple[str, str], origin: Any = _NOT_GIVEN, module: str = "") -> str:
    """Who registers a kind: 'perencode (perencode.kinds.encoding)', 'plugin my_pe (/x/my_pe.py)',
    'module notebook (/x/notebook.py)'; that of the registered kind when `origin` is not
    given."""
    if origin is _NOT_GIVEN:
        origin, module = ORIGINS.get(key), MODULES.get(key, "perencode")
    if origin is None:
        return f"perencode ({module})"
    if isinstance(origin, tuple):
        name, file = origin
        return f"module {name}" + (f" ({file})" if file else "")
    return f"plugin {origin.describe()}"


def register_task(kind: TaskKind) -> TaskKind:
    """Add a task: recipes may then name it in `task.name` (a name registered from
    elsewhere is a UserError naming both; the same module may register it again)."""
    return _register(TASKS, kind)


def register_model(kind: ModelKind) -> ModelKind:
    """Add a model: recipes may then name it in `model.arch` (see `register_task`)."""
    return _register(MODELS, kind)


def register_encoding(kind: EncodingKind) -> EncodingKind:
    """Add a positional encoding: recipes may then name it in `encoding.kind` (see
    `register_task`)."""
    return _register(ENCODINGS, kind)


def autoload() -> bool:
    """Whether installed plugins (`perencode.kinds` entry points) load by themselves: yes,
    unless PERENCODE_DISABLE_PLUGIN_AUTOLOAD is set (a test suite, a clean comparison)."""
    return os.environ.get(AUTOLOAD_OFF, "").strip() in ("", "0")


def registry(kind: str) -> dict:
    """The registry of `kind` ("task", "model" or "encoding"), the package's own kinds
    loaded, then the installed plugins' (entry points, unless `autoload()` is off) and
    those PERENCODE_PLUGINS names
    (perencode.config.plugins; a plugin that fails to import is a UserError)."""
    if not _loaded:
        _loaded.append(True)  # before the imports: their own look-ups must not recurse
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
        importlib.import_module(PLUGIN_LOADER).load_installed()
    return REGISTRIES[kind]


def names(kind: str) -> list[str]:
    return list(registry(kind))


def having(kind: str, capability: str) -> list[str]:
    """The registered kinds whose registration sets `capability` (a task's `stability`), in
    registration order."""
    return [name for name, found in registry(kind).items() if getattr(found, capability)]


def is_builtin(kind: str, name: Any) -> bool:
    """Whether `name` is one of the package's own kinds (not a plugin's, not unknown)."""
    return name in registry(kind) and (kind, name) not in ORIGINS


def choices(kind: str) -> str:
    """"'gru', 'lstm' or 's4d'": the registered names, for messages."""
    return " or ".join(", ".join(repr(n) for n in names(kind)).rsplit(", ", 1))


def guess(kind: str, name: Any) -> str:
    """"; did you mean 'sinusoidal'?" for a misspelt name of a registered kind, or ""."""
    close = difflib.get_close_matches(name, names(kind), n=1) if isinstance(name, str) else []
    return f"; did you mean {close[0]!r}?" if close else ""


def get(kind: str, name: str):
    """The registered kind, or a ValueError naming the allowed values."""
    found = registry(kind).get(name)
    if found is None:
        raise ValueError(f"{FIELDS[kind]} = {name!r} is not registered: expected "
                         f"{choices(kind)}{guess(kind, name)}; {PLUGIN_HINT}")
    return found


def of_field(column: str) -> str | None:
    """The kind a recipe field names ("encoding" for "encoding.kind"); None for any other."""
    return next((kind for kind, field in FIELDS.items() if field == column), None)


def label(kind: str, name) -> str:
    """How figures and reports name it: the registered label, else the label the runs being
    drawn recorded for it (RECORDED), else the raw name."""
    found = registry(kind).get(name)
    if found is not None:
        return found.label
    return RECORDED.get((kind, str(name)), str(name))


def order(kind: str, values: Iterable) -> list:
    """The distinct `values` in registration order, unregistered ones after them (sorted by
    name): nothing is dropped."""
    present = set(values)
    known = [n for n in registry(kind) if n in present]
    return known + sorted(present - set(known), key=str)
