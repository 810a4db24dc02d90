"""Live training curves: the rows of metrics.jsonl as TensorBoard event files.

    RUN_DIR/tensorboard/events.out.tfevents.*   train/loss, train/accuracy, train/lr and
                                                train/sequences_per_second at each log step

Written only with `perencode train --tensorboard` (an option of the command, not of the
recipe: it never changes what a run is). For a run trained without it, `perencode
tensorboard` writes the same curves from its metrics.jsonl:

    RUN_DIR/tensorboard-from-metrics/events.out.tfevents.0.metrics   train/loss, train/accuracy,
                                                train/lr, held_out/* (rewritten when
                                                metrics.jsonl is newer)

The `tensorboard` package is an optional extra.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from perencode.common import defaults
from perencode.common.console import console
from perencode.common.errors import UserError
from perencode.common.files import atomic_write_bytes, remove_stale_temps
from perencode.store import runs
from perencode.store.records import HELD_OUT, MetricsRow

FOLDER = "tensorboard"
FROM_METRICS = "tensorboard-from-metrics"
CONVERTED = "events.out.tfevents.0.metrics"
STAMP = "metrics.stamp"  # the metrics.jsonl the events were made from: size, time, inode
EXTRA = "pip install 'perencode[tensorboard]'"
# The temporary file of an event file being rewritten (truncate_events): .truncating.XXXXXXXX.tmp
TRUNCATING = "truncating"


def summary_writer_class() -> type:
    """torch's SummaryWriter, or a one-line UserError naming the extra that provides it."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UserError(f"--tensorboard: the tensorboard package is not installed; "
                        f"{EXTRA}") from None
    return SummaryWriter


def event_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("events.out.tfevents.*"))


def truncate_events(folder: Path, last_step: int) -> None:
    """Drop the events after `last_step` from every event file, each file rewritten
    atomically. A resumed run redoes those steps, so afterwards every reader (TensorBoard,
    EventAccumulator, a plain loop over the records) sees each step once. Called holding
    the run's lock: a temporary file left by a killed rewrite is removed first."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    remove_stale_temps(folder, lambda name: name == TRUNCATING)
    for path in event_files(folder):
        # Records are copied as they are; a record cut by a kill ends the file.
        records = list(RawEventFileLoader(str(path)).Load())
        kept = [r for r in records if Event.FromString(r).step <= last_step]
        if len(kept) == len(records):
            continue
        data = io.BytesIO()
        writer = RecordWriter(data)
        for record in kept:
            writer.write(record)
        # No "tfevents" in the temporary file's name: TensorBoard skips it.
        atomic_write_bytes(path, data.getvalue(), temp_name=TRUNCATING)


class TensorBoardLog:
    """`with TensorBoardLog(run_dir, enabled).resumed_at(start, batch_size): log(row)`.

    Disabled, it does nothing. Enabled, it checks at construction that tensorboard is
    installed (so a missing package stops a run before it starts), and on entering removes
    the events a killed run wrote after its checkpoint, then opens a new event file.
    Each row is flushed at once: a SIGKILL loses no step the checkpoint covers.
    """

    def __init__(self, run_dir: str | Path, enabled: bool):
        self.folder = Path(run_dir) / FOLDER
        self.enabled = enabled
        # torch's SummaryWriter (imported only when enabled) and the one open while logging.
        self._writer_class: Any = summary_writer_class() if enabled else None
        self._writer: Any = None

    def resumed_at(self, start: int, batch_size: int, recipe_toml: str = "") -> TensorBoardLog:
        """Prepare to log the iterations after `start` (0: a fresh run)."""
        self._last = (start, time.perf_counter())
        self._batch_size = batch_size
        self._recipe_toml = recipe_toml
        self._start = start
        return self

    def __enter__(self) -> TensorBoardLog:
        if not self.enabled:
            return self
        fresh = not event_files(self.folder)
        if not fresh:
            truncate_events(self.folder, self._start)
        self._writer = self._writer_class(log_dir=str(self.folder))
        if fresh and self._recipe_toml:
            self._writer.add_text("recipe", "```toml\n" + self._recipe_toml + "\n```", 0)
            self._writer.flush()
        return self

    def log(self, row: MetricsRow) -> None:
        """One metrics.jsonl row (step, loss, accuracy, lr, and the held-out scores on the
        steps that have them), plus the sequences per second since the previous log step
        (or the start of this process)."""
        if self._writer is None:
            return
        step, now = row.step, time.perf_counter()
        last_step, last_time = self._last
        self._last = (step, now)
        for key in ("loss", "accuracy", "lr"):
            self._writer.add_scalar(f"train/{key}", getattr(row, key), step)
        # train.eval_every: held_out_token_accuracy, ...
        for key, value in row.held_out().items():
            self._writer.add_scalar(f"held_out/{key.removeprefix(HELD_OUT)}", value, step)
        if now > last_time and step > last_step:
            rate = (step - last_step) * self._batch_size / (now - last_time)
            self._writer.add_scalar("train/sequences_per_second", rate, step)
        self._writer.flush()

    def __exit__(self, *exc) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def events_from_metrics(run_dir: Path) -> Path | None:
    """RUN_DIR/tensorboard-from-metrics holding the curves of RUN_DIR/metrics.jsonl as one
    event file (rewritten atomically when metrics.jsonl is newer), for a run trained without
    --tensorboard; None when the run has logged no step yet."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter

    source, folder = run_dir / "metrics.jsonl", run_dir / FROM_METRICS
    target = folder / CONVERTED
    if not source.is_file():
        return None
    # The events are current when made from this very metrics.jsonl: its size, time and
    # inode as recorded beside them (a newer-than test would keep the curves of a file
    # replaced by an older-dated copy).
    stamp_path, stat = folder / STAMP, source.stat()
    stamp = f"{stat.st_size} {stat.st_mtime_ns} {stat.st_ino}"
    if target.is_file() and stamp_path.is_file() and stamp_path.read_text() == stamp:
        return folder
    rows = runs.Run(run_dir).metrics()
    if not rows:
        return None
    data = io.BytesIO()
    writer = RecordWriter(data)
    writer.write(Event(wall_time=0.0, file_version="brain.Event:2").SerializeToString())
    for row in rows:
        values = [(f"train/{key}", getattr(row, key)) for key in ("loss", "accuracy", "lr")
                  if getattr(row, key) is not None]
        values += [(f"held_out/{key.removeprefix(HELD_OUT)}", value)
                   for key, value in row.held_out().items()]
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value))
                                 for tag, value in values])
        writer.write(Event(wall_time=float(row.seconds), step=row.step,
                           summary=summary).SerializeToString())
    folder.mkdir(exist_ok=True)
    atomic_write_bytes(target, data.getvalue(), temp_name=TRUNCATING)
    atomic_write_bytes(stamp_path, stamp.encode())
    return folder


def logdir_spec(run_dirs: list[Path], folders: dict[Path, str] | None = None) -> str:
    """TensorBoard's `--logdir_spec name:path,...` for these runs, each named by its path
    below the folder they share (a sweep's `vocab_size=32/encoding=none/seed=111`), so
    TensorBoard shows them side by side under names that say what differs; each run's
    events in its `folders` entry (default RUN_DIR/tensorboard)."""
    real = [Path(os.path.abspath(r)) for r in run_dirs]
    root = Path(os.path.commonpath(real)) if len(real) > 1 else real[0].parent
    parts = []
    for run_dir in real:
        if "," in str(run_dir):
            raise UserError(f"{run_dir}: TensorBoard cannot take a path with a comma; "
                            "move or link the run elsewhere")
        name = run_dir.relative_to(root).as_posix().replace(":", "_")  # ends the name
        folder = (folders or {}).get(Path(os.path.abspath(run_dir)), FOLDER)
        parts.append(f"{name}:{run_dir / folder}")
    return ",".join(parts)


def tensorboard_command(run_dirs: list[Path], port: int = defaults.TENSORBOARD_PORT) -> list[str]:
    """The command that serves the curves of these runs side by side: the event files of
    runs trained with --tensorboard, and for the others event files written now from their
    metrics.jsonl (`events_from_metrics`); UserError when no run has logged a step
    (TensorBoard would show an empty page)."""
    if not run_dirs:
        raise UserError("no run directories there (folders holding recipe.toml)")
    if find_spec("tensorboard") is None:
        raise UserError(f"tensorboard: the tensorboard package is not installed; {EXTRA}")
    logged, folders, converted, unwritable = [], {}, 0, []
    for run in run_dirs:
        if event_files(run / FOLDER):
            logged.append(run)
            continue
        try:
            folder = events_from_metrics(run)
        except OSError as exc:  # a run directory one may read, not write (a colleague's)
            unwritable.append(f"{run} ({exc.strerror or exc})")
            continue
        if folder is not None:
            logged.append(run)
            folders[Path(os.path.abspath(run))] = FROM_METRICS
            converted += 1
    if not logged and unwritable:
        raise UserError(f"none of the {len(run_dirs)} run(s) can be shown: their event files "
                        "cannot be written from metrics.jsonl, folder not writable: "
                        + "; ".join(unwritable[:3]))
    if not logged:
        raise UserError(f"none of the {len(run_dirs)} run(s) has logged a training step yet "
                        "(metrics.jsonl) or has TensorBoard event files")
    left = len(run_dirs) - len(logged)
    console.print(f"{len(logged)} of {len(run_dirs)} runs shown"
                  + (f"; {converted} from their metrics.jsonl (trained without "
                     f"--tensorboard, written to RUN_DIR/{FROM_METRICS})" if converted else "")
                  + (f"; {left} left out (no step logged yet"
                     + (f", or their folder not writable: {'; '.join(unwritable[:3])}"
                        if unwritable else "") + ")" if left else ""),
                  highlight=False, soft_wrap=True)
    return [sys.executable, "-m", "tensorboard.main", "--logdir_spec",
            logdir_spec(logged, folders), "--port", str(port)]


def launch(command: list[str]) -> int:
    """Run TensorBoard until it exits or Ctrl-C; its exit code (0 after Ctrl-C)."""
    if find_spec("tensorboard") is None:
        raise UserError(f"tensorboard: the tensorboard package is not installed; {EXTRA}")
    try:
        return subprocess.run(command).returncode
    except KeyboardInterrupt:
        return 0
