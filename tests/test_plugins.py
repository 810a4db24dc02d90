"""Plugins across the process boundary (perencode.config.plugins), with real processes: a loose
file passed with --plugin or PERENCODE_PLUGINS reaches a sweep's workers, a run records
the plugins its kinds come from and a new process without them says which it needs (and
never runs the file); an installed package's `perencode.kinds` entry point (the example
minGRU package, installed into a throwaway environment) works with no flag at all; a
plugin that fails to import is one line and exit 2."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import forked
import pytest
from conftest import PYTHON, ROOT, run_cli, subprocess_env
from test_sweep import TINY

from perencode.config import plugins, registry
from perencode.store import environment, runs

EXAMPLE = ROOT / "examples" / "perencode-minrnn"

LIN_RAMP = '''
import torch
from perencode.config.registry import EncodingKind, register_encoding


def lin_ramp(positions, dim):
    """Position t as t / (T - 1) in every dimension."""
    return torch.linspace(0.0, 1.0, positions)[:, None].expand(positions, dim).clone()


register_encoding(EncodingKind("lin_ramp", label="Linear ramp", table=lin_ramp))
'''


def autoloading(env: dict) -> dict:
    """`env` with installed plugins loading by themselves (the suite turns that off:
    conftest.py): the tests of the installed route opt in."""
    return {k: v for k, v in env.items() if k != registry.AUTOLOAD_OFF}


def perencode(*args, python: str = PYTHON, env: dict | None = None, cwd: Path | None = None,
              timeout: float = 300, autoload: bool = False) -> tuple[int, str]:
    """`python -m perencode ARGS...` in a process of its own: (exit code, stdout + stderr);
    `autoload`: with the installed plugins. The process is a fork of this one
    (tests/forked.py) unless a fresh interpreter is what differs: another Python, installed
    plugins found at start (`autoload`), or a PYTHONPATH of the test's own."""
    fresh = python != PYTHON or autoload or "PYTHONPATH" in (env or {})
    env = {**subprocess_env(), **(env or {})}
    if not fresh:
        done = forked.run([*args], env=env, cwd=cwd, timeout=timeout)
        return done.returncode, done.stdout + done.stderr
    proc = subprocess.run([python, "-m", "perencode", *map(str, args)], capture_output=True,
                          text=True, env=autoloading(env) if autoload else env, cwd=cwd,
                          timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def error_line(text: str) -> str:
    """The one error line of a refused command (rich may wrap it on a narrow terminal)."""
    assert "Traceback" not in text, text
    return " ".join(text.split())


@pytest.fixture
def loose(tmp_path) -> Path:
    path = tmp_path / "my_pe.py"
    path.write_text(LIN_RAMP)
    return path


@pytest.mark.slow
def test_a_loose_plugin_reaches_the_sweep_workers_and_its_runs_name_it(tmp_path, loose):
    grid = tmp_path / "ramp.toml"
    grid.write_text(TINY + '\n[grid]\n"task.vocab_size" = [8]\n'
                    '"encoding.kind" = ["sinusoidal", "lin_ramp"]\n')
    out = tmp_path / "runs"
    # Without the plugin, the dry run refuses the cell in one line that says how to load it.
    code, text = perencode("sweep", grid, "--runs", out, "--dry-run", "--device", "cpu")
    line = error_line(text)
    assert code == 2 and "[grid] vocab_size=8/encoding=lin_ramp: encoding.kind: Input should" \
        in line and "(got 'lin_ramp')" in line and "perencode --plugin FILE_OR_MODULE" in line
    code, text = perencode("--plugin", loose, "sweep", grid, "--runs", out, "--dry-run",
                           "--device", "cpu")
    assert code == 0 and "2 runs (2 new)" in text, text
    # The sweep's parent gets the plugin from the variable, as a relative path: the workers
    # (other processes, started in the same folder) get it as an absolute one.
    code, text = perencode("sweep", grid, "--runs", out, "--jobs", "2", "--device", "cpu",
                           "--no-progress", env={"PERENCODE_PLUGINS": loose.name}, cwd=tmp_path)
    assert code == 0, text
    ramp = out / "ramp" / "vocab_size=8" / "encoding=lin_ramp"
    for cell in (ramp, ramp.parent / "encoding=sinusoidal"):
        assert runs.Run(cell).is_complete(), (cell / "train.log").read_text()
    assert json.loads((ramp / "eval.json").read_text())["encoding"] == "lin_ramp"
    recorded = json.loads((ramp / "plugins.json").read_text())["plugins"]
    assert recorded == [{"module": "my_pe", "file": str(loose.resolve()), "package": None,
                         "version": None, "entry_point": None,
                         "provides": ["encoding.kind = 'lin_ramp'"],
                         "labels": {"encoding": {"lin_ramp": "Linear ramp"}}}]
    assert not (ramp.parent / "encoding=sinusoidal" / "plugins.json").exists()
    env = json.loads((ramp / "env.json").read_text())
    assert {"module": "my_pe", "file": str(loose.resolve()), "package": None,
            "version": None, "entry_point": None} in env["plugins"]
    # A fresh process: with the plugin it evaluates the run, without it one line names it.
    code, text = perencode("--plugin", loose, "eval", ramp, "--device", "cpu")
    assert code == 0 and "lin_ramp" in text, text
    # The file is never run because the run names it: a marker it would write stays absent.
    loose.write_text(LIN_RAMP + "\nopen(__file__ + '.ran', 'w').close()\n")
    code, text = perencode("eval", ramp, "--device", "cpu")
    assert code == 2 and error_line(text) == (
        f"error: {ramp}: the run needs the plugin my_pe ({loose.resolve()}) for "
        f"encoding.kind = 'lin_ramp', which this process has not loaded; pass it: perencode "
        f"--plugin {loose.resolve()} COMMAND ... (or PERENCODE_PLUGINS={loose.resolve()})")
    assert not Path(str(loose) + ".ran").exists()
    for command in (["stability", ramp], ["train", ramp / "recipe.toml", "--run-dir", ramp]):
        code, text = perencode(*command, "--device", "cpu")  # any command reading the run
        assert code == 2 and "the run needs the plugin my_pe" in error_line(text), command


@pytest.mark.slow
def test_a_kind_registered_by_a_wrapper_script_reaches_the_workers(tmp_path, loose):
    """The in-process route (a script imports the module, then calls the CLI): the sweep
    hands the workers the module's file."""
    grid = tmp_path / "g.toml"
    grid.write_text(TINY + '\n[grid]\n"task.vocab_size" = [8]\n"encoding.kind" = ["lin_ramp"]\n')
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text("import sys\nimport my_pe  # noqa: F401\nfrom perencode.cli import app\n"
                       "app(sys.argv[1:])\n")
    proc = subprocess.run([PYTHON, str(wrapper), "sweep", str(grid), "--runs",
                           str(tmp_path / "runs"), "--device", "cpu", "--no-progress"],
                          capture_output=True, text=True, env=subprocess_env(), cwd=tmp_path,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert runs.Run(tmp_path / "runs" / "g" / "vocab_size=8" / "encoding=lin_ramp").is_complete()


@pytest.mark.slow
def test_a_plugin_that_fails_to_import_is_one_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nraise RuntimeError('no GPU kernels for this build')\n")
    recipe = ROOT / "recipes" / "gru_vocab256.toml"
    code, text = perencode("--plugin", bad, "show", recipe)
    assert code == 2 and error_line(text) == (f"error: plugin {bad}: importing it failed: "
                                              "RuntimeError: no GPU kernels for this build")
    code, text = perencode("show", recipe, env={"PERENCODE_PLUGINS": str(tmp_path / "gone.py")})
    assert code == 2 and error_line(text) == f"error: plugin {tmp_path / 'gone.py'}: no such file"
    code, text = perencode("--plugin", "no_such_module_x", "show", recipe)
    assert code == 2 and "plugin no_such_module_x: no module of that name" in error_line(text)
    notes = tmp_path / "notes.txt"
    notes.write_text("register_task(...)\n")
    code, text = perencode("--plugin", notes, "show", recipe)
    assert code == 2 and error_line(text) == \
        f"error: plugin {notes}: not a Python source file (.py)"


def test_an_unknown_kind_names_the_registered_ones_and_the_plugin_routes(tmp_path):
    recipe = ROOT / "recipes" / "gru_vocab256.toml"
    for command in ("show", "train"):
        code, text = run_cli(command, recipe, "--set", "model.arch=mamba")
        line = " ".join(text.split())
        assert code == 2 and "model.arch: Input should be 'gru', 'lstm' or 's4d' (got " \
            "'mamba'); a plugin's kinds load with `perencode --plugin FILE_OR_MODULE`, " \
            "PERENCODE_PLUGINS or an installed package's perencode.kinds entry point" in line


# -- the installed route: the example minGRU package -------------------------------------------


def throwaway_env(folder: Path, *packages: Path) -> str:
    """A venv that sees this checkout's perencode and the test environment's packages
    (torch, pydantic...: the system's, and the test venv's where it has its own) and has
    `packages` pip-installed (offline, nothing downloaded); its python."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip",
                    str(folder)], check=True, timeout=120)
    python = str(folder / "bin" / "python")
    own = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                          "['purelib'])"], capture_output=True, text=True, check=True)
    lines = [str(ROOT), *(f"import site; site.addsitedir({path!r})"
                          for path in site.getsitepackages())]
    Path(own.stdout.strip(), "perencode-test-env.pth").write_text("\n".join(lines) + "\n")
    for package in packages:
        copy = folder.parent / f"src-{package.name}"  # the build writes beside its sources
        shutil.copytree(package, copy, ignore=shutil.ignore_patterns("build", "*.egg-info"))
        subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q",
                        "--no-deps", "--no-build-isolation", "--no-index", str(copy)],
                       check=True, capture_output=True, timeout=300)
    return python


@pytest.fixture(scope="module")
def minrnn(tmp_path_factory) -> str:
    """The python of an environment with the example package installed."""
    return throwaway_env(tmp_path_factory.mktemp("venv") / "env", EXAMPLE)


MINGRU = TINY.replace("[model]\n", '[model]\narch = "mingru"\n')


@pytest.fixture(scope="module")
def mingru_runs(minrnn, tmp_path_factory) -> tuple[Path, int, str]:
    """A sweep of two minGRU cells (vocabulary 8, vanilla and sinusoidal) on two workers in
    the throwaway environment, the plugin found by its entry point alone: (the runs' folder,
    the sweep's exit code, what it printed). Each worker is a new `perencode train` process:
    the train command of the installed route."""
    folder = tmp_path_factory.mktemp("sweep")  # no "mingru" in its path: results.csv counts it
    grid = folder / "mg.toml"
    grid.write_text(MINGRU + '\n[grid]\n"task.vocab_size" = [8]\n'
                    '"encoding.kind" = ["none", "sinusoidal"]\n')
    code, text = perencode("sweep", grid, "--runs", folder / "runs", "--jobs", "2",
                           "--device", "cpu", "--no-progress", python=minrnn, autoload=True)
    return folder / "runs", code, text


@pytest.mark.slow
def test_an_installed_plugin_works_in_every_command_with_no_flag(tmp_path, minrnn,
                                                                mingru_runs):
    recipe = tmp_path / "mingru.toml"
    recipe.write_text(MINGRU.replace("[task]\n", "[task]\nvocab_size = 8\n"))
    swept, code, text = mingru_runs
    run = tmp_path / "run"  # a copy: eval writes into it
    shutil.copytree(swept / "mg" / "vocab_size=8" / "encoding=none", run)
    assert code == 0 and runs.Run(run).is_complete(), text
    recorded = json.loads((run / "plugins.json").read_text())["plugins"]
    assert [(p["module"], p["package"], p["version"], p["entry_point"], p["provides"])
            for p in recorded] == [("perencode_minrnn.plugin", "perencode-minrnn", "0.1.0",
                                    "minrnn", ["model.arch = 'mingru'"])]
    code, text = perencode("eval", run, "--device", "cpu", python=minrnn, autoload=True)
    assert code == 0 and "mingru" in text, text
    # Where the package is not installed: one line naming it and how to get it.
    code, text = perencode("eval", run, "--device", "cpu")
    assert code == 2 and error_line(text) == (
        f"error: {run}: the run needs the plugin perencode_minrnn.plugin (perencode-minrnn "
        "0.1.0) for model.arch = 'mingru', which this process has not loaded; install the "
        "package perencode-minrnn 0.1.0 (its perencode.kinds entry point 'minrnn' loads it "
        "by itself)")
    # bench prints the step time: a table, then the same as one JSON line.
    code, text = perencode("bench", recipe, "--iterations", "3", "--warmup", "1", "--device",
                           "cpu", python=minrnn, autoload=True)
    assert code == 0, text
    timing = json.loads(next(line for line in text.splitlines() if line.startswith("{")))
    assert text.count("seconds_per_iteration") == 2  # the table a user reads, and the JSON
    assert timing["arch"] == "mingru" and timing["seconds_per_iteration"] > 0


@pytest.mark.slow
def test_the_example_grid_sweeps_and_draws_under_its_own_name(tmp_path, minrnn, mingru_runs):
    code, text = perencode("sweep", EXAMPLE / "grids" / "reverse_vocabulary.toml", "--runs",
                           tmp_path / "plan", "--dry-run", "--device", "cpu", python=minrnn,
                           autoload=True)
    assert code == 0 and "40 runs (40 new)" in text, text
    swept, code, text = mingru_runs
    assert code == 0, text
    for cell in ("encoding=none", "encoding=sinusoidal"):
        assert runs.Run(swept / "mg" / "vocab_size=8" / cell).is_complete()
    code, text = perencode("figures", swept, "--out", tmp_path / "fig",
                           python=minrnn, autoload=True)
    assert code == 0, text
    table = (tmp_path / "fig" / "results.csv").read_text()
    assert table.count("mingru") == 2
    # Drawn in Fig. 2's layout; a model the paper did not test makes it not the paper's.
    assert (tmp_path / "fig" / "fig02_reverse_vocabulary__nonpaper.png").stat().st_size > 0
    assert "arch mingru (paper: " in text, text
    # Its panel is titled with the registered label.
    label = subprocess.run([minrnn, "-c", "from perencode.config import registry as kinds; "
                            "print(kinds.label('model', 'mingru'))"], capture_output=True,
                           text=True, env=autoloading(subprocess_env()), check=True)
    assert label.stdout.strip() == "minGRU"


@pytest.mark.slow
def test_an_installed_plugin_that_fails_to_import_is_one_line(tmp_path):
    package = tmp_path / "broken-plugin"
    (package / "broken_plugin").mkdir(parents=True)
    (package / "broken_plugin" / "__init__.py").write_text("raise ImportError('needs foo')\n")
    (package / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=64"]\nbuild-backend = '
        '"setuptools.build_meta"\n[project]\nname = "broken-plugin"\nversion = "1.0"\n'
        '[project.entry-points."perencode.kinds"]\nbroken = "broken_plugin"\n'
        '[tool.setuptools]\npackages = ["broken_plugin"]\n')
    python = throwaway_env(tmp_path / "env", package)
    code, text = perencode("show", ROOT / "recipes" / "gru_vocab256.toml", python=python,
                           autoload=True)
    assert code == 2 and error_line(text) == (
        "error: plugin 'broken' (perencode.kinds entry point broken_plugin of broken-plugin): "
        "cannot be loaded: ImportError: needs foo")


# -- provenance ---------------------------------------------------------------------------------


def test_env_records_whether_the_checkout_has_uncommitted_changes(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    assert environment.git_dirty(repo) is False
    (repo / "a.py").write_text("x = 2\n")
    assert environment.git_dirty(repo) is True
    plain = tmp_path / "plain"
    plain.mkdir()
    assert environment.git_dirty(plain) is None  # no checkout


def test_a_plugins_kinds_remember_where_they_came_from(tmp_path, loose):
    from perencode.config import registry

    try:
        plugin = plugins.load(str(loose))
        assert plugin == plugins.Plugin("my_pe", str(loose.resolve()))
        assert plugins.origin("encoding", "lin_ramp") == plugin
        assert plugins.origin("encoding", "sinusoidal") is None  # the package's own
        assert plugins.load(str(loose)) is plugin  # loaded once
        assert plugins.handed_on() == [str(loose.resolve())]
        # A module of a package is handed on by name (its relative imports), a file by path.
        assert [plugins.Plugin(m, f).spec for m, f in [
            ("mylab.enc", "/x/mylab/enc.py"), ("mylab", "/x/mylab/__init__.py"),
            ("my_pe", "/x/my_pe.py")]] == ["mylab.enc", "mylab", "/x/my_pe.py"]
        assert plugins.environment([str(loose), "pkg.mod"]) == {
            "PERENCODE_PLUGINS": f"{loose}{os.pathsep}pkg.mod"}
    finally:
        registry.ENCODINGS.pop("lin_ramp", None)
        registry.ORIGINS.pop(("encoding", "lin_ramp"), None)
        plugins._LOADED.pop(str(loose.resolve()), None)
        sys.modules.pop("my_pe", None)



def doc_blocks(language: str) -> list[str]:
    """The ```LANGUAGE blocks of docs/extending.md's routes section, in order."""
    text = (ROOT / "docs" / "extending.md").read_text()
    routes = text[text.index("## Three ways"):text.index("### What a run remembers")]
    return [block.split("\n", 1)[1] for block in routes.split("```")[1::2]
            if block.startswith(language + "\n")]


@pytest.mark.slow
def test_the_docs_first_two_routes_run_as_written(tmp_path):
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    notebook, loose_file = doc_blocks("python")
    proc = subprocess.run([PYTHON, "-c", notebook], capture_output=True, text=True,
                          env=subprocess_env(), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert 0.0 <= float(proc.stdout.strip().splitlines()[-1]) <= 1.0
    assert runs.Run(tmp_path / "runs" / "notebook" / "lin_ramp").is_complete()
    (tmp_path / "my_pe.py").write_text(loose_file)
    commands = doc_blocks("sh")[0].replace("\\\n", " ").splitlines()
    for command in commands:
        variables, _, rest = command.partition("perencode ")
        env = dict(v.split("=", 1) for v in variables.split())
        code, text = perencode(*rest.split(), env=env, cwd=tmp_path)
        assert code == 0, (command, text)
    assert json.loads((tmp_path / "runs" / "lin_ramp" / "eval.json").read_text())[
        "encoding"] == "lin_ramp"
