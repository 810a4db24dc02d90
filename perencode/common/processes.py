"""Children of a perencode process: how they run the perencode this process runs, and the
signal the kernel sends one when its parent dies. Standard library only: a SLURM job imports
it (through perencode.commands.sweep.child) before it starts its run's command."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from pathlib import Path

# linux/prctl.h: the kernel sends a process this signal when its parent dies.
PR_SET_PDEATHSIG = 1
# Loaded at import: a forked child (a Popen preexec_fn) must not load a library.
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) \
    if sys.platform.startswith("linux") else None


def set_parent_death_signal(signum: int) -> None:
    """Linux: the kernel sends this process `signum` when its parent dies (0: nothing);
    elsewhere nothing happens (the caller watches its parent itself)."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signum)


def perencode_command() -> list[str]:
    """How children run the perencode this process runs: the console script beside the
    interpreter, else `python -m perencode`. The script puts its own folder first on
    sys.path, where `-m` puts the working directory: a checkout there (a container started
    with it mounted at /work) would otherwise run instead of the installed package."""
    script = Path(sys.executable).with_name("perencode")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "perencode"]
