"""The Makefile's reviewer path, read with `make -n` (nothing runs): reproduce-all's order
on SLURM, the rehearsal's use of it, and the pinned install of the paper's torch."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")
GRIDS = sorted(p.stem for p in (ROOT / "recipes" / "paper").glob("*.toml"))


def dry(*args: str) -> list[str]:
    out = subprocess.run(["make", "-n", "--no-print-directory", *args, "PERENCODE=perencode",
                          "PERENCODE_DEPS="], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    return [line for line in re.split(r";|\n", out) if "perencode" in line]


def sweeps(lines: list[str]) -> list[tuple[str, bool]]:
    """(grid, --no-wait?) of each `perencode sweep` in order."""
    found = []
    for line in lines:
        m = re.search(r"perencode sweep recipes/paper/(\w+)\.toml", line)
        if m:
            found.append((m.group(1), "--no-wait" in line))
    return found


def test_reproduce_all_on_slurm_submits_every_grid_before_waiting_for_any():
    order = sweeps(dry("reproduce-all", "EXECUTOR=slurm"))
    assert order == [(g, True) for g in GRIDS] + [(g, False) for g in GRIDS]
    submit_only = sweeps(dry("reproduce-all", "EXECUTOR=slurm", "SUBMIT_ONLY=1"))
    assert submit_only[:len(GRIDS)] == [(g, True) for g in GRIDS]


def test_reproduce_all_locally_runs_each_grid_once_then_figures_and_verify():
    lines = dry("reproduce-all")
    assert sweeps(lines) == [(g, False) for g in GRIDS]
    tail = [line.strip() for line in lines if "perencode figures" in line or
            "perencode verify" in line]
    assert tail[0].startswith("perencode figures") and tail[1].startswith("perencode verify")
    assert "--claims" not in tail[1]  # the bundled claims: found in any install
    assert any("lm-prepare --out data/wikitext103" in line for line in lines)


def test_per_grid_arguments_reach_only_their_grid():
    lines = dry("reproduce-all", "SWEEP_ARGS_fig10_lstm_predecessor=--only vocab_size=512")
    with_arg = [s for s in lines if "--only vocab_size=512" in s]
    assert len(with_arg) == 1 and "fig10_lstm_predecessor.toml" in with_arg[0]
    lm = [s for s in lines if "fig15_table1_lstm_wikitext103.toml" in s]
    assert "task.data=\"data/wikitext103\"" in lm[0]


def install_lines(*args: str) -> str:
    return subprocess.run(["make", "-n", "--no-print-directory", "install", "VENV=/nowhere",
                           *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout


def test_install_of_the_papers_torch_takes_the_constraints_and_a_stamp_of_its_own():
    pinned = install_lines("TORCH=torch==2.1.1")
    assert '--constraint constraints/py310-torch2.1.1.txt "torch==2.1.1"' in pinned
    assert "--constraint constraints/py310-torch2.1.1.txt -e \".[dev,hf]\"" in pinned
    assert "touch /nowhere/.installed-torch2.1.1" in pinned
    default = install_lines()
    assert "--constraint" not in default and "touch /nowhere/.installed-torch2.13.0" in default


def test_device_check_runs_the_script_with_its_budget():
    out = subprocess.run(["make", "-n", "--no-print-directory", "device-check", "PY=python3",
                          "PERENCODE_DEPS=", "DEVICE_CHECK_BUDGET=300"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert " ".join(out.replace("\\\n", " ").split()) == \
        "python3 tools/device_check.py device-check --budget 300 --device auto"


def device_check(*args: str) -> subprocess.CompletedProcess:
    import sys

    from conftest import subprocess_env
    return subprocess.run([sys.executable, str(ROOT / "tools" / "device_check.py"), *args],
                          capture_output=True, text=True, env=subprocess_env(), timeout=600)


@pytest.mark.slow
@pytest.mark.compat
def test_device_check_lists_its_steps_within_eight_minutes():
    done = device_check("--dry-run", "--device", "cpu")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    steps = [line.split()[0] for line in lines[:-1]]
    assert steps == ["env", "syncs", "resume", "speed", "tf32", "memory", "share", "doctor"]
    assert lines[-1] == "budget 450 s on cpu" and 450 < 8 * 60
    skipped = [line.split()[0] for line in lines if "skipped: no CUDA device" in line]
    assert skipped == ["tf32", "share", "doctor"]


@pytest.mark.slow  # about 30 s of CPU: every step at tiny shapes
def test_device_check_runs_on_the_cpu_with_its_gpu_rows_skipped(tmp_path):
    import json

    done = device_check(str(tmp_path), "--device", "cpu", "--budget", "300")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads((tmp_path / "device-check.json").read_text())
    assert result["env"]["gpu_model"] is None and result["env"]["torch"]
    assert result["syncs"]["step_devices_after_resume"] == ["cpu"]
    assert all(v["bit_identical"] for v in result["resume"].values() if isinstance(v, dict))
    assert result["speed"]["gru_vocab256.toml"]["ms_free"] > 0
    assert "ratio_to_bare" in result["speed"]["gru_vocab256.toml"]
    for step in ("tf32", "share", "doctor"):
        assert result[step]["skipped"].startswith("no CUDA device"), result[step]
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    assert [line.split()[:2] for line in summary[:8]] == [
        [step, "ok"] for step in ("env", "syncs", "resume", "speed", "tf32", "memory",
                                  "share", "doctor")]
    assert summary[-1].startswith("total ") and summary[-1].endswith("of 300 s on cpu")
