"""What a sweep is asked to do (`SweepOptions`, the options of `perencode sweep`, each declared
here once with its flag and help) and the interface its executors implement (`Executor`, as
Hydra's `Launcher`): local subprocesses (local.py) and SLURM jobs (slurm.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Protocol

import typer

from perencode.common import defaults

if TYPE_CHECKING:
    from perencode.commands.sweep.board import Board
    from perencode.commands.sweep.cells import PlannedRun
    from perencode.config.grid import Grid, SlurmConfig

# The options of `perencode sweep`: perencode.cli's sweep command takes these aliases, and
# SweepOptions' fields are declared with them, so a field, its flag and its help are one
# record. The options the sweep shares with other commands (--set, --device, --progress,
# --runs) are perencode.cli's.
ExecutorName = Annotated[str, typer.Option(
    "--executor", help="local (subprocesses) or slurm (submitit).")]
Jobs = Annotated[int, typer.Option("--jobs", min=1, help="Runs at once (local).")]
RunsPerGpu = Annotated[int, typer.Option("--runs-per-gpu", min=1,
                                         help="Runs sharing one GPU (local).")]
Only = Annotated[list[str] | None, typer.Option(
    "--only", metavar="KEY=V1,V2", help="Keep the cells whose axis KEY takes one of these "
    "values. Repeatable.")]
Axes = Annotated[list[str] | None, typer.Option(
    "--axis", metavar="FIELD=V1,V2", help="Sweep FIELD over these values without a grid file "
    "(a recipe becomes a grid); over a grid file, adds the axis or replaces its values. "
    "Repeatable; tied: a.b+c.d=[1,2],[3,4].")]
Tag = Annotated[str | None, typer.Option(
    "--tag", help="Name this sweep: its runs go to RUNS/<grid>@TAG (a second variant of the "
    "same grid) and record the tag, which figures and report show.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Print the plan (runs, states), disk "
                                      "and device-hours at once; run nothing.")]
Explain = Annotated[bool, typer.Option(
    "--explain", help="A dry run that also shows where each value of the cells comes from: a "
    "file (the grid or a base), a file's \\[grid] axis, --set, or the default.")]
Estimate = Annotated[bool, typer.Option(
    "--estimate", help="Time 3 iterations of each shape not yet measured on this device "
    "(cached in .estimates.json under the runs' root), then print the plan; train nothing.")]
Tensorboard = Annotated[bool, typer.Option(
    "--tensorboard", help="Training writes TensorBoard event files too (`perencode tensorboard "
    "RUNS` shows the grid's runs side by side).")]
Wait = Annotated[bool, typer.Option(
    "--wait/--no-wait", help="--no-wait (SLURM): submit and return; running the same command "
    "again collects the jobs, never submits twice.")]
# The options that fill `slurm`, over the grid's [slurm] table.
Partition = Annotated[str | None, typer.Option(
    "--partition", help="SLURM partition (overrides the grid's \\[slurm] table).")]
TimeMin = Annotated[int | None, typer.Option("--time-min", help="SLURM time limit in minutes.")]
GpusPerJob = Annotated[int | None, typer.Option("--gpus-per-job", help="SLURM GPUs per job.")]
CpusPerJob = Annotated[int | None, typer.Option("--cpus-per-job", help="SLURM CPUs per job.")]
SlurmFields = Annotated[list[str] | None, typer.Option(
    "--slurm", metavar="KEY=VALUE", help="Any field of the grid's \\[slurm] table (value as a "
    "TOML literal), e.g. --slurm 'python=\"apptainer exec --nv perencode.sif python\"' --slurm "
    "'qos=\"high\"'. Repeatable; docs/slurm.md lists the fields.")]


@dataclass
class SweepOptions:
    """How `run_sweep` runs a grid; each field is the `perencode sweep` option of its name."""

    executor: ExecutorName = defaults.SWEEP_EXECUTOR  # a key of commands.sweep.run.EXECUTORS
    jobs: Jobs = defaults.SWEEP_JOBS
    runs_per_gpu: RunsPerGpu = defaults.SWEEP_RUNS_PER_GPU
    device: str = defaults.DEVICE
    only: list[str] = field(default_factory=list)       # Only: KEY=V1,V2, the cells kept
    overrides: list[str] = field(default_factory=list)  # --set section.key=value
    axes: list[str] = field(default_factory=list)       # Axes: FIELD=V1,V2 over the file
    tag: Tag = None
    slurm: dict = field(default_factory=dict)  # Partition ... SlurmFields, over [slurm]
    dry_run: DryRun = False
    explain: Explain = False
    estimate: Estimate = False
    tensorboard: Tensorboard = False
    progress: bool = True                    # the live run table
    wait: Wait = True


class Executor(Protocol):
    """Trains a sweep's ready runs and follows them on its board until they ended."""

    name: str        # as --executor names it
    detaches: bool   # its runs outlive the sweep, so it may submit and leave (--no-wait)
    claims_at_start: bool  # claims each run directory as it starts the run (else all at once)

    def __init__(self, options: SweepOptions, grid: Grid, out: Path,
                 slurm: SlurmConfig) -> None: ...

    def run(self, ready: list[PlannedRun], planned: list[PlannedRun], board: Board,
            handed: list[str]) -> bool:
        """Train `ready`, each handed the plugins `handed`, and follow the runs of `planned`
        an earlier sweep left queued or running; False if stopped."""
        ...

    def stopped(self, planned: list[PlannedRun]) -> str | None:
        """The line that closes a stopped sweep (None: the executor has said it)."""
        ...

    def submission(self, planned: list[PlannedRun]) -> list[str]:
        """`--dry-run`'s lines on what would be handed to a scheduler (none: [])."""
        ...

    def timing(self, hours: list[float]) -> str:
        """`--dry-run`'s line on how it would run runs of these device-hours: wall time,
        jobs, time limits (perencode.training.planning.local_wall_hours, slurm_jobs)."""
        ...
