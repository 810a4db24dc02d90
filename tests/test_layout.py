"""The package's layout: imports flow one way (no cycle), modules import each other at the
top (a function-local import only defers an optional heavy dependency, or is a CLI command
loading what it runs), `verify` stays light and the CLI starts without torch."""

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
CLI_START = {"perencode", "perencode.cli", "perencode.console", "perencode.defaults",
             "perencode.errors", "perencode.kinds",
             # the sweep's options, declared beside SweepOptions (its package imports nothing)
             "perencode.sweep", "perencode.sweep.options"}
HEAVY = ("torch", "numpy", "pandas", "matplotlib", "seaborn", "submitit", "sentencepiece",
         "tensorboard")


@functools.cache
def modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text(encoding="utf-8"))
    return out


def imported(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module:
        # `from perencode import runs` imports the module perencode.runs
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


def test_no_function_local_imports_but_optional_dependencies_and_cli_commands():
    offenders, commands = [], []
    for name, tree in modules().items():
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if is_cli_command(name, func):
                commands.append(func.name)
                continue
            if is_app_callback(name, func):
                continue
            for node in ast.walk(func):
                for target in imported(node):
                    if not deferred(target):
                        offenders.append(f"{name}.{func.name}: {target}")
    assert offenders == []
    assert {"train", "sweep", "tensorboard_"} <= set(commands)


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
    assert int(count) == sum(is_cli_command("perencode.cli", f) for f in ast.walk(cli)
                             if isinstance(f, ast.FunctionDef))
    assert sorted(ast.literal_eval(loaded)) == sorted(CLI_START)


def test_imports_have_no_cycle():
    trees = modules()
    graph = {name: {t for node in ast.walk(tree) for t in imported(node) if t in trees
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

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    # The layers of issue 15: the training core never reaches up to sweeps or reports.
    for low in ("perencode.session", "perencode.train", "perencode.evaluate", "perencode.models",
                "perencode.tasks"):
        assert not graph[low] & {"perencode.sweep", "perencode.figures", "perencode.plots",
                                 "perencode.verify", "perencode.verdicts",
                                 "perencode.results", "perencode.cli"}, low


def reached_from(start: str) -> set[str]:
    """The package modules `start` imports, directly or through others (any import in its
    source, function-local ones too; importing a.b.c runs a and a.b first)."""
    trees = modules()
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen or name not in trees:
            continue
        seen.add(name)
        for node in ast.walk(trees[name]):
            for target in imported(node):
                parts = target.split(".")
                todo.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return seen


def test_the_sweep_does_not_sit_on_the_training_stack():
    """The sweep only launches `perencode train` (and `bench`, for --estimate) in children:
    none of its modules imports the training loop, even through another module."""
    sweep = {name for name in modules() if name.split(".")[:2] == ["perencode", "sweep"]}
    reached = set().union(*(reached_from(name) for name in sweep))
    assert {"perencode.cost", "perencode.runs", "perencode.grid"} <= reached  # it walks
    assert sorted(reached & {"perencode.session", "perencode.train", "perencode.bench"}) == []
    assert "perencode.sweep" not in reached_from("perencode.train")


def test_models_and_tasks_do_not_know_each_other():
    """A model is sized by the task's Shapes (perencode.shapes) and a task knows no model:
    perencode.session.build pairs them, so a new model or task is one module that imports
    neither side."""
    graph = {name: {t for node in ast.walk(tree) for t in imported(node)}
             for name, tree in modules().items()}
    for name, deps in graph.items():
        if name.startswith("perencode.models"):
            assert not any(d.startswith("perencode.tasks") for d in deps), name
        if name.startswith("perencode.tasks"):
            assert not any(d.startswith("perencode.models") for d in deps), name


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


LIGHT_VERIFY = ("submitit", "rich.live", "perencode.sweep", "matplotlib")


def test_verify_does_not_import_the_sweep_machinery():
    """The package modules `import perencode.verify` loads, and what each of them imports:
    no sweep machinery and no plotting (read from the sources; the slow twin below imports
    it in a fresh interpreter)."""
    trees = modules()
    seen, todo, reached = set(), ["perencode.verify"], set()
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
    assert "perencode.results" in seen and "pandas" in reached  # the walk follows imports
    assert sorted(t for t in reached if any(t == m or t.startswith(m + ".")
                                             for m in LIGHT_VERIFY)) == []


@pytest.mark.slow
def test_verify_imports_no_sweep_machinery_in_a_fresh_interpreter():
    code = ("import sys, perencode.verify; "
            f"print(sorted(m for m in {LIGHT_VERIFY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=subprocess_env(), check=True).stdout.strip()
    assert out == "[]"


REGISTER = {"register_task", "register_model", "register_encoding"}
# Modules about the paper's own kinds by name, as recipes/paper/ is: the paper's figures
# (each selects the tasks and encodings it shows), the comparison with the authors' scripts
# (their settings, kind by kind), and the recipe's defaults (the paper's base recipe) with
# the migration of recipes written before the reverse variants were tasks.
PAPER_MODULES = ("perencode.plots", "perencode.crosscheck", "perencode.recipe")
# Printed words that are also a kind's name ("none": no plugins, no analyses, the sparsest
# held-out set), not a kind.
WORDS = {("perencode.environment", "none"), ("perencode.sweep.cost", "none"),
         ("perencode.bench", "none")}


def registers_kinds(tree: ast.Module) -> bool:
    """Whether a module calls register_task/_model/_encoding: a kind's own code."""
    return any(isinstance(node, ast.Call) and (getattr(node.func, "id", None) in REGISTER
                                               or getattr(node.func, "attr", None) in REGISTER)
               for node in ast.walk(tree))


def shared_modules() -> list[str]:
    """Every module of the package but the kinds' own and the paper's."""
    return [name for name, tree in modules().items() if not registers_kinds(tree)
            and not any(name == m or name.startswith(m + ".") for m in PAPER_MODULES)]


def test_shared_code_asks_no_kind_by_name():
    """What differs between kinds lives in their registrations: no shared module names one
    of the package's tasks, models or encodings (the LM's perplexity is its task's `results`
    hook, an encoding's join its own vectors, a model's TF32 switch its `tf32`, the tasks
    `stability` analyses their `stability`), so a plugin's kind goes every way a built-in
    does."""
    from perencode import kinds

    registered = {n for kind in kinds.REGISTRIES for n in kinds.names(kind)}
    shared = shared_modules()
    # The kinds' own modules are left out, and only they and the paper's; the rest is in.
    assert {"perencode.doctor", "perencode.bench", "perencode.stability", "perencode.prune",
            "perencode.results", "perencode.tasks", "perencode.tasks.base",
            "perencode.models.base", "perencode.sweep.cost", "perencode.kinds"} <= set(shared)
    assert sorted(set(modules()) - set(shared)) == sorted(
        [m for m in modules() if m.startswith("perencode.crosscheck.") or m in (
            "perencode.crosscheck", "perencode.plots", "perencode.recipe",
            "perencode.encoding", "perencode.models.rnn", "perencode.models.s4d")
         or m.startswith("perencode.tasks.") and m != "perencode.tasks.base"])
    offenders = sorted(f"{name}: {node.value!r} (line {node.lineno})" for name in shared
                       for node in ast.walk(modules()[name])
                       if isinstance(node, ast.Constant) and node.value in registered
                       and (name, node.value) not in WORDS)
    assert offenders == []


# -- Commands side by side (issue 37) ---------------------------------------------------------
# The modules `perencode COMMAND` runs (a package with its submodules): none imports another;
# what two of them share lives in the library below them (results, plots, verdicts, cost,
# grid, ...). The CLI, which imports them all, and __main__ stand above them.
COMMANDS = ("train", "evaluate", "stability", "bench", "doctor", "crosscheck", "figures", "plan",
            "verify", "report", "rehearsal", "sweep", "prune", "lm.prepare")
# Pipelines of commands (the quick demo: sweep, verify, report): they stand above the commands
# beside the CLI, and only the CLI imports them.
PIPELINES = ("quickstart",)
def command_of(module: str) -> str | None:
    """The command `module` belongs to (perencode.crosscheck.models: crosscheck), or None."""
    for command in COMMANDS:
        name = f"perencode.{command}"
        if module == name or module.startswith(name + "."):
            return command
    return None


def stacked_commands() -> set[tuple[str, str]]:
    """(command, command it imports): any import in its modules' source, function-local
    ones too."""
    found = set()
    for name, tree in modules().items():
        importer = command_of(name)
        if importer is None:
            continue
        for node in ast.walk(tree):
            for target in imported(node):
                imported_command = command_of(target)
                if imported_command not in (None, importer):
                    found.add((importer, imported_command))
    return found


def test_every_command_is_a_module_of_the_package():
    names = modules()
    assert [c for c in COMMANDS if f"perencode.{c}" not in names] == []
    assert command_of("perencode.crosscheck.models") == "crosscheck"
    assert command_of("perencode.sweep.local") == "sweep"
    assert command_of("perencode.lm.data") is None and command_of("perencode.plots") is None


def test_no_command_imports_another():
    assert sorted(stacked_commands()) == []


def test_a_pipeline_is_imported_by_the_cli_alone():
    """The quick demo runs three commands; the commands stay side by side below it."""
    importers = {name for name, tree in modules().items() for node in ast.walk(tree)
                 for target in imported(node) if target.split(".")[:2] in
                 (["perencode", p] for p in PIPELINES)}
    assert importers == {"perencode.cli"}
    pipeline = modules()["perencode.quickstart"]
    assert {command_of(t) for node in ast.walk(pipeline) for t in imported(node)} >= \
        {"sweep", "verify", "report"}  # what makes it a pipeline, not a command


def test_the_training_step_does_not_sit_on_the_run_directory():
    """The session (the training step) knows the checkpoint format (perencode.checkpoints,
    its one owner) and the records (perencode.records), never the run directory: runs
    imports them, not the other way round."""
    assert "perencode.runs" not in reached_from("perencode.session")
    for low in ("perencode.checkpoints", "perencode.records"):
        assert not reached_from(low) & {"perencode.runs", "perencode.session"}, low
    assert {"perencode.checkpoints", "perencode.records"} <= reached_from("perencode.runs")
