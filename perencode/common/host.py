"""This machine as this process sees it, without torch: the cores it may run on and the
memory it may take (its cgroup's limit, SLURM's allocation, the free RAM). What must start
without torch reads them here: `lm-prepare` and its SentencePiece trainer, a process of its
own that imports perencode.commands.lm_prepare and nothing heavier."""

from __future__ import annotations

import os
from pathlib import Path


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
