"""What a sweep has to do: one `PlannedRun` per cell of a grid, with its state and the
`perencode` commands still to run. Planning reads run directories and writes nothing;
`prepare` then claims each run directory (or links it to its twin). A run directory itself
is perencode.store.runs.Run."""

from __future__ import annotations

import contextlib
import enum
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from perencode.common.errors import UserError
from perencode.common.files import atomic_write_json, tail_lines
from perencode.config.grid import Cell, Grid
from perencode.config.recipe import differences, run_key
from perencode.store import records, runs
from perencode.store.lock import Locked, describe, hold, live_holder


class RunState(str, enum.Enum):
    """Where a cell's run stands. Planning gives the first six (and DIVERGED); a sweep
    moves runs on."""

    NEW = "new"                  # nothing on disk yet
    PARTIAL = "partial"          # started, not finished: resumes from its last checkpoint
    DONE = "done"                # finished (eval.json, the last checkpoint)
    REUSE = "reuse"              # the same recipe has a run elsewhere under OUT: linked to it
    CONFLICT = "conflict"        # the directory holds a different recipe (reported, skipped)
    QUEUED = "queued"            # a SLURM job of an earlier sweep is still pending or running
    SUBMITTED = "submitted"      # submitted by this sweep, not yet started
    RUNNING = "running"
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # stopped by Ctrl-C / SIGTERM; the next sweep resumes it
    DIVERGED = "diverged"        # stopped on a number that is not finite: never retrained

    def __str__(self) -> str:
        return self.value


FINISHED = (RunState.DONE, RunState.REUSE)


@dataclass
class PlannedRun:
    """A cell's run as the sweep sees it: its directory, its state and what is left to do,
    and the executor's handle on it while it trains."""

    cell: Cell
    dir: Path
    state: RunState
    step: int = 0
    message: str = ""
    accuracy: float | None = None
    eta_s: float | None = None
    twin: Path | None = None         # a run of the same recipe elsewhere under OUT
    job: str | None = None           # its SLURM job id, recorded in OUT/<grid>/.submitit
    twin_job: str | None = None      # the twin's, recorded by the twin's own grid
    commands: list[list[str]] = field(default_factory=list)  # perencode commands, no --device
    proc: Any = None                 # the local executor's subprocess.Popen
    log: Any = None
    gpu: str | None = None
    planned_at: float = field(default_factory=time.time)  # when `plan` saw the runs under OUT

    @property
    def iterations(self) -> int:
        return self.cell.recipe.train.iterations


# --------------------------------------------------------------------------------------
# Runs on disk
# --------------------------------------------------------------------------------------

def claimed_runs(out: Path, since: float | None = None) -> dict[str, Path]:
    """run_key -> directory of every run (finished or not) under `out`; with `since`, only
    the runs claimed (recipe.toml written) at or after that time."""
    found: dict[str, Path] = {}
    if not out.is_dir():
        return found
    for run_dir in runs.find_runs([out], notes=[]):  # the plan names its own cells
        try:
            if since is not None and (run_dir / "recipe.toml").stat().st_mtime < since:
                continue
            found.setdefault(run_key(runs.read_recipe(run_dir)), run_dir.resolve())
        except UserError:
            continue  # not a readable run: the sweep of its own grid reports it
    return found


def started(run_dir: Path) -> bool:
    """Training has begun: the first start's env.json, a metrics row or a checkpoint (a
    directory a sweep claimed, recipe.toml and identity.json only, has not)."""
    run = runs.Run(run_dir)
    return (run_dir / "env.json").exists() or (run_dir / "metrics.jsonl").exists() \
        or run.checkpoint_dir.exists()


def stability_done(run_dir: Path) -> bool:
    """stability.csv covers every checkpoint (the analysis resumes where it stopped)."""
    path = run_dir / "stability.csv"
    if not path.exists():
        return False
    done = set(pd.read_csv(path, usecols=["iteration"])["iteration"].unique())
    return {k for k, _ in runs.Run(run_dir).checkpoints()} <= done


def last_rows(run_dir: Path, n: int = 2) -> list[records.MetricsRow]:
    """The last `n` rows of metrics.jsonl, reading only the file's tail."""
    path = run_dir / "metrics.jsonl"
    try:
        lines = tail_lines(path, 4096)
    except FileNotFoundError:
        return []
    # The first line of the tail is usually cut; a damaged one is skipped (Run.metrics
    # names it).
    rows = [records.metrics_row(line) for line in lines]
    return [row for row in rows if isinstance(row, records.MetricsRow)][-n:]


def refresh(run: PlannedRun) -> None:
    """Step, training accuracy and ETA of a run from its metrics.jsonl."""
    rows = last_rows(run.twin or run.dir)
    if not rows:
        return
    last = rows[-1]
    run.step, run.accuracy = last.step, last.accuracy
    if len(rows) == 2 and last.seconds > rows[0].seconds:
        rate = (last.step - rows[0].step) / (last.seconds - rows[0].seconds)
        run.eta_s = (run.iterations - run.step) / rate if rate > 0 else None


def refresh_stopped(run: PlannedRun) -> None:
    """`refresh` a run whose worker stopped on a signal, its step then the iteration of the
    checkpoint it left (what it resumes from: metrics.jsonl is written only every
    train.log_every)."""
    refresh(run)
    saved = runs.Run(run.dir).saved_iteration()
    if saved is not None:
        run.step = saved


# --------------------------------------------------------------------------------------
# SLURM jobs recorded by earlier sweeps (so that a rerun collects them, not resubmits)
# --------------------------------------------------------------------------------------

def jobs_file(out: Path, grid_name: str) -> Path:
    return out / grid_name / ".submitit" / "jobs.json"


def read_jobs(out: Path, grid_name: str) -> dict[str, str]:
    """cell name -> the SLURM job id last submitted for it."""
    path = jobs_file(out, grid_name)
    if not path.exists():
        return {}
    return {k: str(v) for k, v in runs.read_json(path).items()}


def record_jobs(out: Path, grid_name: str, submitted: dict[str, str]) -> None:
    atomic_write_json(jobs_file(out, grid_name), {**read_jobs(out, grid_name), **submitted})


def live_jobs(ids: list[str]) -> dict[str, str]:
    """job id -> state (PENDING, RUNNING, ...) of those still in SLURM's queue (squeue);
    a finished job is not listed."""
    if not ids:
        return {}
    try:
        out = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"squeue: cannot list the SLURM queue ({exc}); the jobs recorded in "
                        ".submitit/jobs.json cannot be checked") from None
    if out.returncode != 0:
        raise UserError(f"squeue: {out.stderr.strip() or 'failed'}")
    queue = dict(line.split("|", 1) for line in out.stdout.splitlines() if "|" in line)
    return {i: queue[i] for i in ids if i in queue}


def twin_job(out: Path, twin: Path) -> str | None:
    """The SLURM job recorded for the run at `twin` by its own grid's sweep."""
    try:
        grid_name, *cell = Path(os.path.relpath(twin, out.resolve())).parts
    except ValueError:
        return None
    return read_jobs(out, grid_name).get("/".join(cell)) if cell else None


# --------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------

def plan(grid: Grid, out: Path, tensorboard: bool = False) -> list[PlannedRun]:
    """One PlannedRun per cell with its state and the commands still to run (nothing is written).

    A cell whose recipe already has a run elsewhere under `out` (finished or not: another
    grid made it, e.g. Fig. 5's cells are Fig. 3's runs) is linked to it; an unfinished twin
    is trained on through the link, which resumes it. `tensorboard`: training also writes
    TensorBoard event files."""
    claimed = None
    recorded = read_jobs(out, grid.name)
    planned = []
    for cell in grid.cells:
        run_dir = out / grid.name / cell.name
        run = PlannedRun(cell, run_dir, RunState.NEW, job=recorded.get(cell.name))
        planned.append(run)
        if run_dir.is_symlink() and not run_dir.exists():  # prepare replaces the link
            run.message = (f"a link to {os.readlink(run_dir)}, which does not exist (its run "
                           "was moved or deleted): the cell is trained anew")
        if run_dir.is_symlink() or not (run_dir / "recipe.toml").exists():
            claimed = claimed_runs(out) if claimed is None else claimed
            run.twin = claimed.get(run_key(cell.recipe))
        if run.twin is not None:
            run.state = RunState.REUSE
            run.message = f"same recipe as {run.twin}" + (
                f"; replaces {run.message}" if run.message else "")
            run.twin_job = twin_job(out, run.twin)
        elif (run_dir / "recipe.toml").exists():
            conflict = _conflict(run_dir, cell.recipe)
            if conflict:
                run.state, run.message = RunState.CONFLICT, conflict
                continue
            run.state = RunState.PARTIAL
        status = runs.Run(run.twin or run_dir).status() \
            if run.state in (RunState.PARTIAL, RunState.REUSE) \
            else records.StatusRecord(state=runs.UNFINISHED)
        if status.state == runs.FINISHED and run.state == RunState.PARTIAL:
            run.state = RunState.DONE
        if status.state == runs.FINISHED and status.missing:  # never retrained
            run.message = ("; ".join(filter(None, [run.message, f"finished, but its "
                           f"{status.missing} is missing: not trained again; "
                           f"{runs.Run(run.twin or run_dir).restore_hint()}"])))
        elif status.state == runs.DIVERGED:
            said = (f"diverged at iteration {status.iteration} "
                    f"({status.reason}); not trained again")
            if run.state == RunState.PARTIAL:
                run.state, run.message = RunState.DIVERGED, said
            else:
                run.message = f"{run.message}; {said}"
            continue
        if run.state == RunState.PARTIAL and not started(run_dir):
            run.state = RunState.NEW  # claimed by a sweep that stopped before training it
        refresh(run)
        trained = status.state == runs.FINISHED
        if not trained:
            run.commands.append(["train", str(run_dir / "recipe.toml"), "--run-dir", str(run_dir),
                                 *(["--tensorboard"] if tensorboard else [])])
        if "stability" in grid.sweep.after and not (trained and stability_done(run.twin or
                                                                               run_dir)):
            run.commands.append(["stability", str(run_dir)])
    return planned


def _conflict(run_dir: Path, recipe) -> str | None:
    """Why the run in `run_dir` is not this cell's (the fields that differ, as `train` names
    them for its --run-dir), or None when it is."""
    try:
        diff = differences(runs.read_recipe(run_dir).identity(), recipe.identity(),
                           names=("there", "in the grid"))
    except UserError as exc:  # the report names run_dir before the message
        return str(exc).removeprefix(f"{run_dir}: ")
    if not diff:
        return None
    more = f"; {len(diff) - 2} more" if len(diff) > 2 else ""
    return (f"holds a run of a different recipe ({'; '.join(diff[:2])}{more}); move it away "
            "or sweep into another --runs")


def mark_queued(planned: list[PlannedRun]) -> None:
    """Runs whose SLURM job (of an earlier sweep) is still queued or running: nothing to
    submit, only to wait for."""
    waiting = [r for r in planned if r.job and r.commands]
    live = live_jobs(sorted({r.job for r in waiting if r.job}))
    for run in waiting:
        if run.job in live:
            state = live[run.job]
            run.state = RunState.RUNNING if state == "RUNNING" else RunState.QUEUED
            run.message = f"job {run.job} ({state.lower()}), submitted by an earlier sweep"
            run.commands = []


def claim(run: PlannedRun) -> bool:
    """Claim a new or partial run's directory (writes recipe.toml, and sweep.json: the sweep
    that made it); False, the run FAILED with the reason, when it is refused."""
    try:
        if run.state in (RunState.NEW, RunState.PARTIAL):
            runs.Run(run.dir).claim(run.cell.recipe)
            if run.cell.record:
                runs.record_sweep(run.dir, run.cell.record)
    except (UserError, OSError) as exc:
        run.state, run.message = RunState.FAILED, str(exc)
        return False
    return True


# How long a cell's start waits for another sweep's claim under the same OUT (a few
# milliseconds each), and how much older than the plan a run claimed since may look (the
# clocks of a shared filesystem's server and of this host may differ).
CLAIM_WAIT_SECONDS, CLOCK_SKEW_SECONDS = 60.0, 60.0


@contextlib.contextmanager
def _claiming(out: Path) -> Iterator[None]:
    """OUT's own lock (perencode.store.lock), held while a cell is matched and claimed: of
    two sweeps starting cells of the same recipe, one claims it and the other sees the
    claim. Another sweep's claim lasts milliseconds: waited for."""
    deadline = time.monotonic() + CLAIM_WAIT_SECONDS
    while True:
        try:
            with hold(out, "perencode sweep: claiming a cell"):
                yield
            return
        except Locked:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def claim_at_start(run: PlannedRun, out: Path) -> bool:
    """`claim` for an executor that claims each cell as it starts it (a local sweep). A new
    cell whose recipe another sweep claimed under `out` after this sweep planned (two
    sweeps of overlapping grids started together) is linked to that run instead, as `plan`
    links one claimed before (RunState.REUSE): the recipe is trained once, and `twin_busy`
    says while this sweep waits for it. The match and the claim hold `out`'s lock. False:
    the run FAILED, with the reason."""
    if run.state != RunState.NEW or run.dir.is_symlink() or run.dir.exists():
        return claim(run)
    try:
        with _claiming(out):
            twin = claimed_runs(out, run.planned_at - CLOCK_SKEW_SECONDS).get(
                run_key(run.cell.recipe))
            if twin is None or twin == run.dir.resolve():
                return claim(run)
            run.dir.parent.mkdir(parents=True, exist_ok=True)
            run.dir.symlink_to(os.path.relpath(twin, run.dir.parent), target_is_directory=True)
    except (UserError, OSError) as exc:
        run.state, run.message = RunState.FAILED, str(exc)
        return False
    run.state, run.twin = RunState.REUSE, twin
    run.message = f"same recipe as {twin}, which another sweep claimed after this one planned"
    run.twin_job = twin_job(out, twin)
    return True


def twin_busy(run: PlannedRun, out: Path) -> str | None:
    """Who is training the run a cell is linked to, or is about to (`describe`d): its
    trainer, or the live sweep that claimed it and has not started it yet (that sweep holds
    its run tree, OUT/<grid>). None: nobody, the link may go on (it resumes the run, or
    finds it complete)."""
    if run.twin is None:
        return None
    holder = live_holder(run.twin)
    if holder is None and not started(run.twin):
        try:
            tree = Path(os.path.relpath(run.twin, out.resolve())).parts[0]
        except (ValueError, IndexError):
            return None
        holder = live_holder(out / tree) if tree != ".." else None
    return describe(holder) if holder is not None else None


def prepare(todo: list[PlannedRun], claim_now: bool = True) -> list[PlannedRun]:
    """Link each run directory to its twin, and claim the others (`claim`) unless the
    executor claims each as it starts it (`claim_now` False: a sweep stopped early leaves
    the cells it never started free); the runs that still have commands to run."""
    ready = []
    for run in todo:
        try:
            if run.dir.is_symlink() and not run.dir.exists():
                run.dir.unlink()  # a link to a run that is gone (the plan said so)
            if run.state == RunState.REUSE and run.twin and not run.dir.is_symlink():
                run.dir.parent.mkdir(parents=True, exist_ok=True)
                run.dir.symlink_to(os.path.relpath(run.twin, run.dir.parent),
                                   target_is_directory=True)
        except (UserError, OSError) as exc:
            run.state, run.message = RunState.FAILED, str(exc)
            continue
        if claim_now and not claim(run):
            continue
        if run.commands:
            ready.append(run)
    return ready
