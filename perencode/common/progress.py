"""Progress for people and logs: a rich bar (rate, ETA) on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
import time

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from perencode.common.console import console

LINE_SECONDS = 30.0


class Reporter:
    """`with Reporter("train", total, start) as r: r.advance(n, loss=...)`.

    On a TTY: a live bar with it/s and ETA. Otherwise: a log line every `log_every` units
    and at least every LINE_SECONDS (rate and ETA included), so batch jobs leave readable
    logs and a slow one (a paper-size recipe on a CPU) is never silent for minutes.
    """

    def __init__(self, label: str, total: int, completed: int = 0, log_every: int = 100,
                 unit: str = "it", enabled: bool = True):
        self.label, self.total, self.completed = label, total, completed
        self.log_every, self.unit = max(1, log_every), unit
        self.tty = enabled and sys.stderr.isatty()
        self.enabled = enabled
        self.fields: dict[str, str] = {}
        self._start_done = completed
        self._t0 = self._last_line = time.perf_counter()
        self._progress: Progress | None = None

    def __enter__(self) -> Reporter:
        if self.tty:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
                TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console,
                transient=False)
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=self.total,
                                                 completed=self.completed, rate="", info="")
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def rate(self) -> float:
        dt = time.perf_counter() - self._t0
        return (self.completed - self._start_done) / dt if dt > 0 else 0.0

    def advance(self, n: int = 1, **fields: float | str) -> None:
        self.completed += n
        for k, v in fields.items():
            self.fields[k] = f"{v:.4g}" if isinstance(v, float) else str(v)
        if not self.enabled:
            return
        rate = self.rate()
        info = " ".join(f"{k}={v}" for k, v in self.fields.items())
        if self._progress is not None:
            self._progress.update(self._task, completed=self.completed, info=info,
                                  rate=f"{rate:.2f} {self.unit}/s")
        elif (self.completed % self.log_every == 0 or self.completed == self.total
              or time.perf_counter() - self._last_line >= LINE_SECONDS):
            self._last_line = time.perf_counter()
            eta = (self.total - self.completed) / rate if rate > 0 else float("nan")
            print(f"[{self.label}] {self.completed}/{self.total} {info} "
                  f"{rate:.2f} {self.unit}/s ETA {eta:.0f}s", file=sys.stderr, flush=True)
