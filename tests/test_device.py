"""perencode.common.device: `--device` resolution, the memory this process may use."""

import ctypes
import signal
import sys
from types import SimpleNamespace

import pytest
import torch

from perencode.common import device, host, processes
from perencode.common.device import resolve_device
from perencode.common.errors import UserError


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(UserError, match="expected auto, cpu, cuda or cuda:N"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="no CUDA device"):
            resolve_device("cuda")


def test_cuda_index_beyond_device_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda:0")
    with pytest.raises(UserError, match=r"only 1 CUDA device\(s\) \(cuda:0..cuda:0\)"):
        resolve_device("cuda:3")


def simulated_cgroup(monkeypatch, tmp_path, v2: dict[str, int | str] | None = None,
                     v1: int | None = None):
    """Point perencode.common.host at a fake /proc/self/cgroup and /sys/fs/cgroup under
    `tmp_path`: `v2` maps a group path to its memory.max ("max": unlimited), `v1` is the
    memory controller's limit of the group /job."""
    root = tmp_path / "sys" / "fs" / "cgroup"
    lines = []
    for group, limit in (v2 or {}).items():
        (root / group.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (root / group.lstrip("/") / "memory.max").write_text(f"{limit}\n")
    if v2:
        lines.append(f"0::{max(v2, key=len)}")
    if v1 is not None:
        (root / "memory" / "job").mkdir(parents=True)
        (root / "memory" / "job" / "memory.limit_in_bytes").write_text(f"{v1}\n")
        (root / "memory" / "memory.limit_in_bytes").write_text(f"{(1 << 63) - 4096}\n")
        lines.append("4:memory:/job")
    (tmp_path / "cgroup").write_text("".join(line + "\n" for line in lines))
    monkeypatch.setattr(host, "PROC_CGROUP", tmp_path / "cgroup")
    monkeypatch.setattr(host, "CGROUP_ROOT", root)


def no_slurm(monkeypatch):
    for name in ("SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU", "SLURM_CPUS_ON_NODE"):
        monkeypatch.delenv(name, raising=False)


def test_memory_available_is_the_tightest_limit(monkeypatch, tmp_path):
    no_slurm(monkeypatch)
    (tmp_path / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
    monkeypatch.setattr(host, "MEMINFO", tmp_path / "meminfo")
    simulated_cgroup(monkeypatch, tmp_path)
    assert host.memory_available() == (4000000 << 10, "the free RAM (MemAvailable)")
    # cgroup v2: the tightest memory.max on the way up, "max" being no limit
    simulated_cgroup(monkeypatch, tmp_path, v2={"/a": 3 << 30, "/a/b": "max"})
    assert host.memory_available() == (3 << 30, "this process's cgroup memory limit")
    simulated_cgroup(monkeypatch, tmp_path / "v1", v1=2 << 30)  # v1: "unlimited" ignored
    assert host.memory_available() == (2 << 30, "this process's cgroup memory limit")
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "1024")  # MB
    assert host.memory_available() == (1 << 30, "the SLURM job's memory (--mem)")
    monkeypatch.delenv("SLURM_MEM_PER_NODE")
    monkeypatch.setenv("SLURM_MEM_PER_CPU", "100")
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "3")
    assert host.memory_available() == (300 << 20, "the SLURM job's memory (--mem-per-cpu)")


def test_without_meminfo_the_free_ram_is_the_free_pages_else_unknown(monkeypatch, tmp_path):
    """Where there is no /proc/meminfo (or it names no MemAvailable) the free pages count;
    where neither can be told, the free RAM is unknown (None), not an error."""
    pages = {"SC_AVPHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(host.os, "sysconf", lambda name: pages[name])
    monkeypatch.setattr(host, "MEMINFO", tmp_path / "absent")
    assert host._free_ram() == (1000 * 4096, "the free RAM")
    (tmp_path / "meminfo").write_text("MemTotal: 8000000 kB\nMemFree: 100 kB\n")
    monkeypatch.setattr(host, "MEMINFO", tmp_path / "meminfo")
    assert host._free_ram() == (1000 * 4096, "the free RAM")
    (tmp_path / "meminfo").write_text("MemAvailable: lots\n")  # unreadable: the pages
    assert host._free_ram() == (1000 * 4096, "the free RAM")

    def unsupported(name):
        raise ValueError(f"unrecognized configuration name {name}")

    monkeypatch.setattr(host.os, "sysconf", unsupported)
    assert host._free_ram() is None

def test_device_memory_is_the_free_cuda_memory_or_what_this_process_may_use(monkeypatch):
    """On a GPU what cudaMemGetInfo says is free, not its total: other processes (other
    runs sharing it among them) hold the rest."""
    monkeypatch.setattr(device, "memory_available", lambda: (5, "a limit"))
    assert device.device_memory(torch.device("cpu")) == (5, "a limit")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (3 << 30, 8 << 30))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(total_memory=8 << 30, name="Fake GPU"))
    assert device.device_memory(torch.device("cuda")) == \
        (3 << 30, "cuda (Fake GPU: free of its 8.0 GiB)")


@pytest.mark.parametrize("capability, archs, runs", [
    ((8, 0), ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], True),  # A100
    ((9, 0), ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], True),  # H100
    ((8, 9), ["sm_80", "sm_86", "sm_90"], True),  # L40: sm_86's cubin, same major version
    # torch 2.1.1+cu121's list on a B200 (sm_100) and an RTX 5090 (sm_120): no kernel image
    ((10, 0), ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], False),
    ((12, 0), ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], False),
    ((12, 0), ["sm_90", "compute_90"], True),  # PTX: the driver compiles it for newer GPUs
    ((10, 0), ["sm_90a"], False),  # an architecture-specific cubin runs on its own GPU only
    ((7, 0), ["sm_75", "sm_80"], False),  # a cubin never runs on an older minor version
    ((8, 0), [], False),
])
def test_a_gpu_runs_the_kernels_of_its_architecture_or_older_of_its_major(capability, archs,
                                                                          runs):
    assert device.runs_on(capability, archs) is runs


def test_kernel_support_names_the_gpu_and_the_builds_architectures(monkeypatch):
    assert device.kernel_support(torch.device("cpu")) is None
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA B200")
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_80", "sm_90"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (10, 0))
    line = device.kernel_support(torch.device("cuda"))
    assert line is not None and "\n" not in line
    assert line.startswith("NVIDIA B200 is sm_100, and torch ") and \
        "has kernels for sm_80, sm_90 only" in line and "no kernel image" in line, line
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    assert device.kernel_support(torch.device("cuda")) is None


@pytest.mark.filterwarnings("ignore:called a synchronizing")
@pytest.mark.filterwarnings("ignore:something else")
def test_host_syncs_counts_sync_debug_mode_warnings_per_call(monkeypatch):
    """torch's sync debug mode warns at each host-device synchronisation (CUDA only);
    simulated here: a step that warns as that mode does, twice a call."""
    import warnings

    modes: list[str] = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)

    def step():
        warnings.warn(device.SYNC_WARNING, stacklevel=1)
        warnings.warn(device.SYNC_WARNING, stacklevel=1)
        warnings.warn("something else", stacklevel=1)

    counted = device.host_syncs(step, torch.device("cuda"), calls=4)
    assert counted is not None
    per_call, where = counted
    assert per_call == 2.0 and sum(where.values()) == 2.0
    assert list(where) == [f"test_device.py:{step.__code__.co_firstlineno + 1}",
                           f"test_device.py:{step.__code__.co_firstlineno + 2}"]
    assert modes == ["warn", "default"]  # restored afterwards
    assert device.host_syncs(step, torch.device("cpu")) is None


def test_free_running_time_synchronises_once_at_the_end(monkeypatch):
    """`bench --baseline` and the doctor's speed row time steps as training runs them: back
    to back, one synchronisation at the end (CUDA events), so a sync inside a step shows
    (simulated CUDA: events and synchronize recorded)."""
    calls = []

    class Event:
        def __init__(self, enable_timing):
            self.at = None

        def record(self):
            calls.append("record")
            self.at = len(calls)

        def elapsed_time(self, other):
            return 1000.0 * (other.at - self.at)  # ms: a second per call in between

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: calls.append("sync"))
    seconds = device.free_running_seconds(lambda: calls.append("step"), 5, 2,
                                          torch.device("cuda"))
    assert calls == ["step"] * 2 + ["record"] + ["step"] * 5 + ["record", "sync"]
    assert seconds == 6 / 5  # 6 calls from the first record to the last, over 5 steps


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's prctl")
def test_the_parent_death_signal_is_set_and_cleared():
    libc, got = ctypes.CDLL(None), ctypes.c_int(-1)
    PR_GET_PDEATHSIG = 2  # linux/prctl.h
    try:
        processes.set_parent_death_signal(signal.SIGTERM)
        libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(got))
        assert got.value == signal.SIGTERM
    finally:
        processes.set_parent_death_signal(0)
    libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(got))
    assert got.value == 0


def test_train_says_in_one_line_when_torch_has_no_kernels_for_the_gpu(cli, monkeypatch,
                                                                      tmp_path):
    """Before the first step: not a 'no kernel image' traceback once the job has started
    (simulated: the check's answer for a GPU the build lacks, on a CPU run)."""
    from conftest import train_args

    import perencode.training.loop as train_module

    line = "NVIDIA B200 is sm_100, and torch 2.1.1+cu121 (CUDA 12.1) has kernels for sm_90 only"
    monkeypatch.setattr(train_module, "kernel_support", lambda d: line)
    code, text = cli(*train_args(tmp_path / "run", "train.iterations=2", "task.vocab_size=8",
                                 "task.length=4"))
    assert code == 0, text
    assert [row for row in text.splitlines() if "no kernels" in row or "sm_100" in row] == \
        [f"warning: {line}"]
