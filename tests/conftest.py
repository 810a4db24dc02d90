"""Shared test helpers: the repository root, the tiny overrides, the in-process CLI."""

import functools
import os
import sys
from pathlib import Path

# The suite tests the package's own kinds, isolated from plugins installed beside it (the
# example's `pip install examples/perencode-minrnn`) or named by the user's environment;
# a test of plugins opts in (tests/test_plugins.py). Set before any registry is used, and
# inherited by every process a test starts.
os.environ["PERENCODE_DISABLE_PLUGIN_AUTOLOAD"] = "1"
os.environ.pop("PERENCODE_PLUGINS", None)

import pytest
import torch
import typer.main
import typer.testing
from fake_runs import paper_like_runs
from typer.testing import CliRunner

from perencode.cli import app
from perencode.recipe import apply_overrides, foreign_options, read_toml

torch.set_num_threads(1)
# typer's CliRunner builds the click command from the app's function signatures on every
# invoke (about 10 ms a call, seconds over the suite); the app does not change in a test
# run, so it is built once.
typer.testing._get_command = functools.lru_cache(maxsize=None)(typer.main.get_command)
ROOT = Path(__file__).resolve().parents[1]

# The one tiny configuration of the tests: small enough to train in a second or two on one
# CPU core. `tiny_model(arch)` is the [model] table of a tiny recipe dict, TINY the `--set`
# overrides of a tiny run through the CLI (a test adds what its own case needs); an option
# of some kinds only (the S4D's state, a held-out count) is left out where the recipe's
# kinds do not have it (`fitting`).
TINY_MODEL = {"hidden_size": 16, "embed_size": 16}
TINY = [*(f"model.{key}={value}" for key, value in TINY_MODEL.items()), "model.d_state=8",
        "train.batch_size=8", "task.held_out=32", "train.log_every=5"]


# The time limit of a test marked slow (pyproject's `timeout` is the others'): end-to-end
# runs of the CLI take minutes on a loaded 2-core machine, and a hang must still fail.
SLOW_TIMEOUT = 1200


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT))


def tiny_model(arch: str = "gru") -> dict:
    return {**TINY_MODEL, "arch": arch, **({"d_state": 8} if arch == "s4d" else {})}


def fitting(items: list[str], recipe: Path | dict | None = None) -> list[str]:
    """`items` (TINY and a test's own) less TINY's options that the kinds of `recipe` (a
    path or a dict; None: the default reverse GRU) with `items` applied do not have."""
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


def run_cli(*args) -> tuple[int, str]:
    """Run `perencode ARGS...` in-process: (exit code, output). Exceptions propagate."""
    result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def cli():
    """`run_cli` as a fixture."""
    return run_cli


def subprocess_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


PYTHON = sys.executable


@pytest.fixture(scope="module")
def paper_like(tmp_path_factory) -> Path:
    """tests/fake_runs.py's stand-in for the paper's grids, built once per module."""
    return paper_like_runs(tmp_path_factory.mktemp("runs"))
