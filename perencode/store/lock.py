"""One writer per directory: the lock that run directories and sweep run trees share.

`hold(directory, purpose)` takes an exclusive lock on `directory/.perencode.lock` for the
duration of a `with` block, and writes who holds it (pid, host, purpose, since, SLURM job)
into that file so that a second command can say whom it met.

The primitive is a POSIX record lock (`fcntl.lockf`, F_SETLK on the whole file), for three
reasons:
- the kernel drops it when its holder dies, however it dies (SIGKILL, OOM killer): a
  killed process leaves the file behind but no lock, so there is no staleness to guess from
  pids or ages; the next `hold` simply gets the lock, and says it took over;
- it is the lock that shared filesystems carry between hosts: NFSv3 through lockd (NLM),
  NFSv4 in the protocol itself, Lustre (mounted with `-o flock`), GPFS, BeeGFS with global
  locks; Linux even implements `flock` on NFS as this very lock. When a node is lost, an
  NFSv4 server drops its locks when the node's lease expires (90 s by default);
- it is not inherited by child processes, so a sweep holding its run tree can start
  `perencode train` children that each lock their own run directory.
POSIX locks belong to a process, not to a file descriptor (closing any descriptor of the
file releases them, and a second lock by the same process succeeds), so this module also
keeps the directories it holds and refuses a second `hold` of one of them in-process.

A requeued SLURM job (same SLURM_JOB_ID, a higher SLURM_RESTART_COUNT) meeting a lock still
held in the name of its own earlier incarnation knows from SLURM that the holder has ended
(a lost node's lock can outlive it until its lease expires): it takes the run back by
replacing the lock file. On release the holder unlinks the file (a lock is only trusted
after checking that the file locked is still the one at the path), so a finished command
leaves nothing behind, and a lock file found with a holder's record in it means a holder
that was killed.

On Windows (no fcntl) the same is done with `msvcrt.locking` on one byte of the file.

A filesystem that refuses record locks (NFS mounted without lockd: ENOLCK) stops the
command with one line; PERENCODE_NO_LOCK=1 runs without the lock there, and then nothing
keeps two commands from writing the same directory.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from perencode.common.console import console
from perencode.common.errors import UserError

if sys.platform == "win32":
    import msvcrt
else:
    import fcntl

LOCK_NAME = ".perencode.lock"
NO_LOCK_VARIABLE = "PERENCODE_NO_LOCK"
# Set by a sweep for its local workers: the pid of the sweep. A worker whose parent is no
# longer that process (the sweep was killed, even by SIGKILL) stops as on SIGTERM, so no
# trainer outlives its sweep (perencode.training.loop reads it; PR_SET_PDEATHSIG, set by
# perencode.commands.sweep.local, does the same at once on Linux).
PARENT_ENV = "PERENCODE_PARENT_PID"
# Windows locks a byte range and forbids reading it meanwhile: lock one byte far past the
# holder's record, which stays readable.
_WINDOWS_BYTE = 1 << 30

_held: set[str] = set()


class Locked(UserError):
    """Another live process (or this one) holds the directory's lock."""


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock on `fd` without waiting; False if someone holds it."""
    if sys.platform == "win32":
        os.lseek(fd, _WINDOWS_BYTE, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):  # POSIX: held
            return False
        if exc.errno == errno.ENOLCK:
            raise NoLocks() from None
        raise
    return True


class NoLocks(Exception):
    """The filesystem refuses record locks (ENOLCK)."""


def _unlock(fd: int) -> None:
    if sys.platform == "win32":
        os.lseek(fd, _WINDOWS_BYTE, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
    else:
        fcntl.lockf(fd, fcntl.LOCK_UN)


def _still_at(fd: int, path: Path) -> bool:
    """Whether the file locked through `fd` is still the one at `path` (not unlinked or
    replaced by its previous holder meanwhile)."""
    if sys.platform == "win32":  # an open file cannot be unlinked there
        return True
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _read_record(fd: int) -> dict:
    """The holder's record in the lock file ({} if empty or unreadable)."""
    os.lseek(fd, 0, os.SEEK_SET)
    data = os.read(fd, 4096)
    try:
        record = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


def _read_holder(path: Path) -> dict:
    """The record of the holder of the lock file at `path` ({} if none is there yet)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return {}
    try:
        return _read_record(fd)
    finally:
        os.close(fd)


def _describe(record: dict) -> str:
    purpose = record.get("purpose", "?")
    job = f", SLURM job {record['slurm_job']}" if record.get("slurm_job") else ""
    return (f"`{purpose}` (pid {record.get('pid', '?')} on {record.get('host', '?')}{job}, "
            f"since {record.get('since', '?')})")


def _my_record(purpose: str) -> dict:
    record = {"pid": os.getpid(), "host": socket.gethostname(), "purpose": purpose,
              "since": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")}
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        record["slurm_job"] = job
        record["slurm_restart"] = _restart_count(os.environ.get("SLURM_RESTART_COUNT"))
    return record


def _restart_count(value) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _earlier_incarnation(record: dict) -> bool:
    """Whether `record` is the lock of an earlier run of this very SLURM job (requeued since:
    SLURM has ended that one, whatever its lock says)."""
    job = os.environ.get("SLURM_JOB_ID")
    return bool(job) and record.get("slurm_job") == job and \
        _restart_count(record.get("slurm_restart")) < \
        _restart_count(os.environ.get("SLURM_RESTART_COUNT"))


def _note(message: str) -> None:
    console.print(f"[yellow]note:[/] {message}", highlight=False, soft_wrap=True)


def _open(path: Path, directory: Path) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise UserError(f"{directory}: cannot create its lock file {LOCK_NAME} "
                        f"({exc.strerror})") from None


def _acquire(directory: Path, purpose: str) -> int:
    """Lock `directory` and write this process's record; the locked file's descriptor."""
    path = directory / LOCK_NAME
    holder: dict = {}
    for _ in range(50):
        fd = _open(path, directory)
        try:
            locked = _try_lock(fd)
        except NoLocks:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise UserError(f"{path}: the filesystem refuses file locks (ENOLCK: e.g. NFS "
                            f"mounted without lockd); the lock keeps two commands from "
                            f"writing {directory} at once. Use a folder on a local or "
                            f"lock-capable filesystem, or set {NO_LOCK_VARIABLE}=1 to run "
                            f"without it (then start one command per directory)") from None
        if not locked:
            os.close(fd)
            holder = _read_holder(path)
            if not holder:  # a holder that has just locked, or is just releasing
                time.sleep(0.02)
                continue
            if not _earlier_incarnation(holder):
                break
            _note(f"{directory}: taking the run back from {_describe(holder)}, an earlier "
                  f"run of this requeued SLURM job")
            try:
                path.unlink(missing_ok=True)
            except OSError:
                break
            continue
        if not _still_at(fd, path):  # its previous holder released it and removed the file
            os.close(fd)
            continue
        previous = _read_record(fd)
        if previous:
            _note(f"{directory}: {_describe(previous)} ended without releasing its lock "
                  f"(killed); taking over")
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, json.dumps(_my_record(purpose)).encode("utf-8"))
            os.fsync(fd)  # a contender on another NFS client reads the record from the server
        except OSError as exc:
            _release(fd, path)
            raise UserError(f"{path}: cannot write the lock's record ({exc.strerror}); "
                            f"nothing in {directory} was changed") from None
        return fd
    who = _describe(holder) if holder else "another process"
    raise Locked(f"{directory}: in use by {who}; wait until it ends, or if it is gone for good "
                 f"(a lost node), delete {path}")


def _release(fd: int, path: Path) -> None:
    try:
        os.ftruncate(fd, 0)  # an empty file is a released lock, even where unlink fails
        if sys.platform != "win32":
            path.unlink(missing_ok=True)
    except OSError:
        pass  # a read-only or vanished directory: the lock goes with the descriptor anyway
    finally:
        try:
            _unlock(fd)
        finally:
            os.close(fd)


def live_holder(directory: Path) -> dict | None:
    """The record of the live process that holds `directory`'s lock now ({} when it wrote
    none yet), None when nobody does. Nothing is created; a free lock is let go at once."""
    path = Path(directory) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:  # no lock file (or none this process may open): nobody to wait for
        return None
    try:
        try:
            locked = _try_lock(fd)
        except NoLocks:
            return None
        if locked:
            _unlock(fd)
            return None
        return _read_record(fd)
    finally:
        os.close(fd)


def describe(record: dict) -> str:
    """`purpose` (pid ... on host, since ...) of a lock holder's record."""
    return _describe(record)


@contextmanager
def hold(directory: Path, purpose: str) -> Iterator[None]:
    """Exclusive lock on `directory` (created if missing) for the `with` block.

    The lock file is `directory/.perencode.lock`, holding the holder's pid, host, purpose
    (e.g. "train"), start time (UTC) and SLURM job. A second holder, in another process or
    host or in this process, gets `Locked`: one line naming the holder and what to do.

    A lock left by a killed process is no lock at all: the kernel (or the NFS server, when
    the node's lease expires) released it when the process died; the next `hold` finds the
    dead holder's record in the file, says so in a note, and takes over. A requeued SLURM
    job also takes over a lock still held for its own earlier run (see the module's notes).
    """
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise UserError(f"{directory}: exists and is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{directory}: cannot create the directory ({exc.strerror})") from None
    if os.environ.get(NO_LOCK_VARIABLE) == "1":
        yield
        return
    key = os.path.realpath(directory)
    if key in _held:
        raise Locked(f"{directory}: already in use by this process (pid {os.getpid()}); "
                     f"one command at a time per directory")
    fd = _acquire(directory, purpose)
    _held.add(key)
    try:
        yield
    finally:
        _held.discard(key)
        _release(fd, directory / LOCK_NAME)
