"""The sweep that trains a grid's runs (`perencode sweep`).

Grid files and their cells are `perencode.grid`. Every cell runs in
`OUT/<grid file stem>/<axis>=<value>/...`, so the same grid always maps to the same
directories: finished runs are skipped, interrupted ones resume (`perencode train` does
both), and a cell whose exact recipe already has a run in another grid under OUT is linked
to that run instead of trained twice.

    plan.py    the state of each cell's run and the commands still to run
    local.py   the local executor (subprocesses, GPUs round-robin)
    slurm.py   the SLURM executor (a job array through submitit; submit and leave)
    check.py   the cells validated in a process started as the workers are (plugins)
    board.py   the live table
    cost.py    disk, FLOPs and device-hours of a grid (--dry-run, --estimate)
"""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from perencode import plugins
from perencode.console import console, print_table
from perencode.errors import UserError
from perencode.grid import SlurmConfig, explain, load_grid
from perencode.lock import hold
from perencode.sweep import slurm as slurm_executor
from perencode.sweep.board import Board, interrupted_line
from perencode.sweep.cost import measure, print_plan
from perencode.sweep.local import run_local
from perencode.sweep.plan import (
    FINISHED,
    PlannedRun,
    RunState,
    live_jobs,
    mark_queued,
    plan,
    prepare,
)
from perencode.sweep.slurm import TrainJob
from perencode.sweep.validate import validate_in_worker
from perencode.validation import validate_table

__all__ = ["PlannedRun", "RunState", "TrainJob", "plan", "run_sweep"]


def run_sweep(grid: str | Path, out: str | Path = "runs", executor: str = "local", jobs: int = 1,
              runs_per_gpu: int = 1, dry_run: bool = False, only: list[str] | None = None,
              overrides: list[str] | None = None, device: str = "auto",
              slurm: dict | None = None, progress: bool = True, wait: bool = True,
              estimate: bool = False, tensorboard: bool = False, explain: bool = False,
              axes: list[str] | None = None, tag: str | None = None) -> int:
    """Run every cell of a grid; 0 when all runs finished (or, with wait=False, were
    submitted), 1 if one failed, 130 if stopped. A dry run (or --estimate) prints the plan;
    a UserError if a cell conflicts with the run in its directory. `explain`: a dry run
    that also shows where each value of the cells came from; `axes` (FIELD=V1,V2) lie over
    the file (a recipe becomes a grid); `tag` names the sweep: its runs go to
    OUT/<stem>@<tag>."""
    if executor not in ("local", "slurm"):
        raise UserError(f"--executor '{executor}': expected local or slurm")
    g = load_grid(grid, overrides, only, axes, tag)
    for note in g.notes:
        console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    out = Path(out)
    options = validate_table(SlurmConfig, {**g.slurm.model_dump(exclude_unset=True),
                                           **(slurm or {})}, "--slurm options", "slurm")
    if not wait and (executor != "slurm" or options.cluster != "slurm"):
        raise UserError("--no-wait: only with --executor slurm on a SLURM cluster (jobs "
                        "outlive the sweep there; local runs would not)")
    if not g.cells:
        raise UserError(f"{grid}: --only leaves no cell to run")
    # The workers get this process's plugins; each cell is validated as they will.
    handed = plugins.handed_on([c.recipe for c in g.cells])
    validate_in_worker({f"{grid} [grid] {c.name}": c.recipe for c in g.cells}, handed)
    planned = plan(g, out, tensorboard)
    if estimate:
        measure(planned, out, device, jobs, handed)
    if dry_run or estimate or explain:
        print_plan(g, planned, out, device, jobs)
        if explain:
            print_origins(g)
        conflicts = [r for r in planned if r.state == RunState.CONFLICT]
        if conflicts:  # the sweep would skip these: the plan is not the grid's
            raise UserError(f"{len(conflicts)} of {len(planned)} cell(s) conflict with the run "
                            f"already in their directory under {out / g.name} (listed "
                            "above); the sweep would skip them")
        return 0
    tree = out / g.name
    tree.mkdir(parents=True, exist_ok=True)
    # One sweep per run tree: a second one (the same grid started twice, a manual rerun
    # beside a running one) exits 2 naming the first, instead of training every run twice.
    with hold(tree, f"perencode sweep {g.path}"):
        return _sweep(g, planned, out, executor, jobs, runs_per_gpu, device, options,
                      progress, wait, handed)


def print_origins(g) -> None:
    """`sweep --explain`: each field of the cells, its values and where they came from."""
    table = Table(title=f"{g.path}: where the values of its {len(g.cells)} cells come from")
    for col in ("field", "value", "from"):
        table.add_column(col, overflow="fold")
    for key, values, source in explain(g):
        table.add_row(key, escape(values), escape(source))
    console.print(table)


def _sweep(g, planned: list[PlannedRun], out: Path, executor: str, jobs: int, runs_per_gpu: int,
           device: str, options: SlurmConfig, progress: bool, wait: bool,
           handed: list[str]) -> int:
    if any(r.job for r in planned):
        mark_queued(planned)
    title = f"{g.path} -> {out / g.name} ({executor})"
    with Board(title, planned, progress) as board:
        ready = prepare([r for r in planned if r.commands or r.state == RunState.REUSE])
        board.update()
        if executor == "local":
            finished = (run_local(ready, board, jobs, runs_per_gpu, device, handed)
                        if ready else True)
        else:
            finished = _slurm(ready, planned, board, g, out, options, device, wait, handed)
        board.update()
    if not (progress and console.is_terminal):
        print_table(board.table())
    if not wait:
        pending = [r for r in planned if r.state in (RunState.SUBMITTED, RunState.QUEUED,
                                                     RunState.RUNNING)]
        console.print(f"{len(pending)} run(s) of {g.name} on SLURM; run the same command "
                      "again (without --no-wait) to wait for them and collect the results.",
                      highlight=False)
    bad = [r for r in planned if r.state not in
           (*FINISHED, *(() if wait else (RunState.SUBMITTED, RunState.QUEUED,
                                           RunState.RUNNING)))]
    if not finished:  # stopped: the runs it left are the one line below, not a list
        bad = [r for r in bad if r.state in (RunState.FAILED, RunState.DIVERGED,
                                             RunState.CONFLICT)]
    for r in bad:
        console.print(f"[bold red]{r.state}:[/] {r.dir}: {r.message}", highlight=False,
                      soft_wrap=True)
    if not finished:
        if executor == "local":  # SLURM's jobs go on: slurm.wait said so
            console.print(interrupted_line(planned), highlight=False, soft_wrap=True)
        return 130
    return 1 if bad else 0


def _slurm(ready: list[PlannedRun], planned: list[PlannedRun], board: Board, grid, out: Path,
           options: SlurmConfig, device: str, wait: bool, handed: list[str]) -> bool:
    """Submit what is ready (after the twins' jobs, where a cell is another grid's run
    still training), then wait for those and for the jobs of earlier sweeps."""
    pairs = []
    if ready:
        dependency = sorted({r.twin_job for r in ready if r.twin_job})
        if dependency:
            live = live_jobs(dependency) if options.cluster == "slurm" else {}
            dependency = [j for j in dependency if j in live]
        jobs = slurm_executor.submit(ready, grid, out, options, device, dependency, handed)
        pairs += list(zip(ready, jobs))
    if not wait:
        return True
    pairs += [(r, slurm_executor.reattach(r, out, grid)) for r in planned
              if r.state in (RunState.QUEUED, RunState.RUNNING)]
    return slurm_executor.wait(pairs, board, options)
