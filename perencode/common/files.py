"""Atomic file writes (and the error of a checkpoint that cannot be read back:
perencode.store.checkpoints reads them).

Every result or checkpoint is written to a temporary file `.NAME.XXXXXXXX.tmp` in the same
folder, flushed and fsync'ed, then renamed over the target: a reader sees the old file or
the new one, never half of one. A writer killed before the rename leaves its temporary
file; `remove_stale_temps` clears them (the commands call it under their directory's lock).

A write the filesystem refuses for space, quota, permission or a read-only mount raises
`WriteError` (a UserError: one line naming the file and what was kept), not a traceback.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from perencode.common.errors import DISK_ERRORS, UserError, refused_write

# mkstemp(prefix=".NAME.", suffix=".tmp"): eight characters of [a-z0-9_] in between.
TEMP_RE = re.compile(r"^\.(?P<target>.+)\.[a-z0-9_]{8}\.tmp$")
_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# The mode open() would give a new file: mkstemp's 0600 would hide results and checkpoints
# from the other users of a shared filesystem.
_UMASK = os.umask(0o022)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK


class WriteError(UserError):
    """The filesystem refused a write (full, over quota, read-only, no permission)."""


class CorruptCheckpoint(UserError):
    """A checkpoint file that cannot be read back (truncated, damaged, not a checkpoint)."""


def plain(text: str) -> str:
    """`text` without terminal colour codes (torch colours some of its messages)."""
    return _ANSI_RE.sub("", text)


def disk_error(exc: OSError, path: str | Path, kept: str) -> WriteError | None:
    """The one-line WriteError for a refused write of `path` (errors.refused_write, and what
    is `kept`), None for other errors (a refused lock among them: not a write's)."""
    if exc.errno not in DISK_ERRORS:
        return None
    return WriteError(f"{refused_write(exc, path)}; {kept}")


@contextmanager
def disk_errors(path: str | Path, kept: str) -> Iterator[None]:
    """Turn a refused write inside the block into WriteError naming the file and `kept`."""
    try:
        yield
    except OSError as exc:
        error = disk_error(exc, path, kept)
        if error is None:
            raise
        raise error from None


def atomic_write_bytes(path: str | Path, data: bytes, temp_name: str | None = None) -> None:
    """Write `data` to `path` whole or not at all: a temporary file `.NAME.XXXXXXXX.tmp`
    beside it (NAME: `temp_name`, else the file's name), fsync'ed, renamed over `path`, the
    directory fsync'ed."""
    path = Path(path)
    kept = (f"the previous {path.name} is kept" if path.exists()
            else f"{path.name} was not written")
    with disk_errors(path, kept):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{temp_name or path.name}.", suffix=".tmp",
                                   dir=path.parent)
        try:
            if hasattr(os, "fchmod"):
                os.fchmod(fd, FILE_MODE)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        fsync_dir(path.parent)


def append_line(path: str | Path, line: str) -> None:
    """Append one line durably: it is whole or absent. A write the filesystem refuses, even
    half done, is cut back to where the file ended. A last line left without its newline
    (a writer killed mid-line) is ended first, so the new line never runs into it (readers
    skip the cut one with a note)."""
    path = Path(path)
    data = (line + "\n").encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, FILE_MODE)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        if size:
            os.lseek(fd, size - 1, os.SEEK_SET)
            if os.read(fd, 1) != b"\n":
                data = b"\n" + data
        try:
            view = memoryview(data)
            while view:  # os.write may write part of it (a nearly full disk)
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError as exc:
            error = disk_error(exc, path, f"{path.name} keeps its earlier lines")
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass  # cannot be cut back: the readers skip a cut line with a note
            if error is None:
                raise
            raise error from None
    finally:
        os.close(fd)


def remove_stale_temps(folder: str | Path,
                       targets: Callable[[str], bool] = lambda name: True) -> list[Path]:
    """Delete the temporary files killed writers left in `folder` (only this module's
    `.NAME.XXXXXXXX.tmp`, and only for the NAMEs `targets` accepts); the paths removed.
    Call it holding the folder's lock: a live writer's temporary file looks the same."""
    folder = Path(folder)
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    for path in sorted(folder.iterdir()):
        match = TEMP_RE.match(path.name)
        if match and targets(match.group("target")) and path.is_file() \
                and not path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def fsync_dir(path: str | Path) -> None:
    """Make a rename inside `path` durable (the directory entry itself is fsync'ed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def tail_lines(path: Path, size: int) -> list[str]:
    """The lines of the last `size` bytes of a file (the first may be cut), without reading
    the rest: a live log or metrics file can be large. Raises OSError like open()."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - size))
        return f.read().decode("utf-8", "replace").splitlines()
