"""Live training curves: the rows of metrics.jsonl as TensorBoard event files.

    RUN_DIR/tensorboard/events.out.tfevents.*   train/loss, train/accuracy, train/lr and
                                                train/sequences_per_second at each log step

Written only with `perencode train --tensorboard` (an option of the command, not of the
recipe: it never changes what a run is). The `tensorboard` package is an optional extra.
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

from perencode import defaults
from perencode.console import console
from perencode.errors import UserError
from perencode.io import atomic_write_bytes, remove_stale_temps

FOLDER = "tensorboard"
EXTRA = "pip install 'perencode[tensorboard]'"
# The temporary file of an event file being rewritten (truncate_events): .truncating.XXXXXXXX.tmp
TRUNCATING = "truncating"

# metrics.jsonl keys of the periodic held-out scores (train.eval_every), drawn as held_out/
HELD_OUT = "held_out_"


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

    def log(self, row: dict[str, Any]) -> None:
        """One metrics.jsonl row (step, loss, accuracy, lr, and the held-out scores on the
        steps that have them), plus the sequences per second since the previous log step
        (or the start of this process)."""
        if self._writer is None:
            return
        step, now = row["step"], time.perf_counter()
        last_step, last_time = self._last
        self._last = (step, now)
        for key in ("loss", "accuracy", "lr"):
            self._writer.add_scalar(f"train/{key}", row[key], step)
        for key, value in row.items():  # train.eval_every: held_out_token_accuracy, ...
            if key.startswith(HELD_OUT):
                self._writer.add_scalar(f"held_out/{key.removeprefix(HELD_OUT)}", value, step)
        if now > last_time and step > last_step:
            rate = (step - last_step) * self._batch_size / (now - last_time)
            self._writer.add_scalar("train/sequences_per_second", rate, step)
        self._writer.flush()

    def __exit__(self, *exc) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def logdir_spec(run_dirs: list[Path]) -> str:
    """TensorBoard's `--logdir_spec name:path,...` for these runs, each named by its path
    below the folder they share (a sweep's `vocab_size=32/encoding=none/seed=111`), so
    TensorBoard shows them side by side under names that say what differs."""
    real = [Path(os.path.abspath(r)) for r in run_dirs]
    root = Path(os.path.commonpath(real)) if len(real) > 1 else real[0].parent
    parts = []
    for run_dir in real:
        if "," in str(run_dir):
            raise UserError(f"{run_dir}: TensorBoard cannot take a path with a comma; "
                            "move or link the run elsewhere")
        name = run_dir.relative_to(root).as_posix().replace(":", "_")  # ends the name
        parts.append(f"{name}:{run_dir / FOLDER}")
    return ",".join(parts)


def tensorboard_command(run_dirs: list[Path], port: int = defaults.TENSORBOARD_PORT) -> list[str]:
    """The command that serves the curves of these runs that have event files, side by
    side; UserError when none has (TensorBoard would show an empty page). A run trained
    with --tensorboard writes its event file as it starts, so a run left out is one trained
    without it or not started yet (start TensorBoard again once it is)."""
    if not run_dirs:
        raise UserError("no run directories there (folders holding recipe.toml)")
    logged = [r for r in run_dirs if event_files(r / FOLDER)]
    if not logged:
        raise UserError(f"none of the {len(run_dirs)} run(s) has TensorBoard event files "
                        "(runs write them with `perencode train --tensorboard` or `perencode "
                        "sweep --tensorboard`)")
    left = len(run_dirs) - len(logged)
    console.print(f"{len(logged)} of {len(run_dirs)} runs have TensorBoard event files"
                  + (f"; {left} without any left out (trained without --tensorboard or not "
                     "started yet)" if left else ""), highlight=False)
    return [sys.executable, "-m", "tensorboard.main", "--logdir_spec", logdir_spec(logged),
            "--port", str(port)]


def launch(command: list[str]) -> int:
    """Run TensorBoard until it exits or Ctrl-C; its exit code (0 after Ctrl-C)."""
    if find_spec("tensorboard") is None:
        raise UserError(f"tensorboard: the tensorboard package is not installed; {EXTRA}")
    try:
        return subprocess.run(command).returncode
    except KeyboardInterrupt:
        return 0
