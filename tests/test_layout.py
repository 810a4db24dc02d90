"""The package's layout: its folders are its floors, and imports flow down them (no cycle,
no command importing another); modules import each other at the top (a function-local import
only defers an optional heavy dependency, or is a CLI command loading what it runs), `verify`
stays light and the CLI starts without torch. Every rule reads folders, not lists of modules:
a new file is ruled by the folder it lands in (docs/architecture.md).
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys

import pytest
from conftest import ROOT, subprocess_env

PACKAGE = ROOT / "perencode"
# Third-party modules that some commands need and others do not: imported where used.
DEFERRED = {"matplotlib", "seaborn", "sentencepiece", "datasets", "tensorboard",
            "torch.utils.tensorboard",
            # and the standard modules of one platform only: imported on that platform
            "fcntl", "msvcrt"}
# What `perencode --help` (and shell completion) may load: nothing that needs torch (the
# registries' module, for the plugin autoload switch, and the commands' defaults import only
# the standard library).
CLI_START = {"perencode", "perencode.cli", "perencode.common", "perencode.common.console",
             "perencode.common.defaults", "perencode.common.errors", "perencode.config",
             "perencode.config.registry",
             # the sweep's options, declared beside SweepOptions (its packages import nothing)
             "perencode.commands", "perencode.commands.sweep",
             "perencode.commands.sweep.options"}
HEAVY = ("torch", "numpy", "pandas", "matplotlib", "seaborn", "submitit", "sentencepiece",
         "tensorboard")


def parse(name: str, source: str, package: bool = False) -> ast.Module:
    """A module's tree with its relative imports made absolute (`from ..analysis import
    results` in perencode.training.loop reads `from perencode.analysis import results`), so
    that no rule below can be walked around by a leading dot. `package`: the module is a
    package's __init__ (its dots count from itself)."""
    tree = ast.parse(source)
    here = name.split(".") if package else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[:len(here) - (node.level - 1)] if node.level - 1 <= len(here) else []
            node.module = ".".join([*base, *([node.module] if node.module else [])])
            node.level = 0
    return tree


# tree -> its nodes (ast.walk's order), for the trees read more than once: the package's,
# which most rules below walk again, and a test's planted ones. Kept with their tree, so
# that an id is never another tree's; the trees are never changed once parsed.
_NODES: dict[int, tuple[ast.AST, list[ast.AST]]] = {}


def walk(tree: ast.AST) -> list[ast.AST]:
    """ast.walk(tree) as a list, found once per tree."""
    found = _NODES.get(id(tree))
    if found is None:
        found = _NODES[id(tree)] = (tree, list(ast.walk(tree)))
    return found[1]


@functools.cache
def modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = parse(name, path.read_text(encoding="utf-8"), parts[-1] == "__init__")
    return out


def imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module:
        # `from perencode import runs` imports the module perencode.store.runs
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return []


def deferred(target: str) -> bool:
    return any(target == d or target.startswith(d + ".") for d in DEFERRED)


def is_cli_command(module: str, func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A function of perencode/cli.py decorated with `@app.command(...)` (or a sub-app's,
    `@rehearsal_app.command(...)`): it imports the library code it runs inside itself, so
    the CLI starts fast (lazy loading)."""
    return module == "perencode.cli" and any(
        isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
        and d.func.attr == "command" and isinstance(d.func.value, ast.Name)
        and d.func.value.id.endswith("app") for d in func.decorator_list)


def is_app_callback(module: str, func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """The CLI's `@app.callback()`: it loads the plugins its global options name, and only
    then (a command that needs no kind starts without torch)."""
    return module == "perencode.cli" and any(
        isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute)
        and d.func.attr == "callback" for d in func.decorator_list)


def local_imports(trees: dict[str, ast.Module]) -> tuple[list[str], list[str]]:
    """(function-local imports of what is not an optional dependency, the CLI's commands)."""
    offenders, commands = [], []
    for name, tree in trees.items():
        for func in walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if is_cli_command(name, func):
                commands.append(func.name)
                continue
            if is_app_callback(name, func):
                continue
            for node in walk(func):
                for target in imported(node):
                    if not deferred(target):
                        offenders.append(f"{name}.{func.name}: {target}")
    return offenders, commands


@pytest.mark.slow
@pytest.mark.compat
def test_no_function_local_imports_but_optional_dependencies_and_cli_commands():
    offenders, commands = local_imports(modules())
    assert offenders == []
    assert {"train", "sweep", "tensorboard_"} <= set(commands)


@pytest.mark.slow
@pytest.mark.compat
def test_the_cli_starts_without_torch():
    """`perencode --help`, `--version` and each command's help load no heavy package and
    no module that only runs on POSIX (bench's `resource`, lm-prepare's `fcntl`, train's
    SIGUSR2): the CLI starts in a fraction of a second, on any platform."""
    code = ("import sys\n"
            "from perencode.cli import app\n"
            "import typer.main\n"
            "def leaves(cmd, path):\n"
            "    if not hasattr(cmd, 'commands'):\n"
            "        return [path]\n"
            "    return [p for n, c in cmd.commands.items() for p in leaves(c, [*path, n])]\n"
            "names = leaves(typer.main.get_command(app), [])\n"
            "for args in [['--help'], ['--version'], *([*n, '--help'] for n in names)]:\n"
            "    try:\n"
            "        app(args, prog_name='perencode')\n"
            "    except SystemExit:\n"
            "        pass\n"
            "print(len(names), sorted(m for m in sys.modules if m.split('.')[0] in "
            f"{HEAVY!r} or m.startswith('perencode')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=subprocess_env(), check=True).stdout.strip().splitlines()[-1]
    count, loaded = out.split(" ", 1)
    cli = modules()["perencode.cli"]
    assert int(count) == sum(is_cli_command("perencode.cli", f) for f in walk(cli)
                             if isinstance(f, ast.FunctionDef))
    assert sorted(ast.literal_eval(loaded)) == sorted(CLI_START)


@pytest.mark.slow
@pytest.mark.compat
def test_a_slurm_job_loads_no_torch_before_it_starts_its_run():
    """A SLURM job unpickles its TrainJob (perencode.commands.sweep.child) and starts the
    run's `perencode` command, which loads torch itself: the job's own process loads submitit
    and the light modules below, and nothing heavier (a few seconds of CPU a run)."""
    code = ("import pickle, sys\n"
            "from perencode.commands.sweep.child import TrainJob\n"
            "job = pickle.loads(pickle.dumps(TrainJob()))\n"
            f"print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=subprocess_env(), check=True).stdout.strip().splitlines()[-1]
    assert set(ast.literal_eval(out)) == {"submitit"}


def test_lm_prepare_and_its_sentencepiece_trainer_load_no_torch():
    """`lm-prepare` reads text and trains SentencePiece in a spawned child, which imports
    perencode.commands.lm_prepare to find its function: neither loads torch (about 2.5 s of
    CPU each), only numpy for the token files (sentencepiece when the child trains)."""
    code = ("import sys\n"
            "from perencode.commands.lm_prepare import _train_child\n"
            f"print(sorted(m.split('.')[0] for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=subprocess_env(), check=True).stdout.strip().splitlines()[-1]
    assert set(ast.literal_eval(out)) == {"numpy"}

# The floors, bottom up: a module imports only modules of its own floor or of floors below
# it (and the package's __init__, for its version). The modules at the root (the CLI,
# `python -m perencode`, the plugin API) stand on all of them.
FLOORS = ("common", "config", "kinds", "store", "training", "analysis", "commands")
# Folders of the package that hold no modules: data.
DATA = {"claims"}
MAX_ROOT_MODULES = 10


def floor(module: str) -> int:
    """The floor of a module: its index in FLOORS (a floor's own __init__ too); the root's
    modules stand above them all (the package's __init__, which imports nothing, below them
    all)."""
    parts = module.split(".")
    if module == "perencode":
        return -1
    if len(parts) == 2 and parts[1] not in FLOORS:
        return len(FLOORS)
    return FLOORS.index(parts[1])


def package_imports(tree: ast.Module, trees: dict[str, ast.Module] | None = None) -> set[str]:
    """The perencode modules a module imports (`from perencode.x import y` imports the
    module perencode.x.y where there is one, else perencode.x)."""
    trees = modules() if trees is None else trees
    found: set[str] = set()
    for node in walk(tree):
        targets = imported(node)
        found.update(t for t in targets[1:] if t in trees)
        if targets and targets[0] in trees and not any(t in trees for t in targets[1:]):
            found.add(targets[0])
    return found


@pytest.mark.slow
@pytest.mark.compat
def test_the_root_holds_the_floors_and_a_few_modules():
    """`ls perencode/`: the floors, the data, and at most 10 modules; every module lives on
    a floor or at the root."""
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(FLOORS) | DATA
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert {"__init__.py", "__main__.py", "cli.py"} <= set(root)
    assert len(root) <= MAX_ROOT_MODULES, root
    assert len(FLOORS) + 1 <= 10  # the floors and the root's
    assert all(floor(name) in range(-1, len(FLOORS) + 1) for name in modules())


def test_imports_go_down_the_floors():
    """A module imports its own floor or the floors below: config, kinds and training never
    reach analysis or commands, the store never the training step."""
    assert upward_imports(modules()) == []
    assert floor("perencode.kinds.tasks.base") < floor("perencode.analysis.results")
    assert floor("perencode.cli") > floor("perencode.commands.sweep.local")


def upward_imports(trees: dict[str, ast.Module]) -> list[str]:
    return sorted(f"{name} -> {dep}" for name, tree in trees.items()
                  for dep in package_imports(tree, trees) if floor(dep) > floor(name))


def find_cycle(trees: dict[str, ast.Module]) -> str | None:
    """An import cycle among `trees` ("a -> b -> a"), or None."""
    graph = {name: {t for node in walk(tree) for t in imported(node) if t in trees
                    and t != name} for name, tree in trees.items()}
    # A package's __init__ may re-export its own submodules; the rest must be acyclic.
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph[name]):
            if dep.startswith(name + "."):
                continue
            if state.get(dep) == 1:
                raise AssertionError(" -> ".join([*path, name, dep]))
            if dep not in state:
                visit(dep, [*path, name])
        state[name] = 2

    try:
        for name in sorted(graph):
            if name not in state:
                visit(name, [])
    except AssertionError as cycle:
        return str(cycle)
    return None


def test_imports_have_no_cycle():
    assert find_cycle(modules()) is None


def reached_from(start: str, trees: dict[str, ast.Module] | None = None) -> set[str]:
    """The package modules `start` imports, directly or through others (any import in its
    source, function-local ones too; importing a.b.c runs a and a.b first)."""
    trees = modules() if trees is None else trees
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in trees:
            continue
        seen.add(name)
        for node in walk(trees[name]):
            for target in imported(node):
                parts = target.split(".")
                todo.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return seen


@pytest.mark.slow
@pytest.mark.compat
def test_the_sweep_does_not_sit_on_the_training_stack():
    """The sweep only launches `perencode train` (and `bench`, for --estimate) in children:
    none of its modules imports the training loop, even through another module."""
    sweep = {name for name in modules() if command_of(name) == "sweep"}
    reached = set().union(*(reached_from(name) for name in sweep))
    assert {"perencode.training.planning", "perencode.store.runs",
            "perencode.config.grid"} <= reached
    assert sorted(reached & {"perencode.training.session", "perencode.training.loop",
                             "perencode.commands.train", "perencode.commands.bench"}) == []
    assert "perencode.commands.sweep" not in reached_from("perencode.commands.train")


def above_training(start: str, trees: dict[str, ast.Module] | None = None) -> list[str]:
    """The modules above the training floor (analysis, commands, the root's) that `start`
    reaches: the plugin API must reach none, since a plugin it serves is imported by the
    config floor (through importlib, which the floor rules cannot see)."""
    return sorted(name for name in reached_from(start, trees) - {start, "perencode"}
                  if floor(name) > floor("perencode.training.loop"))


def test_the_plugin_api_stands_on_the_training_floor():
    assert "perencode.training.loop" in reached_from("perencode.api")
    assert above_training("perencode.api") == []


def kinds_that_know_each_other(trees: dict[str, ast.Module]) -> list[str]:
    graph = {name: {t for node in walk(tree) for t in imported(node)}
             for name, tree in trees.items()}
    return sorted(name for name, deps in graph.items()
                  if name.startswith("perencode.kinds.models")
                  and any(d.startswith("perencode.kinds.tasks") for d in deps)
                  or name.startswith("perencode.kinds.tasks")
                  and any(d.startswith("perencode.kinds.models") for d in deps))


def test_models_and_tasks_do_not_know_each_other():
    """A model is sized by the task's Shapes (perencode.kinds.shapes) and a task knows no
    model: perencode.training.session.build pairs them, so a new model or task is one module
    that imports neither side."""
    assert kinds_that_know_each_other(modules()) == []


def module_level_imports(tree: ast.Module) -> set[str]:
    """What importing a module imports itself: its imports outside function bodies."""
    found, todo = set(), list[ast.AST](tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        found.update(imported(node))
        todo.extend(ast.iter_child_nodes(node))
    return found


LIGHT_VERIFY = ("submitit", "rich.live", "perencode.commands.sweep", "matplotlib")


def test_verify_does_not_import_the_sweep_machinery():
    """The package modules `import perencode.commands.verify` loads, and what each of them
    imports: no sweep machinery and no plotting (read from the sources; the slow twin below imports
    it in a fresh interpreter)."""
    seen, reached = verify_loads(modules())
    assert "perencode.analysis.results" in seen and "pandas" in reached  # the walk follows imports
    assert heavy_for_verify(reached) == []


def heavy_for_verify(reached: set[str]) -> list[str]:
    return sorted(t for t in reached if any(t == m or t.startswith(m + ".")
                                            for m in LIGHT_VERIFY))


def verify_loads(trees: dict[str, ast.Module]) -> tuple[set[str], set[str]]:
    """(the package modules importing verify runs, everything they import at module level)."""
    seen, todo, reached = set[str](), ["perencode.commands.verify"], set[str]()
    while todo:
        name = todo.pop()
        if name in seen or name not in trees:
            continue
        seen.add(name)
        for target in module_level_imports(trees[name]):
            reached.add(target)
            parts = target.split(".")
            # importing a.b.c runs the __init__ of a and a.b first
            todo.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return seen, reached


@pytest.mark.slow
def test_verify_imports_no_sweep_machinery_in_a_fresh_interpreter():
    code = ("import sys, perencode.commands.verify; "
            f"print(sorted(m for m in {LIGHT_VERIFY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=subprocess_env(), check=True).stdout.strip()
    assert out == "[]"


REGISTER = {"register_task", "register_model", "register_encoding"}
# Modules about the paper's own kinds by name, as recipes/paper/ is: the paper's figures
# (each selects the tasks and encodings it shows), the comparison with the authors' scripts
# (their settings, kind by kind), and the recipe's defaults (the paper's base recipe) with
# the migration of recipes written before the reverse variants were tasks.
# They are exemptions of their own rule, not of the layering: a new module is checked.
PAPER_MODULES = ("perencode.analysis.plots", "perencode.commands.crosscheck",
                 "perencode.config.recipe")
# Printed words that are also a kind's name ("none": no plugins, no analyses, the sparsest
# held-out set), not a kind.
WORDS = {("perencode.store.environment", "none"),
         ("perencode.commands.sweep.estimates", "none"), ("perencode.commands.bench", "none")}


def registers_kinds(tree: ast.Module) -> bool:
    """Whether a module calls register_task/_model/_encoding: a kind's own code."""
    return any(isinstance(node, ast.Call) and (getattr(node.func, "id", None) in REGISTER
                                               or getattr(node.func, "attr", None) in REGISTER)
               for node in walk(tree))


def shared_modules(trees: dict[str, ast.Module] | None = None) -> list[str]:
    """Every module of the package but the kinds' own and the paper's."""
    trees = modules() if trees is None else trees
    return [name for name, tree in trees.items() if not registers_kinds(tree)
            and not any(name == m or name.startswith(m + ".") for m in PAPER_MODULES)]


@pytest.mark.slow
@pytest.mark.compat
def test_shared_code_asks_no_kind_by_name():
    """What differs between kinds lives in their registrations: no shared module names one
    of the package's tasks, models or encodings (the LM's perplexity is its task's `results`
    hook, an encoding's join its own vectors, a model's TF32 switch its `tf32`, the tasks
    `stability` analyses their `stability`), so a plugin's kind goes every way a built-in
    does."""
    from perencode.config import registry

    registered = {n for kind in registry.REGISTRIES for n in registry.names(kind)}
    shared = shared_modules()
    # The kinds' own modules are left out, and only they and the paper's; the rest is in.
    assert {"perencode.commands.doctor", "perencode.commands.bench",
            "perencode.commands.stability", "perencode.commands.prune",
            "perencode.analysis.results", "perencode.kinds.tasks", "perencode.kinds.tasks.base",
            "perencode.kinds.models.base", "perencode.commands.sweep.estimates",
            "perencode.config.registry"} <= set(shared)
    # A kind's own code lives on the kinds' floor: a new task or model file is one there.
    kinds_code = {name for name, tree in modules().items() if registers_kinds(tree)}
    assert all(floor(name) == FLOORS.index("kinds") for name in kinds_code)
    assert {"perencode.kinds.encoding", "perencode.kinds.models.rnn",
            "perencode.kinds.tasks.reverse"} <= kinds_code
    assert set(modules()) - set(shared) == kinds_code | {
        m for m in modules() if any(m == p or m.startswith(p + ".") for p in PAPER_MODULES)}
    assert kinds_named(modules(), registered) == []


def kinds_named(trees: dict[str, ast.Module], registered: set[str]) -> list[str]:
    """Constants of shared modules that are a registered kind's name."""
    return sorted(f"{name}: {node.value!r} (line {node.lineno})" for name in shared_modules(trees)
                  for node in walk(trees[name])
                  if isinstance(node, ast.Constant) and node.value in registered
                  and (name, node.value) not in WORDS)


# -- Commands side by side (issue 37) ---------------------------------------------------------
# The modules `perencode COMMAND` runs, one module or package per command in
# perencode/commands/: none imports another; what two of them share lives on the floors below
# them (results, plots, verdicts, cost, grid, ...). The CLI, which imports them all, and
# __main__ stand above them.
COMMANDS_PACKAGE = "perencode.commands"


def command_of(module: str) -> str | None:
    """The command `module` belongs to (perencode.commands.crosscheck.models: crosscheck), or
    None."""
    parts = module.split(".")
    if module.startswith(COMMANDS_PACKAGE + ".") and len(parts) > 2:
        return parts[2]
    return None


def stacked_commands(trees: dict[str, ast.Module] | None = None) -> set[tuple[str, str]]:
    """(command, command it imports): any import in its modules' source, function-local
    ones too."""
    found = set()
    for name, tree in (modules() if trees is None else trees).items():
        importer = command_of(name)
        if importer is None:
            continue
        for node in walk(tree):
            for target in imported(node):
                imported_command = command_of(target)
                if imported_command not in (None, importer):
                    found.add((importer, imported_command))
    return found


def test_every_command_module_is_run_by_the_cli():
    """Each module or package of perencode/commands/ is what a CLI command runs: the CLI
    imports it (a module no command runs is library code and belongs on a floor below)."""
    commands = {c for c in map(command_of, modules()) if c is not None}
    assert {"train", "sweep", "crosscheck", "lm_prepare", "verify"} <= commands
    loaded = {c for node in walk(modules()["perencode.cli"]) for t in imported(node)
              if (c := command_of(t)) is not None}
    assert sorted(commands - loaded) == []
    assert command_of("perencode.commands.crosscheck.models") == "crosscheck"
    assert command_of("perencode.commands.sweep.local") == "sweep"
    assert command_of("perencode.kinds.lm_data") is None
    assert command_of("perencode.analysis.plots") is None


def test_no_command_imports_another():
    assert sorted(stacked_commands()) == []


# Above the commands, beside the CLI: a pipeline runs several of them (the quick demo: a
# sweep, then verify, then report) and only the CLI imports it.
PIPELINES = ("perencode.quickstart",)


def pipeline_importers(trees: dict[str, ast.Module]) -> set[str]:
    return {name for name, tree in trees.items() for node in walk(tree)
            for target in imported(node) if target in PIPELINES}


def test_a_pipeline_is_imported_by_the_cli_alone():
    """The quick demo runs three commands; the commands stay side by side below it."""
    assert pipeline_importers(modules()) == {"perencode.cli"}
    for pipeline in PIPELINES:
        assert floor(pipeline) == len(FLOORS)  # at the root, above the commands
        used = {command_of(t) for node in walk(modules()[pipeline]) for t in imported(node)}
        assert used >= {"sweep", "verify", "report"}  # what makes it a pipeline, not a command


def test_the_training_step_does_not_sit_on_the_run_directory():
    """The session (the training step) knows the checkpoint format (store.checkpoints, its
    one owner) and the records (store.records), never the run directory: runs imports them,
    not the other way round."""
    assert "perencode.store.runs" not in reached_from("perencode.training.session")
    for low in ("perencode.store.checkpoints", "perencode.store.records"):
        assert not reached_from(low) & {"perencode.store.runs",
                                        "perencode.training.session"}, low
    assert {"perencode.store.checkpoints", "perencode.store.records"} <= \
        reached_from("perencode.store.runs")


# -- Planted violations (issue 57): each rule above, shown one breach of it in an in-memory
# copy of the package, must catch it (a rule that cannot fail is no rule).
def planted(name: str, source: str, package: bool = False) -> dict[str, ast.Module]:
    trees = dict(modules())
    trees[name] = parse(name, source, package)
    return trees


def test_relative_imports_are_read_as_the_modules_they_name():
    assert ast.unparse(parse("perencode.training.loop", "from ..analysis import results")) \
        == "from perencode.analysis import results"
    assert ast.unparse(parse("perencode.commands.sweep", "from . import local", True)) \
        == "from perencode.commands.sweep import local"
    assert ast.unparse(parse("perencode.commands.sweep.local", "from .cells import x")) \
        == "from perencode.commands.sweep.cells import x"


@pytest.mark.slow
@pytest.mark.compat
@pytest.mark.parametrize("name,source,package", [
    ("perencode.training.planted", "from perencode.analysis import results", False),
    ("perencode.training.planted", "from ..analysis import results", False),
    ("perencode.store", "from ..commands import train", True),
    ("perencode.config.planted", "import perencode.commands.train", False),
])
def test_a_planted_upward_import_is_caught(name, source, package):
    assert upward_imports(planted(name, source, package)) != []


@pytest.mark.parametrize("source", ["from perencode.commands import train",
                                    "from .. import train", "from ..train import train",
                                    "def f():\n    from ..bench import bench\n"])
def test_a_planted_command_importing_a_command_is_caught(source):
    trees = planted("perencode.commands.report.planted", source)
    assert stacked_commands(trees) != set()


def test_a_planted_cycle_is_caught():
    trees = planted("perencode.common.console", "from . import errors\n")
    trees["perencode.common.errors"] = parse("perencode.common.errors",
                                             "from .console import x\n")
    assert find_cycle(trees) is not None


@pytest.mark.parametrize("source", ["def f():\n    from ..store import runs\n",
                                    "def f():\n    import json\n"])
def test_a_planted_function_local_import_is_caught(source):
    offenders, _ = local_imports({"perencode.analysis.planted": parse(
        "perencode.analysis.planted", source)})
    assert offenders != []
    assert local_imports({"perencode.analysis.planted": parse(
        "perencode.analysis.planted", "def f():\n    import matplotlib\n")})[0] == []


@pytest.mark.parametrize("name,source", [
    ("perencode.kinds.models.planted", "from ..tasks import base"),
    ("perencode.kinds.tasks.planted", "from perencode.kinds.models import rnn"),
])
def test_a_planted_model_knowing_a_task_is_caught(name, source):
    assert kinds_that_know_each_other(planted(name, source)) == [name]


def test_a_planted_kind_name_in_shared_code_is_caught():
    trees = planted("perencode.analysis.planted", "TASK = 'reverse'\n")
    assert kinds_named(trees, {"reverse"}) == ["perencode.analysis.planted: 'reverse' (line 1)"]


def test_a_planted_pipeline_import_is_caught():
    trees = planted("perencode.commands.report.planted", "from ... import quickstart")
    assert pipeline_importers(trees) == {"perencode.cli", "perencode.commands.report.planted"}


def test_a_planted_heavy_import_under_verify_is_caught():
    trees = planted("perencode.commands.verify", "from .sweep import local\n")
    assert "perencode.commands.sweep.local" in heavy_for_verify(verify_loads(trees)[1])


def test_a_planted_sweep_reaching_training_is_caught():
    trees = planted("perencode.commands.sweep.local", "from perencode.training import session\n")
    assert "perencode.training.session" in reached_from("perencode.commands.sweep.local", trees)
    trees = planted("perencode.store.records", "from . import runs\n")
    assert "perencode.store.runs" in reached_from("perencode.store.records", trees)


def test_a_planted_plugin_api_importing_a_command_is_caught():
    source = (PACKAGE / "api.py").read_text(encoding="utf-8")
    trees = planted("perencode.api", source + "from .commands.train import train_recipe\n")
    assert above_training("perencode.api", trees) == ["perencode.commands",
                                                      "perencode.commands.train"]


def test_a_module_outside_the_floors_is_refused():
    with pytest.raises(ValueError):
        floor("perencode.utils.helpers")
