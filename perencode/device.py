"""Where work runs: the torch device of `--device`, the cores and GPUs a sweep spreads over,
the memory this process may use (its cgroup's limit, SLURM's allocation, the free RAM), and
its tie to the process that started it (Linux's parent death signal)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

import torch

from perencode.errors import UserError


def resolve_device(name: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; an unavailable cuda request is a UserError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device '{name}': expected auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device '{name}': no CUDA device is available (use cpu or auto)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise UserError(f"--device '{name}': only {torch.cuda.device_count()} CUDA device(s) "
                        f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"--device '{name}': expected auto, cpu, cuda or cuda:N")
    return device


def available_cores() -> int:
    """The cores this process may run on (its affinity: SLURM's and taskset's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


# Where the kernel tells this process's memory limits and the free RAM (read at each call).
PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")
MEMINFO = Path("/proc/meminfo")


def _read_int(path: str | Path) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_limit() -> int | None:
    """The tightest memory limit of this process's cgroup and its ancestors (v2), or the
    v1 memory controller's; None when unlimited or unknown."""
    limits = []
    try:
        entries = PROC_CGROUP.read_text().splitlines()
    except OSError:
        entries = []
    for entry in entries:
        hierarchy, _, rest = entry.partition(":")
        controllers, _, group = rest.partition(":")
        if hierarchy == "0":  # v2: memory.max along the path up to the root
            path = CGROUP_ROOT / group.lstrip("/")
            for folder in [path, *path.parents]:
                if folder == CGROUP_ROOT.parent:
                    break
                limits.append(_read_int(folder / "memory.max"))
        elif "memory" in controllers.split(","):
            limits.append(_read_int(CGROUP_ROOT / "memory" / group.lstrip("/") /
                                    "memory.limit_in_bytes"))
            limits.append(_read_int(CGROUP_ROOT / "memory" / "memory.limit_in_bytes"))
    found = [n for n in limits if n is not None and n < 1 << 60]  # v1 "unlimited" is huge
    return min(found) if found else None


def memory_available() -> tuple[int, str] | None:
    """(bytes, what) of the tightest limit on this process's memory: its cgroup's limit,
    SLURM's allocation (--mem, --mem-per-cpu) or the free RAM; None if none is known."""
    found = []
    cgroup = _cgroup_limit()
    if cgroup is not None:
        found.append((cgroup, "this process's cgroup memory limit"))
    per_node = os.environ.get("SLURM_MEM_PER_NODE", "")
    per_cpu = os.environ.get("SLURM_MEM_PER_CPU", "")
    if per_node.isdigit():
        found.append((int(per_node) << 20, "the SLURM job's memory (--mem)"))
    elif per_cpu.isdigit():
        cpus = os.environ.get("SLURM_CPUS_ON_NODE", "")
        n = int(cpus) if cpus.isdigit() else available_cores()
        found.append((int(per_cpu) * n << 20, "the SLURM job's memory (--mem-per-cpu)"))
    free = _free_ram()
    if free is not None:
        found.append(free)
    return min(found) if found else None


def _free_ram() -> tuple[int, str] | None:
    """The RAM a new process can take without swapping (MemAvailable), else the free pages
    (where there is no /proc/meminfo); None where neither can be told."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) << 10, "the free RAM (MemAvailable)"
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "the free RAM"
    except (AttributeError, ValueError, OSError):
        return None


def device_memory(device: torch.device) -> tuple[int, str] | None:
    """(bytes a run can use on `device`, what they are): the total memory of a CUDA device,
    `memory_available()` on the CPU; None where it cannot be told."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return props.total_memory, f"{device} ({props.name})"
    return memory_available()


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


def visible_gpus(device: str) -> list[str]:
    """GPU ids to spread runs over: none for cpu or an explicit cuda:N."""
    if device not in ("auto", "cuda"):
        return []
    if not torch.cuda.is_available():
        if device == "cuda":
            raise UserError("--device cuda: no CUDA device is available (use cpu or auto)")
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed:
        return [g.strip() for g in listed.split(",") if g.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]
