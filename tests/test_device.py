"""perencode.device: `--device` resolution, the memory this process may use."""

import ctypes
import signal
import sys
from types import SimpleNamespace

import pytest
import torch

from perencode import device
from perencode.device import resolve_device
from perencode.errors import UserError


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
    """Point perencode.device at a fake /proc/self/cgroup and /sys/fs/cgroup under
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
    monkeypatch.setattr(device, "PROC_CGROUP", tmp_path / "cgroup")
    monkeypatch.setattr(device, "CGROUP_ROOT", root)


def no_slurm(monkeypatch):
    for name in ("SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU", "SLURM_CPUS_ON_NODE"):
        monkeypatch.delenv(name, raising=False)


def test_memory_available_is_the_tightest_limit(monkeypatch, tmp_path):
    no_slurm(monkeypatch)
    (tmp_path / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
    monkeypatch.setattr(device, "MEMINFO", tmp_path / "meminfo")
    simulated_cgroup(monkeypatch, tmp_path)
    assert device.memory_available() == (4000000 << 10, "the free RAM (MemAvailable)")
    # cgroup v2: the tightest memory.max on the way up, "max" being no limit
    simulated_cgroup(monkeypatch, tmp_path, v2={"/a": 3 << 30, "/a/b": "max"})
    assert device.memory_available() == (3 << 30, "this process's cgroup memory limit")
    simulated_cgroup(monkeypatch, tmp_path / "v1", v1=2 << 30)  # v1: "unlimited" ignored
    assert device.memory_available() == (2 << 30, "this process's cgroup memory limit")
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "1024")  # MB
    assert device.memory_available() == (1 << 30, "the SLURM job's memory (--mem)")
    monkeypatch.delenv("SLURM_MEM_PER_NODE")
    monkeypatch.setenv("SLURM_MEM_PER_CPU", "100")
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "3")
    assert device.memory_available() == (300 << 20, "the SLURM job's memory (--mem-per-cpu)")


def test_device_memory_is_the_cuda_total_or_what_this_process_may_use(monkeypatch):
    monkeypatch.setattr(device, "memory_available", lambda: (5, "a limit"))
    assert device.device_memory(torch.device("cpu")) == (5, "a limit")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(total_memory=8 << 30, name="Fake GPU"))
    assert device.device_memory(torch.device("cuda")) == (8 << 30, "cuda (Fake GPU)")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's prctl")
def test_the_parent_death_signal_is_set_and_cleared():
    libc, got = ctypes.CDLL(None), ctypes.c_int(-1)
    PR_GET_PDEATHSIG = 2  # linux/prctl.h
    try:
        device.set_parent_death_signal(signal.SIGTERM)
        libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(got))
        assert got.value == signal.SIGTERM
    finally:
        device.set_parent_death_signal(0)
    libc.prctl(PR_GET_PDEATHSIG, ctypes.byref(got))
    assert got.value == 0
