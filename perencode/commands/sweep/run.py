"""`run_sweep`: a grid's cells planned, then run by an executor or their plan printed."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from perencode.commands.sweep.board import Board
from perencode.commands.sweep.cells import (
    FINISHED,
    PlannedRun,
    RunState,
    mark_queued,
    plan,
    prepare,
)
from perencode.commands.sweep.estimates import measure, print_plan
from perencode.commands.sweep.local import LocalExecutor
from perencode.commands.sweep.options import Executor, SweepOptions
from perencode.commands.sweep.slurm import SlurmExecutor
from perencode.commands.sweep.validate import validate_in_worker
from perencode.common import defaults
from perencode.common.console import console, print_table
from perencode.common.errors import UserError
from perencode.config import plugins
from perencode.config.grid import SlurmConfig, explain, load_grid
from perencode.config.validation import validate_table
from perencode.store.lock import hold

EXECUTORS: dict[str, type[Executor]] = {"local": LocalExecutor, "slurm": SlurmExecutor}


def run_sweep(grid: str | Path, out: str | Path = defaults.RUNS,
              options: SweepOptions | None = None) -> int:
    """Run every cell of a grid; 0 when all runs finished (or, with options.wait False, were
    submitted), 1 if one failed, 130 if stopped. A dry run (or estimate) prints the plan;
    a UserError if a cell conflicts with the run in its directory. `options.explain`: a dry
    run that also shows where each value of the cells came from; `options.axes`
    (FIELD=V1,V2) lie over the file (a recipe becomes a grid); `options.tag` names the
    sweep: its runs go to OUT/<stem>@<tag>."""
    o = options or SweepOptions()
    if o.executor not in EXECUTORS:
        raise UserError(f"--executor '{o.executor}': expected " + " or ".join(EXECUTORS))
    g = load_grid(grid, o.overrides, o.only, o.axes, o.tag)
    for note in g.notes:
        console.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)
    out = Path(out)
    slurm = validate_table(SlurmConfig, {**g.slurm.model_dump(exclude_unset=True), **o.slurm},
                           "--slurm options", "slurm")
    executor = EXECUTORS[o.executor](o, g, out, slurm)
    if not o.wait and not executor.detaches:
        raise UserError("--no-wait: only with --executor slurm on a SLURM cluster (jobs "
                        "outlive the sweep there; local runs would not)")
    if not g.cells:
        raise UserError(f"{grid}: --only leaves no cell to run")
    # The workers get this process's plugins; each cell is validated as they will.
    handed = plugins.handed_on([c.recipe for c in g.cells])
    validate_in_worker({f"{grid} [grid] {c.name}": c.recipe for c in g.cells}, handed)
    planned = plan(g, out, o.tensorboard)
    if o.estimate:
        measure(planned, out, o.device, o.jobs, handed)
    if o.dry_run or o.estimate or o.explain:
        print_plan(g, planned, out, o.device, o.jobs, executor)
        if o.explain:
            print_origins(g)
        conflicts = [r for r in planned if r.state == RunState.CONFLICT]
        if conflicts:  # the sweep would skip these: the plan is not the grid's
            raise UserError(f"{len(conflicts)} of {len(planned)} cell(s) conflict with the run "
                            f"already in their directory under {out / g.name} (listed "
                            f"above); the sweep would skip them; {tag_hint(g, out)}")
        return 0
    tree = out / g.name
    tree.mkdir(parents=True, exist_ok=True)
    # One sweep per run tree: a second one (the same grid started twice, a manual rerun
    # beside a running one) exits 2 naming the first, instead of training every run twice.
    with hold(tree, f"perencode sweep {g.path}"):
        return _sweep(g, planned, out, executor, o, handed)


def tag_hint(g, out: Path) -> str:
    """How to sweep beside the runs in the way: another tag (its own tree) or --runs."""
    stem = g.name.split("@", 1)[0]
    return (f"to sweep beside them, name this sweep with --tag NAME (its runs go to "
            f"{out / stem}@NAME) or give another --runs")


def print_origins(g) -> None:
    """`sweep --explain`: each field of the cells, its values and where they came from."""
    table = Table(title=f"{g.path}: where the values of its {len(g.cells)} cells come from")
    for col in ("field", "value", "from"):
        table.add_column(col, overflow="fold")
    for key, values, source in explain(g):
        table.add_row(key, escape(values), escape(source))
    console.print(table)


def _sweep(g, planned: list[PlannedRun], out: Path, executor: Executor, o: SweepOptions,
           handed: list[str]) -> int:
    if any(r.job for r in planned):
        mark_queued(planned)
    title = f"{g.path} -> {out / g.name} ({executor.name})"
    with Board(title, planned, o.progress) as board:
        ready = prepare([r for r in planned if r.commands or r.state == RunState.REUSE],
                        claim_now=not executor.claims_at_start)
        board.update()
        finished = executor.run(ready, planned, board, handed)
        board.update()
    if not (o.progress and console.is_terminal):
        print_table(board.table())
    if not o.wait:
        pending = [r for r in planned if r.state in (RunState.SUBMITTED, RunState.QUEUED,
                                                     RunState.RUNNING)]
        console.print(f"{len(pending)} run(s) of {g.name} on SLURM; run the same command "
                      "again (without --no-wait) to wait for them and collect the results.",
                      highlight=False)
    bad = [r for r in planned if r.state not in
           (*FINISHED, *(() if o.wait else (RunState.SUBMITTED, RunState.QUEUED,
                                             RunState.RUNNING)))]
    if not finished:  # stopped: the runs it left are the one line below, not a list
        bad = [r for r in bad if r.state in (RunState.FAILED, RunState.DIVERGED,
                                             RunState.CONFLICT)]
    conflicts = [r for r in bad if r.state == RunState.CONFLICT]
    for r in bad:
        if r.state != RunState.CONFLICT:
            console.print(f"[bold red]{r.state}:[/] {r.dir}: {r.message}", highlight=False,
                          soft_wrap=True)
    if conflicts:  # one line for them all: the same cause, usually a re-used tree
        first = conflicts[0]
        console.print(f"[bold red]conflict:[/] {len(conflicts)} of {len(planned)} cell(s) "
                      f"skipped, their directories under {out / g.name} hold runs of another "
                      f"recipe (first: {first.dir}: {first.message}); {tag_hint(g, out)}",
                      highlight=False, soft_wrap=True)
    if not finished:
        line = executor.stopped(planned)
        if line:
            console.print(line, highlight=False, soft_wrap=True)
        return 130
    return 1 if bad else 0
