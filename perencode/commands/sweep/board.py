"""The sweep's live board: a table on a terminal, plain log lines otherwise."""

from __future__ import annotations

import sys
import time
from collections import Counter

from rich.live import Live
from rich.table import Table
from rich.text import Text

from perencode.commands.sweep.cells import PlannedRun, RunState
from perencode.common.console import console, fit_name

STYLE = {RunState.DONE: "green", RunState.FAILED: "bold red", RunState.CONFLICT: "bold red",
         RunState.RUNNING: "cyan", RunState.REUSE: "green", RunState.DIVERGED: "bold red"}
# Left out of the live view of a big grid.
QUIET = (RunState.DONE, RunState.REUSE, RunState.NEW, RunState.PARTIAL)
# Off a terminal, a line of the sweep's time and ETA at least this often, even with
# --no-progress: a log under nohup is never silent for minutes.
SUMMARY_SECONDS = 30.0


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = round(seconds)  # not int(): t0 + 5 - t0 can be 4.999...
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s"


class Board:
    """A live table on a terminal; plain log lines (state changes, a summary every 30 s;
    with --no-progress the summary's first line only)."""

    def __init__(self, title: str, all_runs: list[PlannedRun], enabled: bool):
        self.title, self.runs = title, all_runs
        self.live = Live(console=console, auto_refresh=False) \
            if enabled and console.is_terminal else None
        self.enabled = enabled
        self._seen = {id(r): r.state for r in all_runs}
        self._last_summary = self._t0 = time.monotonic()
        self._start_steps = sum(r.step for r in all_runs)

    def overall(self, now: float | None = None) -> str:
        """'elapsed 2m03s, ETA 5m10s': the sweep's time so far, and the iterations left (of
        runs not finished, failed or linked) at the rate of iterations done since it began."""
        elapsed = (time.monotonic() if now is None else now) - self._t0
        done = sum(r.step for r in self.runs) - self._start_steps
        left = sum(max(0, r.iterations - r.step) for r in self.runs if r.state not in
                   (RunState.DONE, RunState.REUSE, RunState.FAILED, RunState.CONFLICT))
        if not left:
            eta = "0m00s"
        elif done > 0 and elapsed > 0:
            eta = duration(left * elapsed / done)
        else:
            eta = "unknown until a run logs its first steps"
        return f"elapsed {duration(elapsed)}, ETA {eta}"

    def table(self, every_run: bool = True) -> Table:
        """All runs, or (a live view of a big grid) those not yet finished or waiting."""
        shown = [r for r in self.runs if every_run or r.state not in QUIET]
        counts = Counter(str(r.state) for r in self.runs)
        table = Table(title=self.title, caption=", ".join(f"{n} {state}" for state, n in
                                                          sorted(counts.items()))
                      + f"; {self.overall()}")
        for col in ("run", "state", "step", "train acc", "ETA"):
            table.add_column(col, justify="left" if col in ("run", "state") else "right",
                             no_wrap=True)
        # What the other columns leave of the terminal's width; off a terminal (a log file, a
        # pipe) every name whole (console.print_table prints the table as wide as it is).
        width = max(24, console.width - 52) if console.is_terminal else None
        for r in shown:
            state = str(r.state) + (f" (gpu {r.gpu})" if r.gpu is not None and r.proc else "")
            acc = f"{r.accuracy:.3f}" if r.accuracy is not None else ""
            eta = duration(r.eta_s) if r.state == RunState.RUNNING else ""
            name = r.cell.name if width is None else fit_name(r.cell.name, width)
            table.add_row(name, Text(state, style=STYLE.get(r.state, "")),
                          f"{r.step}/{r.iterations}", acc, eta)
        return table

    def __enter__(self) -> Board:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()

    def update(self) -> None:
        if self.live is not None:
            fits = len(self.runs) + 8 <= console.height
            self.live.update(self.table(every_run=fits), refresh=True)
            return
        if not self.enabled:
            if not console.is_terminal and time.monotonic() - self._last_summary >= \
                    SUMMARY_SECONDS:
                self._last_summary = time.monotonic()
                print(f"[sweep] {self.overall()}", file=sys.stderr, flush=True)
            return
        for r in self.runs:
            if self._seen[id(r)] != r.state:
                self._seen[id(r)] = r.state
                note = f" - {r.message}" if r.message else ""
                print(f"[sweep] {r.cell.name}: {r.state}{note}", file=sys.stderr, flush=True)
        if time.monotonic() - self._last_summary >= SUMMARY_SECONDS:
            self._last_summary = time.monotonic()
            print(f"[sweep] {self.overall()}", file=sys.stderr, flush=True)
            for r in self.runs:
                if r.state == RunState.RUNNING:
                    acc = f" acc {r.accuracy:.3f}" if r.accuracy is not None else ""
                    print(f"[sweep] {r.cell.name}: step {r.step}/{r.iterations}{acc} ETA "
                          f"{duration(r.eta_s)}", file=sys.stderr, flush=True)


def interrupted_line(runs: list[PlannedRun]) -> str:
    """The one line a stopped sweep ends with: what it stopped, what it never began, how to
    go on."""
    stopped = [r for r in runs if r.state == RunState.INTERRUPTED]
    waiting = sum(r.state in (RunState.NEW, RunState.PARTIAL) for r in runs)
    finished = sum(r.state in (RunState.DONE, RunState.REUSE) for r in runs)
    named = ", ".join(f"{r.cell.name} at iteration {r.step}" for r in stopped[:3]) + \
        (f" and {len(stopped) - 3} more" if len(stopped) > 3 else "")
    what = f"{len(stopped)} run(s) stopped with a checkpoint ({named})" if stopped else \
        "no run was training"
    return (f"interrupted: {what}; {waiting} not started; {finished} of {len(runs)} "
            "finished. Run the same command again to resume (finished runs are skipped).")
