"""The rich consoles for people: notes and progress on stderr (`console`), results on stdout
(`results`); machines read the files a command writes, or its --json."""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.segment import Segments

console = Console(stderr=True, soft_wrap=True)
# Results (a metrics table, the files a command wrote) go to stdout, notes and progress to
# stderr (`console`): `perencode eval RUN 2>/dev/null` prints the results alone.
results = Console(soft_wrap=True)


class GuardedStream:
    """A standard stream whose failed write ends its output, not the process.

    A long command's output is for people, and its terminal may go away while it works: a
    full disk or quota behind `2>log` (ENOSPC), a pipe closed early (`| head`: EPIPE), a
    dropped SSH session (EIO). The first failed write or flush makes one attempt at a note
    on the other standard stream, then points the stream's descriptor at /dev/null, so
    nothing written later (rich, print, a library's C code, the flush at exit) fails again.
    """

    def __init__(self, stream: TextIO, name: str, note_closed_pipe: bool = True):
        self._stream, self.name = stream, name
        self.failed: OSError | None = None
        # A pipe its reader closed (`show | head -1`): the reader has what it wanted, and
        # a command that only prints need not say so.
        self.note_closed_pipe = note_closed_pipe

    def write(self, text: str) -> int:
        if self.failed is None:
            try:
                return self._stream.write(text)
            except OSError as exc:
                self._fail(exc)
        return len(text)

    def flush(self) -> None:
        if self.failed is None:
            try:
                self._stream.flush()
            except OSError as exc:
                self._fail(exc)

    def _fail(self, exc: OSError) -> None:
        self.failed = exc
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):  # no descriptor of its own (a test's)
            pass
        if isinstance(exc, BrokenPipeError) and not self.note_closed_pipe:
            return
        other = sys.stdout if self.name == "stderr" else sys.stderr
        try:
            other.write(f"perencode: cannot write to {self.name} ({exc.strerror or exc}); "
                        "its output stops here, the command goes on\n")
            other.flush()
        except OSError:  # the other stream is not guarded: the note was the one attempt
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_output() -> None:
    """For the rest of this process, a failed write to stdout or stderr silences that
    stream instead of raising (GuardedStream): a command whose work matters more than its
    messages (train, sweep) ends with the status of its work."""
    if not isinstance(sys.stdout, GuardedStream):
        sys.stdout = GuardedStream(sys.stdout, "stdout")
    if not isinstance(sys.stderr, GuardedStream):
        sys.stderr = GuardedStream(sys.stderr, "stderr")


def guard_stdout() -> None:
    """Every command: a reader closing stdout early (`perencode show RUN | head -1`) ends
    the output quietly, and the command's exit status stays its own (not click's 1 for a
    broken pipe, nor Python's 120 for a failed flush at exit)."""
    if not isinstance(sys.stdout, GuardedStream):
        sys.stdout = GuardedStream(sys.stdout, "stdout", note_closed_pipe=False)


def print_table(table: RenderableType) -> None:
    """Print a table (of run names, say) at the console's width on a terminal, and off one (a
    log file, a pipe: rich assumes 80 columns) at the table's own width, so that no name is
    cut or folded for a width nobody reads it at."""
    if console.is_terminal:
        console.print(table)
        return
    natural = Measurement.get(console, console.options.update_width(100_000), table).maximum
    # console.print never renders wider than the console: render at the natural width first
    # (with the options console.print gives a soft-wrapping console).
    options = console.options.update(width=max(console.width, natural), no_wrap=True,
                                     overflow="ignore")
    console.print(Segments(console.render(table, options)), crop=False)


def fit_name(name: str, width: int) -> str:
    """`name` in at most `width` characters: a run name too long for its column loses its
    middle, never its last part (`vocab_size=32/…/seed=111`), so rows that differ only by
    seed stay apart in an 80-column log."""
    if len(name) <= width:
        return name
    if width < 2:
        return name[-width:] if width > 0 else ""
    head, sep, last = name.rpartition("/")
    tail = sep + last if head else name
    if len(tail) > width - 1:  # even the last part is too long: keep its end
        return "…" + name[-(width - 1):]
    return name[:width - 1 - len(tail)] + "…" + tail


# The notes said in this command: a damaged file that several steps of one command read (a
# run's state is asked for by the CLI, the memory check and the claim) is named once.
SAID: set[str] = set()


def note_once(text: str) -> None:
    """A yellow note, unless this command already said it (`SAID`; the CLI empties it
    when a command starts)."""
    if text not in SAID:
        SAID.add(text)
        console.print(f"[yellow]note:[/] {text}", highlight=False, soft_wrap=True)
