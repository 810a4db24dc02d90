"""The package's layout: imports flow one way (no cycle), modules import each other at the
top (a function-local import only defers an optional heavy dependency), and `verify`
stays light."""

from __future__ import annotations

import ast
import subprocess
import sys

from conftest import ROOT, subprocess_env

PACKAGE = ROOT / "perencode"
# Third-party modules that some commands need and others do not: imported where used.
DEFERRED = {"matplotlib", "seaborn", "sentencepiece", "datasets",
            "fcntl", "msvcrt"}  # one per platform: imported where the platform is known


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


def test_no_function_local_imports_but_optional_dependencies():
    offenders = []
    for name, tree in modules().items():
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                for target in imported(node):
                    if target.split(".")[0] not in DEFERRED:
                        offenders.append(f"{name}.{func.name}: {target}")
    assert offenders == []


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
    for low in ("perencode.train", "perencode.evaluate", "perencode.models", "perencode.tasks"):
        assert not graph[low] & {"perencode.sweep", "perencode.figures", "perencode.verify",
                                 "perencode.results", "perencode.cli"}, low


def test_models_and_tasks_do_not_know_each_other():
    """A model is sized by ModelSizes and a task knows no model: perencode.experiment pairs
    them, so a new model or task is one module that imports neither side."""
    graph = {name: {t for node in ast.walk(tree) for t in imported(node)}
             for name, tree in modules().items()}
    for name, deps in graph.items():
        if name.startswith("perencode.models"):
            assert not any(d.startswith("perencode.tasks") for d in deps), name
        if name.startswith("perencode.tasks"):
            assert not any(d.startswith("perencode.models") for d in deps), name


def test_verify_does_not_import_the_sweep_machinery():
    code = ("import sys, perencode.verify; "
            "print(sorted(m for m in ('submitit', 'rich.live', 'perencode.sweep', "
            "'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=subprocess_env(), check=True).stdout.strip()
    assert out == "[]"
