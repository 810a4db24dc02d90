"""Training survives its surroundings (issue 36): output streams that fail (a full disk
behind `2>log`, a pipe closed early, /dev/full), a hang-up (SIGHUP, a dropped SSH
session), held-out sets that fill most of the task's space, and a malformed thread count.

Real processes and real signals throughout; /dev/full stands in for a full disk (ENOSPC).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import PYTHON, ROOT, subprocess_env, tiny_overrides

from perencode import doctor, runs

RECIPE = ROOT / "recipes/gru_vocab256.toml"


def _train(out: Path, *extra: str, iterations: int = 40, progress: bool = False) -> list[str]:
    return [PYTHON, "-m", "perencode", "train", str(RECIPE), "--run-dir", str(out),
            "--device", "cpu", *([] if progress else ["--no-progress"]),
            *tiny_overrides(f"train.iterations={iterations}", "task.vocab_size=8",
                            "task.length=6", "optim.warmup=2", *extra)]


def _wait_for_training(proc: subprocess.Popen, run_dir: Path) -> None:
    t0 = time.time()
    while not (run_dir / "metrics.jsonl").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() - t0 < 60
        time.sleep(0.05)


# -- 1: output that cannot be written, hang-ups -------------------------------------------

@pytest.mark.parametrize("progress", [False, True])
def test_a_full_stderr_stops_the_messages_not_the_training(tmp_path, progress):
    out = tmp_path / "run"
    with open("/dev/full", "w") as full:
        done = subprocess.run(_train(out, progress=progress), stderr=full,
                              stdout=subprocess.PIPE, text=True, env=subprocess_env(),
                              timeout=120)
    assert done.returncode == 0, done.stdout
    assert runs.Run(out).is_complete()
    # One note on the other stream, then silence.
    assert done.stdout == ("perencode: cannot write to stderr (No space left on device); its "
                           "output stops here, the command goes on\n")


def test_a_pipe_closed_after_two_lines_leaves_the_training_running(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(_train(out, "train.log_every=1", iterations=400, progress=True),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=subprocess_env())
    assert proc.stdout is not None
    lines = [proc.stdout.readline(), proc.stdout.readline()]  # `2>&1 | head -2`
    proc.stdout.close()
    assert all(line.startswith(b"[train] ") for line in lines), lines
    assert proc.wait(timeout=120) == 0
    assert runs.Run(out).is_complete()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 400


def test_a_full_stdout_does_not_fail_a_finished_run(tmp_path):
    out = tmp_path / "run"
    with open("/dev/full", "w") as full:
        done = subprocess.run(_train(out), stdout=full, stderr=subprocess.PIPE, text=True,
                              env=subprocess_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "token_accuracy" in done.stderr  # stderr, the console, is untouched


def test_a_hang_up_checkpoints_and_exits_as_sigterm_does(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(_train(out, iterations=1_000_000), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=subprocess_env())
    _wait_for_training(proc, out)
    proc.send_signal(signal.SIGHUP)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGHUP, output
    assert (out / "checkpoints/resume.pt").exists()
    step = runs.load_checkpoint(out / "checkpoints/resume.pt")["iteration"]
    assert f"interrupted at iteration {step}; checkpoint saved to" in " ".join(output.split())


def test_under_nohup_a_hang_up_changes_nothing(tmp_path):
    out = tmp_path / "run"

    def nohup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = subprocess.Popen(_train(out, iterations=400), preexec_fn=nohup,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=subprocess_env())
    _wait_for_training(proc, out)
    proc.send_signal(signal.SIGHUP)
    _, errors = proc.communicate(timeout=120)
    assert proc.returncode == 0, errors
    assert runs.Run(out).is_complete() and not (out / "checkpoints/resume.pt").exists()


GRID = """
[task]
name = "reverse"
length = 4
vocab_size = 8
held_out = 16
[model]
hidden_size = 16
embed_size = 8
[optim]
warmup = 2
[train]
iterations = {iterations}
batch_size = 8
checkpoint_every = {iterations}
log_every = 10
eval_batch_size = 16
[grid]
"train.seed" = [1]
"""


def _sweep(grid: Path, runs_dir: Path) -> list[str]:
    return [PYTHON, "-m", "perencode", "sweep", str(grid), "--runs", str(runs_dir), "--jobs",
            "1", "--device", "cpu"]


def test_a_hang_up_stops_a_sweep_and_its_worker_with_a_checkpoint(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(GRID.format(iterations=1_000_000))
    cell = tmp_path / "runs/g/seed=1"
    # Its own session: the hang-up reaches the sweep and its worker, as a terminal's does.
    sweep = subprocess.Popen(_sweep(grid, tmp_path / "runs"), start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=subprocess_env())
    _wait_for_training(sweep, cell)
    os.killpg(sweep.pid, signal.SIGHUP)
    output, _ = sweep.communicate(timeout=60)
    assert sweep.returncode == 130, output
    assert (cell / "checkpoints/resume.pt").exists()
    log = (cell / "train.log").read_text()
    assert "interrupted at iteration" in " ".join(log.split())
    assert "interrupted" in output and "Traceback" not in output


def test_a_sweep_whose_board_cannot_be_written_finishes_its_runs(tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text(GRID.format(iterations=20))
    with open("/dev/full", "w") as full:
        done = subprocess.run(_sweep(grid, tmp_path / "runs"), stderr=full,
                              stdout=subprocess.PIPE, text=True, env=subprocess_env(),
                              timeout=120)
    assert done.returncode == 0, done.stdout
    assert runs.Run(tmp_path / "runs/g/seed=1").is_complete()
    assert done.stdout.startswith("perencode: cannot write to stderr (No space left")


# -- 9: doctor and a malformed thread count -----------------------------------------------

@pytest.mark.parametrize("value, verdict", [("garbage", doctor.FAIL), ("0", doctor.FAIL),
                                            ("4,2", doctor.PASS), ("1", doctor.PASS),
                                            ("", doctor.FAIL)])
def test_doctor_reports_a_malformed_omp_num_threads(monkeypatch, value, verdict):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    [row] = [r for r in doctor.stack_checks(torch.device("cpu")) if r.name == "OMP_NUM_THREADS"]
    assert row.verdict == verdict
    if verdict == doctor.FAIL:
        assert row.measured == repr(value) and "export OMP_NUM_THREADS=N" in row.expected


def test_doctor_has_no_thread_count_row_when_it_is_unset(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert all(r.name != "OMP_NUM_THREADS" for r in doctor.stack_checks(torch.device("cpu")))
