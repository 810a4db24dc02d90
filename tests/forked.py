"""The sweep's children as forks of the test process, for the tests where the child process
is not what is under test (the `forked_children` fixture of tests/conftest.py).

A sweep starts each command of a cell as `perencode COMMAND...` in a new process
(perencode.commands.sweep.child.launch). A new process pays for its imports before it trains:
about 6 CPU-seconds (torch, then torch._dynamo, which torch.optim loads with its first
parameter group), against a second or two for a tiny run. A fork of the test process, which
has all of it loaded, starts in milliseconds and is still a process of its own: its own pid,
its own exit code, its output appended to the cell's train.log, the signals and the parent's
death reaching it as they reach the real child. What it does not have is a fresh
interpreter: it runs the modules (and any monkeypatch) the test process has, so the tests
about what a real child loads (plugins handed to workers, the installed package, imports)
keep `launch`.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from perencode.common.processes import set_parent_death_signal
from perencode.store import runs
from perencode.store.lock import PARENT_ENV

# As exec does: a signal the test process handles (pytest-timeout's alarm, the sweep's own
# SIGTERM/SIGHUP/SIGINT handlers) is back to its default in the child; one it ignores (SIGHUP
# under nohup) stays ignored.
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM, signal.SIGUSR1,
           signal.SIGUSR2)


class Forked:
    """What the sweep uses of subprocess.Popen, for a forked child."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid, self.args = pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _child(command: list[str], log: Any, env: dict[str, str], parent: int) -> int:
    """In the fork: become `perencode COMMAND...` writing to `log`; its exit code."""
    from perencode.cli import app

    for signum in SIGNALS:
        if callable(signal.getsignal(signum)):
            signal.signal(signum, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, 0)
    set_parent_death_signal(signal.SIGTERM)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), line_buffering=True)  # noqa: SIM115
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), line_buffering=True)  # noqa: SIM115
    os.environ.clear()
    os.environ.update({**env, PARENT_ENV: str(parent)})
    if os.getppid() != parent:  # the sweep died before the death signal was set
        return 128 + signal.SIGTERM
    try:
        app(args=command, prog_name="perencode", standalone_mode=True)
    except SystemExit as stop:
        code = stop.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException:  # as an uncaught exception ends a process: a traceback, exit 1
        traceback.print_exc()
        return 1
    return 0


def _save_coverage() -> None:
    """Where coverage.py measures the suite (subprocesses included), the fork's share: its
    data is written at exit, which os._exit skips."""
    try:
        import coverage
    except ImportError:
        return
    current = coverage.Coverage.current()
    if current is not None:
        current.stop()
        current.save()


def launch(command: list[str], run_dir: Path, env: dict[str, str]) -> tuple[Forked, Any]:
    """perencode.commands.sweep.child.launch, with the child forked from this process."""
    log = open(run_dir / "train.log", "a", encoding="utf-8")  # noqa: SIM115 - closed by caller
    argv = ["perencode", *command]
    log.write(f"# {runs.now()} {' '.join(argv)} (forked by the tests)\n")
    log.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _child(command, log, env, parent)
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001 - a closed or full log: the exit code stands
                    pass
            _save_coverage()
            os._exit(code)
    return Forked(pid, argv), log
