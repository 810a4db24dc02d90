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

`run` is the same for a test's own `python -m perencode ARGS...` (subprocess.run with its
output captured), where that process's start is not what the test is about: a process of its
own with the environment, folder and standard streams it is given, without the seconds of
imports. A test about what a fresh interpreter does (its imports, the installed package, a
plugin found on PYTHONPATH, code edited on disk since this process read it) keeps
subprocess.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from perencode.common.processes import set_parent_death_signal
from perencode.config import plugins, registry
from perencode.store import runs
from perencode.store.lock import PARENT_ENV

# As exec does: a signal the test process handles (pytest-timeout's alarm, the sweep's own
# SIGTERM/SIGHUP/SIGINT handlers) is back to its default in the child; one it ignores (SIGHUP
# under nohup) stays ignored.
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM, signal.SIGUSR1,
           signal.SIGUSR2)


# The kinds a new process starts with: the package's own (no installed plugin: conftest.py
# turns autoloading off before this is imported). Taken before any test registers a kind or
# loads a plugin in the test process; a fork goes back to it (`_as_new`).
registry.registry("task")
_NEW = ({kind: dict(kinds) for kind, kinds in registry.REGISTRIES.items()},
        dict(registry.ORIGINS), dict(registry.RECORDED), dict(registry.MODULES))


def _as_new() -> None:
    """In the fork: the kinds as a new process has them before its first look-up, which
    loads the plugins that its environment names (PERENCODE_PLUGINS); a plugin the test
    process loaded is neither registered nor imported."""
    kinds, origins, recorded, modules = _NEW
    loaded = [p.module for p in [*plugins._LOADED.values(), *registry.ORIGINS.values()]
              if isinstance(p, plugins.Plugin)]
    for module in loaded:
        sys.modules.pop(module, None)
    pairs: list[tuple[dict, dict]] = [
        (registry.ORIGINS, origins), (registry.RECORDED, recorded), (registry.MODULES, modules),
        *((registry.REGISTRIES[kind], kinds[kind]) for kind in kinds)]
    for live, new in pairs:
        live.clear()
        live.update(new)
    registry.LOADING.clear()
    plugins._LOADED.clear()
    registry._loaded.clear()


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


def _become(command: list[str], streams: tuple[int, int, int], env: dict[str, str],
            parent: int, cwd: str | None = None) -> int:
    """In the fork: become `perencode COMMAND...` on the descriptors `streams` (stdin,
    stdout, stderr), in `env` and `cwd`; its exit code."""
    from perencode import cli
    from perencode.common import console

    for signum in SIGNALS:
        if callable(signal.getsignal(signum)):
            signal.signal(signum, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, 0)
    set_parent_death_signal(signal.SIGTERM)
    for target, fd in enumerate(streams):
        os.dup2(fd, target)
    sys.stdin = io.TextIOWrapper(open(0, "rb", closefd=False))  # noqa: SIM115
    sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), line_buffering=True)  # noqa: SIM115
    sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), line_buffering=True)  # noqa: SIM115
    sys.argv = [str(Path(cli.__file__).with_name("__main__.py")), *command]
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    # rich reads the environment (COLUMNS, NO_COLOR, FORCE_COLOR) and the streams' terminal
    # when a console is made, at import: made again, as a new process makes them.
    Console.__init__(console.console, stderr=True, soft_wrap=True)
    Console.__init__(console.results, soft_wrap=True)
    _as_new()
    if os.getppid() != parent:  # the parent died before the death signal was set
        return 128 + signal.SIGTERM
    try:
        cli.app(args=command, prog_name="perencode", standalone_mode=True)
    except SystemExit as stop:
        code = stop.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except BaseException:  # as an uncaught exception ends a process: a traceback, exit 1
        traceback.print_exc()
        return 1
    return 0


def _end(code: int) -> None:
    """The fork's end: its streams flushed, its coverage saved, nothing of the test
    process's own exit run."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or full stream: the exit code stands
            pass
    _save_coverage()
    os._exit(code)


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
            code = _become(command, (0, log.fileno(), log.fileno()),
                           {**env, PARENT_ENV: str(parent)}, parent)
        finally:
            _end(code)
    return Forked(pid, argv), log


def start(args: Sequence[Any], *, env: dict[str, str], output: Path) -> Forked:
    """`python -m perencode ARGS...` started as subprocess.Popen(..., env=env, stdout=LOG,
    stderr=subprocess.STDOUT) starts it, its output written to the file `output`, the process
    forked from this one."""
    command = [str(arg) for arg in args]
    with open(output, "wb") as log:
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _become(command, (os.open(os.devnull, os.O_RDONLY), log.fileno(),
                                         log.fileno()), dict(env), parent)
            finally:
                _end(code)
    return Forked(pid, ["perencode", *command])


def run(args: Sequence[Any], *, env: dict[str, str], cwd: Path | str | None = None,
        timeout: float | None = None, input: str | None = None  # noqa: A002 - subprocess's
        ) -> subprocess.CompletedProcess:
    """`python -m perencode ARGS...` as subprocess.run(..., capture_output=True, text=True,
    env=env, cwd=cwd, timeout=timeout, input=input) runs it, the process forked from this
    one. On a timeout the process is killed and subprocess.TimeoutExpired raised."""
    command = [str(arg) for arg in args]
    argv = ["perencode", *command]
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as stdout, \
            tempfile.TemporaryFile() as stderr:
        stdin.write((input or "").encode())
        stdin.seek(0)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _become(command, (stdin.fileno(), stdout.fileno(), stderr.fileno()),
                               dict(env), parent, None if cwd is None else str(cwd))
            finally:
                _end(code)
        child = Forked(pid, argv)
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise
        stdout.seek(0)
        stderr.seek(0)
        return subprocess.CompletedProcess(argv, code, stdout.read().decode(errors="replace"),
                                           stderr.read().decode(errors="replace"))
