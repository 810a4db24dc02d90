"""Shared test helpers: the repository root, the tiny overrides, the in-process CLI."""

import os
import sys
from pathlib import Path

import pytest
import torch
from fake_runs import paper_like_runs
from typer.testing import CliRunner

from perencode.cli import app

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]

# Small enough to train in a second or two on one CPU core.
TINY = ["model.hidden_size=16", "model.embed_size=16", "train.batch_size=8",
        "task.held_out=32", "train.log_every=5"]


def tiny_overrides(*extra: str) -> list[str]:
    out = []
    for item in [*TINY, *extra]:
        out += ["--set", item]
    return out


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
