"""`perencode sweep --executor slurm` against a real SLURM cluster (tools/slurm-cluster).

Marked `slurm`. Skipped where no cluster answers, unless PERENCODE_REQUIRE_SLURM=1 (set by
`make test-slurm`), where a missing cluster fails instead: CI cannot pass them by skipping.
The scenarios: a 2 x 2 grid as one job array with accounting; a run longer than its time
limit (signalled, checkpointed, requeued, resumed); a job cancelled with scancel and
resumed by the next sweep; a failing cell; cells of a loose plugin's kind (the jobs are
handed the plugin). Interrupted runs end bit-identical to runs
trained without interruption.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
from conftest import PYTHON, subprocess_env
from test_sweep import TINY

from perencode.store import runs

pytestmark = pytest.mark.slurm


def _cluster_state() -> str:
    if shutil.which("sinfo") is None:
        return "no sinfo on PATH"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                             timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo timed out"
    states = out.stdout.split()
    if out.returncode != 0 or not any(s.startswith(("idle", "mix", "alloc")) for s in states):
        return f"no usable node ({out.stderr.strip() or ' '.join(states) or 'none'})"
    return ""


@pytest.fixture(scope="module", autouse=True)
def cluster():
    problem = _cluster_state()
    if problem:
        message = (f"no SLURM cluster ({problem}); start one with `tools/slurm-cluster "
                   "start` and export SLURM_CONF, or run `make test-slurm`")
        if os.environ.get("PERENCODE_REQUIRE_SLURM") == "1":
            pytest.fail(message)
        pytest.skip(message)


SLURM = """
[slurm]
gpus_per_job = 0
cpus_per_job = 1
time_min = {time_min}
signal_delay_s = {signal}
poll_s = 1.0
"""


def write_grid(folder: Path, name: str, axes: str, time_min: int = 10, signal: int = 30,
               replace: dict[str, str] | None = None) -> Path:
    """TINY (test_sweep.py) with some lines replaced, a [slurm] table and the axes."""
    text = TINY
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    path = folder / f"{name}.toml"
    path.write_text(text + SLURM.format(time_min=time_min, signal=signal) + axes)
    return path


def sweep(grid: Path, out: Path, timeout: float = 600) -> tuple[int, str]:
    """`perencode sweep GRID --executor slurm` in a subprocess (as a user runs it)."""
    proc = subprocess.run([PYTHON, "-m", "perencode", "sweep", str(grid), "--runs", str(out),
                           "--executor", "slurm", "--device", "cpu", "--no-progress"],
                          capture_output=True, text=True, env=subprocess_env(),
                          timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def job_ids(out: Path, grid: str) -> list[str]:
    """Every array task submitted for a grid, from submitit's log folder."""
    folder = out / grid / ".submitit"
    return sorted({"_".join(p.name.split("_")[:2]) for p in folder.glob("*_*_log.out")})


def sacct_states(job: str) -> list[str]:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State"],
                         capture_output=True, text=True, timeout=30, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def reference(run_dir: Path, tmp_path: Path) -> Path:
    """The same recipe trained in one go by `perencode train`."""
    ref = tmp_path / f"reference-{run_dir.name}"
    subprocess.run([PYTHON, "-m", "perencode", "train", str(run_dir / "recipe.toml"),
                    "--run-dir", str(ref), "--device", "cpu", "--no-progress"],
                   env=subprocess_env(), check=True, capture_output=True, timeout=600)
    return ref


def assert_identical(run_dir: Path, ref: Path) -> None:
    final = runs.Run(run_dir).checkpoints()[-1]
    assert final[0] == runs.Run(ref).checkpoints()[-1][0]
    ours = runs.load_checkpoint(final[1])["model"]
    theirs = runs.load_checkpoint(runs.Run(ref).checkpoints()[-1][1])["model"]
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    assert json.loads((run_dir / "eval.json").read_text())["token_accuracy"] == \
        json.loads((ref / "eval.json").read_text())["token_accuracy"]


def test_grid_runs_as_one_job_array_with_accounting(tmp_path):
    grid = write_grid(tmp_path, "array", '[grid]\n"task.vocab_size" = [8, 16]\n'
                      '"train.seed" = [111, 222]\n')
    out = tmp_path / "runs"
    code, text = sweep(grid, out)
    assert code == 0, text
    cells = sorted(p.parent for p in (out / "array").glob("*/*/eval.json"))
    assert len(cells) == 4 and all(runs.Run(c).is_complete() for c in cells)
    ids = job_ids(out, "array")
    assert len(ids) == 4 and len({i.split("_")[0] for i in ids}) == 1  # one array, 4 tasks
    array = ids[0].split("_")[0]
    deadline = time.monotonic() + 60  # accounting records land shortly after the jobs end
    while (states := sacct_states(array)) != ["COMPLETED"] * 4 and time.monotonic() < deadline:
        time.sleep(1)
    assert states == ["COMPLETED"] * 4
    code, text = sweep(grid, out)  # everything finished: nothing is submitted
    assert code == 0, text
    assert job_ids(out, "array") == ids
    assert text.count("done") >= 4


def iterations_for(seconds: float, tmp_path: Path, least: int = 20) -> int:
    """Iterations of the TINY recipe that train for about `seconds` on this machine (timed
    on 2,000 of them from metrics.jsonl's clock), in thousands, at least `least` thousand."""
    probe = write_grid(tmp_path, "probe", '[grid]\n"train.seed" = [111]\n',
                       replace={"iterations = 10": "iterations = 2000",
                                "checkpoint_every = 10": "checkpoint_every = 2000",
                                "log_every = 5": "log_every = 500"})
    recipe = tmp_path / "probe-recipe.toml"
    recipe.write_text(probe.read_text().split("[slurm]")[0])
    run = tmp_path / "probe-run"
    subprocess.run([PYTHON, "-m", "perencode", "train", str(recipe), "--run-dir", str(run),
                    "--device", "cpu", "--no-progress"], env=subprocess_env(), check=True,
                   capture_output=True, timeout=300)
    rate = 2000 / runs.Run(run).metrics()[-1].seconds
    return max(least, int(rate * seconds / 1000) + 1) * 1000


def test_time_limit_signals_checkpoints_requeues_and_resumes(tmp_path):
    # About 2 minutes of training (timed on this machine) against a 2-minute limit with the
    # signal 40 s before it: SLURM may send it up to 60 s earlier, so between 20 and 80 s into
    # the job (a signal in the first seconds would find no handler yet). submitit checkpoints
    # the run and requeues the job, which resumes from checkpoints/resume.pt, maybe more than
    # once.
    n = iterations_for(120, tmp_path)
    grid = write_grid(tmp_path, "long", '[grid]\n"train.seed" = [111]\n', time_min=2,
                      signal=40, replace={"iterations = 10": f"iterations = {n}",
                                         "checkpoint_every = 10": f"checkpoint_every = {n // 2}",
                                         "log_every = 5": "log_every = 500"})
    out = tmp_path / "runs"
    holder: dict = {}
    thread = threading.Thread(target=lambda: holder.update(result=sweep(grid, out, 900)))
    thread.start()
    run_dir = out / "long" / "seed=111"
    deadline = time.monotonic() + 120
    while not (run_dir / "recipe.toml").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    ref = reference(run_dir, tmp_path)  # trains on the other core meanwhile
    thread.join()
    code, text = holder["result"]
    assert code == 0, text
    log = (run_dir / "train.log").read_text()
    assert "interrupted at iteration" in log, log[-2000:]
    submitit_logs = "".join(p.read_text() for p in (out / "long" / ".submitit").glob("*_log.*"))
    assert "this job is timed-out" in submitit_logs and "Requeued job" in submitit_logs
    assert_identical(run_dir, ref)
    steps = [row.step for row in runs.Run(run_dir).metrics()]
    assert steps == list(range(500, n + 1, 500))  # every logged step once


def test_cancelled_job_resumes_with_the_next_sweep(tmp_path):
    # About 10 s of training with a checkpoint every tenth of it: the test watches for the
    # first (a second or so in) and cancels the job at once, some 9 s before its end.
    n = iterations_for(10, tmp_path, least=2)
    grid = write_grid(tmp_path, "cancel", '[grid]\n"train.seed" = [222]\n',
                      replace={"iterations = 10": f"iterations = {n}",
                               "checkpoint_every = 10": f"checkpoint_every = {n // 10}",
                               "log_every = 5": "log_every = 500"})
    out = tmp_path / "runs"
    holder: dict = {}
    thread = threading.Thread(target=lambda: holder.update(result=sweep(grid, out)))
    thread.start()
    run_dir = out / "cancel" / "seed=222"
    deadline = time.monotonic() + 180
    while not runs.Run(run_dir).checkpoints() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert runs.Run(run_dir).checkpoints(), "the job never reached its first checkpoint"
    subprocess.run(["scancel", "--name", "perencode-cancel"], check=True, timeout=30)
    thread.join()
    code, text = holder["result"]
    assert code != 0 and "failed" in text, text
    assert not runs.Run(run_dir).is_complete()
    code, text = sweep(grid, out)  # the next sweep resumes it
    assert code == 0, text
    assert "interrupted at iteration" in (run_dir / "train.log").read_text()
    assert_identical(run_dir, reference(run_dir, tmp_path))


def test_failing_cell_is_reported_and_the_others_finish(tmp_path):
    grid = write_grid(tmp_path, "mixed", '[grid]\n"task.name" = ["lm", "reverse"]\n',
                      replace={'name = "reverse"': 'name = "reverse"\ndata = "nowhere"'})
    out = tmp_path / "runs"
    code, text = sweep(grid, out)
    assert code == 1, text
    failed = out / "mixed" / "task=lm"
    assert f"log: {failed / 'train.log'}" in text.replace("\n", "")
    assert "no manifest.json" in (failed / "train.log").read_text()
    assert runs.Run(out / "mixed" / "task=reverse").is_complete()


def test_cells_of_a_loose_plugins_kind_finish_as_jobs(tmp_path):
    """The jobs are handed the plugin the sweep was given (`--plugin`, not an exported
    variable): every cell of its kind validates and trains in its job."""
    plugin = tmp_path / "my_pe.py"
    plugin.write_text("import torch\nfrom perencode.config.registry import EncodingKind, "
                      "register_encoding\n\n\ndef ramp(positions, dim):\n    return "
                      "torch.linspace(0.0, 1.0, positions)[:, None].expand(positions, dim)"
                      ".clone()\n\n\nregister_encoding(EncodingKind(\"lin_ramp\", "
                      "label=\"Linear ramp\", table=ramp))\n")
    grid = write_grid(tmp_path, "plugged", '[grid]\n"task.vocab_size" = [8, 16]\n'
                      '"encoding.kind" = ["lin_ramp"]\n')
    out = tmp_path / "runs"
    env = {k: v for k, v in subprocess_env().items() if k != "PERENCODE_PLUGINS"}
    proc = subprocess.run([PYTHON, "-m", "perencode", "--plugin", str(plugin), "sweep",
                           str(grid), "--runs", str(out), "--executor", "slurm", "--device",
                           "cpu", "--no-progress"], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cells = sorted(p.parent for p in (out / "plugged").glob("*/*/eval.json"))
    assert len(cells) == 2 and all(runs.Run(c).is_complete() for c in cells)
    for cell in cells:
        assert json.loads((cell / "eval.json").read_text())["encoding"] == "lin_ramp"
        assert json.loads((cell / "plugins.json").read_text())["plugins"][0]["file"] == \
            str(plugin.resolve())
    array = job_ids(out, "plugged")[0].split("_")[0]
    deadline = time.monotonic() + 60
    while (states := sacct_states(array)) != ["COMPLETED"] * 2 and time.monotonic() < deadline:
        time.sleep(1)
    assert states == ["COMPLETED"] * 2


def test_the_dry_run_checks_the_time_limit_against_the_clusters_partitions(tmp_path):
    """The dry run reads this cluster's partitions (sinfo) and warns, one line each, for
    the unset partition (naming the default), the unset account and a limit above the
    default partition's; the sbatch file names the array and the limit. Nothing submitted."""
    from test_sweep import sweep as sweep_in_process

    from perencode.commands.sweep.slurm import partition_limits

    limits = partition_limits()
    assert "*name" in limits, limits  # tools/slurm-cluster has a default partition
    limit = limits["*"]
    over = (limit or 10) + 5
    grid = write_grid(tmp_path, "dry", '\n[grid]\n"train.seed" = [111, 222]\n', time_min=over)
    code, output = sweep_in_process(grid, "--runs", tmp_path / "runs", "--executor", "slurm",
                                    "--dry-run")
    assert code == 0, output
    warnings = [line for line in output.splitlines() if line.startswith("warning:")]
    assert f"default partition ({limits['*name']})" in warnings[0], warnings
    assert "no account" in warnings[1]
    if limit is not None:
        assert f"time limit {over:,} min is above partition default's {limit:,} min" \
            in warnings[2]
    assert "#SBATCH --array=0-1%" in output and f"#SBATCH --time={over}" in output
    assert not (tmp_path / "runs" / "dry" / ".submitit").exists()
