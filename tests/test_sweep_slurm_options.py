"""What `sweep --executor slurm` hands to SLURM, checked on the sbatch script itself: a fake
`sbatch` and `squeue` on PATH record what submitit submits (the real cluster is
tests/test_slurm.py). The `[slurm]` options reach the script (the container's `python`
first), and a sweep that submitted and left (`--no-wait`) is collected by the next one,
never submitted twice."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from test_sweep import AXES, TINY, sweep

FAKE_SBATCH = """#!/bin/sh
n=$(ls "{log}" | wc -l)
cp "$1" "{log}/sbatch-$n.sh"
echo "Submitted batch job $((4242 + n))"
"""
# Every job of the first two arrays still pending.
FAKE_SQUEUE = """#!/bin/sh
for i in 0 1 2 3 4 5 6 7; do echo "4242_$i|PENDING"; echo "4243_$i|PENDING"; done
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch) -> Path:
    bin_dir, log = tmp_path / "bin", tmp_path / "submitted"
    bin_dir.mkdir()
    log.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH.format(log=log)), ("squeue", FAKE_SQUEUE),
                       ("srun", "#!/bin/sh\nexit 1\n")):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def test_slurm_options_reach_the_sbatch_script(fake_slurm, tmp_path):
    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY + AXES + """
[slurm]
gpus_per_job = 1
python = "apptainer exec --nv --bind /scratch /images/perencode.sif python"
qos = "high"
constraint = "a100"
exclude = "node[01-02]"
setup = ["module load apptainer", "export HF_HUB_OFFLINE=1"]
additional = { reservation = "paper", mail_type = "FAIL" }
""")
    code, output = sweep(grid, "--runs", tmp_path / "runs", "--executor", "slurm", "--no-wait",
                         "--slurm", 'account="lab"', "--partition", "gpu")
    assert code == 0, output
    (script,) = fake_slurm.iterdir()
    text = script.read_text()
    assert ("apptainer exec --nv --bind /scratch /images/perencode.sif python -u -m "
            "submitit.core._submit") in text
    for line in ("#SBATCH --qos=high", "#SBATCH --constraint=a100",
                 "#SBATCH --exclude='node[01-02]'", "#SBATCH --reservation=paper",
                 "#SBATCH --mail-type=FAIL", "#SBATCH --account=lab",
                 "#SBATCH --partition=gpu", "#SBATCH --gpus-per-node=1",
                 "#SBATCH --array=0-7%8", "#SBATCH --requeue",
                 "module load apptainer", "export HF_HUB_OFFLINE=1"):
        assert line in text, line
    assert "8 run(s) of tiny on SLURM" in output


def test_no_wait_then_rerun_collects_and_never_submits_twice(fake_slurm, tmp_path):
    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY + AXES + "[slurm]\ngpus_per_job = 0\n")
    out = tmp_path / "runs"
    args = (grid, "--runs", out, "--executor", "slurm", "--no-wait")
    code, output = sweep(*args)
    assert code == 0, output
    jobs = (out / "tiny" / ".submitit" / "jobs.json").read_text()
    assert '"vocab_size=8/encoding=none/seed=111": "4242_0"' in jobs
    code, output = sweep(*args)  # squeue still lists the array: nothing to submit
    assert code == 0, output
    assert len(list(fake_slurm.iterdir())) == 1
    assert "8 queued" in output, output


def test_no_wait_needs_a_slurm_cluster(tmp_path):
    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY + AXES)
    code, output = sweep(grid, "--runs", tmp_path / "runs", "--no-wait")
    assert code == 2 and "--no-wait: only with --executor slurm" in output


def test_unknown_slurm_option_is_one_line(tmp_path):
    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY + AXES)
    code, output = sweep(grid, "--runs", tmp_path / "runs", "--executor", "slurm",
                         "--slurm", "qso=high")
    assert code == 2 and "--slurm 'qso=high': expected KEY=VALUE with KEY one of" in output
    assert len(output.strip().splitlines()) == 1


def test_no_slurm_on_this_machine_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun, sbatch or squeue
    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY + AXES + "[slurm]\ngpus_per_job = 0\n")
    code, output = sweep(grid, "--runs", tmp_path / "runs", "--executor", "slurm")
    assert code == 2 and "no SLURM here" in output and len(output.strip().splitlines()) == 1


def test_a_grid_reusing_runs_still_training_waits_for_their_jobs(fake_slurm, tmp_path):
    """Submitted together (reproduce-all on SLURM): a grid whose cells are another grid's
    runs (Fig. 5 and Fig. 3) links them and submits after their jobs, never trains twice."""
    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY + AXES + "[slurm]\ngpus_per_job = 0\n")
    twin = tmp_path / "twin.toml"
    twin.write_text('base = "tiny.toml"\n')
    out = tmp_path / "runs"
    for path in (grid, twin):
        code, output = sweep(path, "--runs", out, "--executor", "slurm", "--no-wait",
                             "--only", "seed=111")
        assert code == 0, output
    first, second = sorted(fake_slurm.iterdir())
    assert "--dependency" not in first.read_text()
    # The twin grid's cells are links to the first grid's runs, and its jobs wait for theirs.
    linked = out / "twin" / "vocab_size=8" / "encoding=none" / "seed=111"
    assert linked.is_symlink()
    assert linked.resolve() == (out / "tiny" / "vocab_size=8/encoding=none/seed=111").resolve()
    assert "#SBATCH --dependency=afterany:4242_0:4242_1:4242_2:4242_3" in second.read_text()
    # Its own jobs, still queued, are collected by a rerun, not submitted again.
    code, output = sweep(twin, "--runs", out, "--executor", "slurm", "--no-wait",
                         "--only", "seed=111")
    assert code == 0 and "4 queued" in output, output
    assert len(list(fake_slurm.iterdir())) == 2


def dry_run_script(output: str) -> list[str]:
    """The sbatch file a dry run prints (indented under its 'sbatch would get' line)."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if "sbatch would get this file" in line)
    script = []
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        script.append(line[2:])
    return script


def test_the_dry_run_prints_the_sbatch_file_the_submit_hands_to_sbatch(fake_slurm, tmp_path):
    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY + AXES + """
[slurm]
python = "apptainer exec --nv /images/perencode.sif python"
setup = ["module load apptainer"]
""")
    args = (grid, "--runs", tmp_path / "runs", "--executor", "slurm", "--partition", "gpu",
            "--time-min", "2000")
    code, output = sweep(*args, "--dry-run")
    assert code == 0, output
    shown = dry_run_script(output)
    assert not list(fake_slurm.iterdir())  # nothing submitted
    # The login node's CPU is not the jobs' device: no line about it.
    assert "device time on cpu" not in output and "device time: on" in output
    # Unset account, a limit above a day (no sinfo here): one line each; the partition is set.
    warnings = [line for line in output.splitlines() if line.startswith("warning:")]
    assert [w.split(":")[1].strip().split(" ")[0] for w in warnings] == ["no", "time"], warnings
    assert "no account" in warnings[0] and "2,000 min" in warnings[1]
    assert ("each job runs, inside `apptainer exec --nv /images/perencode.sif python`: "
            "perencode train ") in output
    code, output = sweep(*args, "--no-wait")
    assert code == 0, output
    (script,) = fake_slurm.iterdir()
    submitted = [line for line in script.read_text().splitlines() if line.strip()]
    assert shown == submitted
    assert "#SBATCH --time=2000" in shown and "#SBATCH --partition=gpu" in shown


def test_slurm_warnings_against_the_partitions_limits():
    from perencode.commands.sweep.slurm import partition_limits, slurm_minutes, warnings_for
    from perencode.config.grid import SlurmConfig

    assert [slurm_minutes(t) for t in ("1-00:00:00", "2:00:00", "30:00", "45", "2-12",
                                       "infinite", "UNLIMITED", "7-00:00:00")] == \
        [1440, 120, 30, 45, 3600, None, None, 10080]
    sinfo = "gpu 2-00:00:00\ncpu* 4:00:00\ndebug 30:00\nlong infinite\n"
    limits = partition_limits(lambda args: sinfo)
    assert limits == {"gpu": 2880, "*": 240, "*name": "cpu", "cpu": 240, "debug": 30,
                      "long": None}
    said = warnings_for(SlurmConfig(partition="debug", account="lab", time_min=60), limits)
    assert said == ["warning: time limit 60 min is above partition debug's 30 min (sinfo): "
                    "sbatch refuses it; --time-min 30"]
    assert warnings_for(SlurmConfig(partition="gpu", account="lab", time_min=2880), limits) == []
    assert warnings_for(SlurmConfig(partition="long", account="lab", time_min=99999), limits) == []
    said = warnings_for(SlurmConfig(time_min=300), limits)
    assert len(said) == 3 and "default partition (cpu)" in said[0]
    assert "no account" in said[1] and "above partition default's 240 min" in said[2]
    assert warnings_for(SlurmConfig(cluster="local"), {}) == []  # submitit's local executor
    # No sinfo: a day passes with a note to check it, more is one warning.
    [note] = warnings_for(SlurmConfig(partition="gpu", account="lab"), {})
    assert not note.startswith("warning") and "sinfo" in note
    [warning] = warnings_for(SlurmConfig(partition="gpu", account="lab", time_min=2880), {})
    assert warning.startswith("warning: time limit 2,880 min is above a day")
