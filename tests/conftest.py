import os
import sys
from pathlib import Path

import pytest
import torch

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


@pytest.fixture
def cli(monkeypatch):
    """Run the CLI in-process: returns (exit_code, output)."""
    from typer.testing import CliRunner

    from perencode.cli import app

    runner = CliRunner()

    def invoke(*args: str):
        result = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
        return result.exit_code, result.output

    return invoke


def subprocess_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


PYTHON = sys.executable
