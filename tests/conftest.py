"""Shared test helpers: the repository root, the one tiny recipe (as a dict, a TOML file, `--set`
overrides, a `perencode train` command line), the in-process CLI, console-output checks, a
tmpfs and the processes a command spawned, and what a test session builds once for every
xdist worker (`built_once`: the tiny finished runs, the paper trees, their drawings)."""

import functools
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

# The suite tests the package's own kinds, isolated from plugins installed beside it (the
# example's `pip install examples/perencode-minrnn`) or named by the user's environment;
# a test of plugins opts in (tests/test_plugins.py). Set before any registry is used, and
# inherited by every process a test starts.
os.environ["PERENCODE_DISABLE_PLUGIN_AUTOLOAD"] = "1"
os.environ.pop("PERENCODE_PLUGINS", None)

import pytest
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
LAUNCH: Callable | None = None


def pytest_configure(config: pytest.Config) -> None:
    """In a process that runs tests (an xdist worker, or pytest without workers), before any
    test module is imported: what a new process registers is taken (tests/forked.py), torch
    set to one thread, and typer's CliRunner made to build the app's command once (it builds
    the click command from the app's function signatures on every invoke: about 10 ms a
    call, seconds over the suite; the app does not change in a test run). xdist's controller
    runs no test and loads none of it: its workers start 5 s sooner (torch alone is 3)."""
    if not hasattr(config, "workerinput") and config.getoption("dist", "no") != "no":
        return
    global LAUNCH
    import forked  # noqa: F401 - before any test module: the kinds a new process starts with
    import torch
    import torch._dynamo  # noqa: F401 - Adam's first loads it (2 s): here, not in each fork
    import typer.main
    import typer.testing

    from perencode.commands.sweep.child import launch

    LAUNCH = launch  # the sweep's own, for `real_children` in a module that forks them
    torch.set_num_threads(1)
    typer.testing._get_command = functools.lru_cache(maxsize=None)(typer.main.get_command)


# The one tiny configuration of the tests: small enough to train in a second or two on one
# CPU core, in three forms. `tiny_recipe(**tables)` is a whole tiny recipe as a dict (TINY_RECIPE
# with a test's own keys over each table), `tiny_toml(**tables)` the same as the text of a
# recipe or grid file; TINY is the `--set` overrides that make a recipe of recipes/ tiny
# (`train_args` runs one), `tiny_model(arch)` a tiny [model] table. An option of some kinds
# only (the S4D's state, a held-out count) is left out where the recipe's kinds do not have it
# (`fitting`). The embedding is 8 wide in TINY_RECIPE and 16 in TINY: the sizes the tests of
# each were written and timed at.
TINY_RECIPE: dict[str, dict] = {
    "task": {"name": "reverse", "length": 4, "held_out": 16},
    "model": {"hidden_size": 16, "embed_size": 8},
    "train": {"iterations": 10, "batch_size": 8, "log_every": 5, "eval_batch_size": 16}}
TINY_MODEL = {"hidden_size": 16, "embed_size": 16}
TINY = [*(f"model.{key}={value}" for key, value in TINY_MODEL.items()), "model.d_state=8",
        "train.batch_size=8", "task.held_out=32", "train.log_every=5"]
# The recipe `train_args` makes tiny unless a test names another.
RECIPE = ROOT / "recipes" / "gru_vocab256.toml"


def tiny_recipe(**tables: dict) -> dict:
    """TINY_RECIPE with each named table's keys over its own (a new table as given; `grid`
    for a grid file's axes)."""
    out = {name: dict(table) for name, table in TINY_RECIPE.items()}
    for name, table in tables.items():
        out[name] = {**out.get(name, {}), **table}
    return out


def tiny_toml(**tables: dict) -> str:
    import tomli_w

    """`tiny_recipe(**tables)` as the text of a recipe (or, with `grid`, a grid) file."""
    return tomli_w.dumps(tiny_recipe(**tables))


def train_args(run_dir: Path | str, *sets: str, recipe: Path = RECIPE) -> list[str]:
    """The arguments of `perencode train` of a tiny `recipe` into `run_dir` on the CPU:
    TINY and `sets` (a test's own `section.key=value`s) as `--set` options."""
    return ["train", str(recipe), "--run-dir", str(run_dir), "--device", "cpu",
            "--no-progress", *tiny_overrides(*sets, recipe=recipe)]


# The time limit of a test marked slow (pyproject's `timeout` is the others'): end-to-end
# runs of the CLI take minutes on a loaded 2-core machine, and a hang must still fail.
SLOW_TIMEOUT = 1200


def pytest_collection_modifyitems(config, items):
    """Tests marked slow get SLOW_TIMEOUT; the modules that have any run first (each module
    still in one piece, in file order within each group), so that a run on xdist's workers
    ends on short tests that even out the workers, not on a minute-long one started last."""
    heavy = set()
    for item in items:
        if item.get_closest_marker("slow"):
            heavy.add(item.nodeid.partition("::")[0])
            if not item.get_closest_marker("timeout"):
                item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))
    items.sort(key=lambda item: item.nodeid.partition("::")[0] not in heavy)


def tiny_model(arch: str = "gru") -> dict:
    return {**TINY_MODEL, "arch": arch, **({"d_state": 8} if arch == "s4d" else {})}


def fitting(items: list[str], recipe: Path | dict | None = None) -> list[str]:
    """`items` (TINY and a test's own) less TINY's options that the kinds of `recipe` (a
    path or a dict; None: the default reverse GRU) with `items` applied do not have."""
    from perencode.config.recipe import apply_overrides, foreign_options, read_toml

    data = read_toml(recipe) if isinstance(recipe, Path) else dict(recipe or {})
    foreign = set(foreign_options(apply_overrides(data, items)))
    return [item for item in items if item not in TINY or item.partition("=")[0] not in foreign]


def tiny_overrides(*extra: str, recipe: Path | dict | None = None) -> list[str]:
    out = []
    for item in fitting([*TINY, *extra], recipe):
        out += ["--set", item]
    return out


def assert_scores_consistent(result: dict) -> None:
    """Invariants of an eval.json whatever the model learnt: accuracies are counts over
    n_tokens / n_sequences, and the mean DL distance lies between the share of sequences
    with a mistake (each costs at least one edit) and the mean number of wrong tokens (one
    substitution each is enough)."""
    n = result["n_sequences"]
    tokens = result.get("n_tokens", n)
    for key, count in (("token_accuracy", tokens), ("sequence_accuracy", n),
                       ("accuracy", n), ("target_accuracy", n)):
        if key in result:
            hits = result[key] * count
            assert abs(hits - round(hits)) < 1e-6, (key, result[key], count)
    if "dl_distance" in result:
        wrong_sequences = 1 - result["sequence_accuracy"]
        wrong_tokens_per_sequence = (1 - result["token_accuracy"]) * tokens / n
        assert wrong_sequences - 1e-9 <= result["dl_distance"] <= wrong_tokens_per_sequence + 1e-9


def flat(text: str) -> str:
    """Console output without the line breaks a narrow terminal puts in."""
    return " ".join(text.split())


def one_line(code: int, text: str) -> str:
    """The one line of a refused command (exit 2, `error: ...`, no traceback), flattened."""
    lines = text.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), text
    assert "Traceback" not in text
    return flat(lines[0])


def run_cli(*args) -> tuple[int, str]:
    """Run `perencode ARGS...` in-process: (exit code, output). Exceptions propagate."""
    from typer.testing import CliRunner

    from perencode.cli import app
    result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def cli():
    """`run_cli` as a fixture."""
    return run_cli


def finished_run(run_dir: Path, *sets: str, recipe: Path = RECIPE) -> Path:
    """`run_dir`, a tiny run of `recipe` trained to its end in-process (`train_args`)."""
    code, text = run_cli(*train_args(run_dir, *sets, recipe=recipe))
    assert code == 0, text
    return run_dir


def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """For a fixture to `yield from`: a tmpfs of `size` (mount's `size=`: "64k", "2m")
    mounted on `folder` for the test, unmounted after it. Skips the test where no tmpfs can
    be mounted (not root, or a container forbids it)."""
    folder.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                           capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    yield folder
    subprocess.run(["umount", str(folder)], check=True)


def spawned_children(pid: int) -> list[int]:
    """The processes multiprocessing spawned from `pid` to run a function (not its resource
    tracker, which ends by itself once its parent has gone)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"spawn_main" in command:
            found.append(int(stat.parent.name))
    return found


def subprocess_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


PYTHON = sys.executable


@pytest.fixture(scope="module", autouse=True)
def _forked_children(request):
    """In a module marked `forked_children`, the sweep's children are forks of the test
    process (tests/forked.py) instead of new interpreters; a test of such a module that is
    about the child itself takes `real_children`."""
    if request.node.get_closest_marker("forked_children") is None:
        yield
        return
    import forked

    from perencode.commands.sweep import child, local
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local, "launch", forked.launch)
        patch.setattr(child, "launch", forked.launch)  # the SLURM job's (TrainJob)
        yield


def fork_perencode_commands(monkeypatch: pytest.MonkeyPatch, module) -> None:
    """`module`'s subprocess.run, for the `perencode` commands it starts (the doctor's train
    and bench, the sweep's --estimate benches): forks of this process (tests/forked.py), each
    still a process of its own with the environment it is given, for a test of what the module
    makes of their output; any other command is left to subprocess."""
    from types import SimpleNamespace

    import forked

    from perencode.common.processes import perencode_command
    prefix = perencode_command()

    def run(args, **kwargs):
        if list(args[:len(prefix)]) != prefix:
            return subprocess.run(args, **kwargs)
        return forked.run(args[len(prefix):], env=dict(kwargs.get("env") or os.environ),
                          cwd=kwargs.get("cwd"), timeout=kwargs.get("timeout"))

    monkeypatch.setattr(module, "subprocess", SimpleNamespace(run=run))


@pytest.fixture
def real_children(monkeypatch):
    """The sweep's children as new `perencode` processes, in a module of forked ones."""
    from perencode.commands.sweep import child, local
    monkeypatch.setattr(local, "launch", LAUNCH)
    monkeypatch.setattr(child, "launch", LAUNCH)


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """The folder `name`, made by `build(folder)` once per test session however many xdist
    workers run it: the first worker to ask builds it under a file lock while the others
    wait, then all share it. Read it as it is; a test that changes it works on a copy
    (`copy_of`)."""
    base = factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # pytest-N/popen-gwK: the run's folder, shared by its workers
    folder = base / "built-once" / name
    done = folder.with_name(f"{name}.done")
    folder.parent.mkdir(exist_ok=True)
    with FileLock(str(folder.with_name(f"{name}.lock"))):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            build(folder)
            done.touch()
    return folder


def copy_of(folder: Path, to: Path) -> Path:
    """`folder` copied to `to` (links kept as links): a built-once folder a test may change."""
    shutil.copytree(folder, to, symlinks=True)
    return to


def _doctor_on_the_cpu(folder: Path) -> None:
    env = {k: v for k, v in subprocess_env().items() if k != "COLUMNS"}
    folder.mkdir(parents=True)
    done = subprocess.run([PYTHON, "-m", "perencode", "doctor", "--device", "cpu", "--runs",
                           str(folder / "runs")], env=env, capture_output=True, text=True,
                          timeout=300)
    for name, text in (("code", str(done.returncode)), ("stdout", done.stdout),
                       ("stderr", done.stderr)):
        (folder / name).write_text(text)


@pytest.fixture(scope="session")
def doctor_on_the_cpu(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """`perencode doctor --device cpu --runs FOLDER` as a user runs it with its output piped
    (as in a log: no terminal, no COLUMNS), once per session: what it printed and FOLDER
    (tests/test_doctor.py reads its verdicts, tests/test_sweep_output.py its lines)."""
    folder = built_once(tmp_path_factory, "doctor-cpu", _doctor_on_the_cpu)
    done = subprocess.CompletedProcess(["perencode", "doctor"], int((folder / "code").read_text()),
                                       (folder / "stdout").read_text(),
                                       (folder / "stderr").read_text())
    return done, folder / "runs"


@pytest.fixture(scope="session")
def paper_like_shared(tmp_path_factory) -> Path:
    """tests/fake_runs.py's stand-in for the paper's grids, built once per session: read
    only (`paper_like` is a copy of it a module may change)."""
    from fake_runs import paper_like_runs

    return built_once(tmp_path_factory, "paper-like", paper_like_runs)


@pytest.fixture(scope="module")
def paper_like(paper_like_shared, tmp_path_factory) -> Path:
    """A module's own copy of the paper-like tree (tests/fake_runs.py)."""
    return copy_of(paper_like_shared, tmp_path_factory.mktemp("paper-like") / "runs")


def unfinish(run_dir: Path) -> None:
    """A finished run as if killed before its end: no eval.json, status.json or end time in
    env.json (a run recorded finished stays finished whatever file is missing: never
    trained again)."""
    run_dir = Path(run_dir)
    for name in ("eval.json", "status.json"):
        (run_dir / name).unlink(missing_ok=True)
    env = run_dir / "env.json"
    try:
        data = json.loads(env.read_text())
    except (OSError, ValueError):
        return
    if not isinstance(data, dict):  # a damaged env.json says nothing of an end
        return
    data.pop("end_time", None)
    env.write_text(json.dumps(data))
