"""What a sweep is asked to do (`SweepOptions`, the options of `perencode sweep`) and the
interface its executors implement (`Executor`, as Hydra's `Launcher`): local subprocesses
(local.py) and SLURM jobs (slurm.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from perencode import defaults

if TYPE_CHECKING:
    from perencode.grid import Grid, SlurmConfig
    from perencode.sweep.board import Board
    from perencode.sweep.plan import PlannedRun


@dataclass
class SweepOptions:
    """How `run_sweep` runs a grid; each field is the `perencode sweep` option of its name."""

    executor: str = defaults.SWEEP_EXECUTOR  # a key of perencode.sweep.EXECUTORS
    jobs: int = defaults.SWEEP_JOBS          # runs at once (local)
    runs_per_gpu: int = defaults.SWEEP_RUNS_PER_GPU  # runs sharing one GPU (local)
    device: str = defaults.DEVICE
    only: list[str] = field(default_factory=list)       # KEY=V1,V2: the cells kept
    overrides: list[str] = field(default_factory=list)  # --set section.key=value
    axes: list[str] = field(default_factory=list)       # FIELD=V1,V2 over the file
    tag: str | None = None                   # the runs go to OUT/<stem>@<tag>
    slurm: dict = field(default_factory=dict)  # fields over the grid's [slurm] table
    dry_run: bool = False                    # print the plan; run nothing
    explain: bool = False                    # a dry run that shows where each value came from
    estimate: bool = False                   # time the shapes not yet measured; train nothing
    tensorboard: bool = False                # training writes TensorBoard event files too
    progress: bool = True                    # the live run table
    wait: bool = True                        # False: submit and return (SLURM)


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

    def timing(self, hours: list[float]) -> str:
        """`--dry-run`'s line on how it would run runs of these device-hours: wall time,
        jobs, time limits (perencode.cost.local_wall_hours, slurm_jobs)."""
        ...
