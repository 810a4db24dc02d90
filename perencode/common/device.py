"""Where work runs: the torch device of `--device`, the GPUs a sweep spreads over, and the
memory a run may use on its device (on the CPU, what perencode.common.host says this process
may take)."""

from __future__ import annotations

import os
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch

from perencode.common.errors import UserError
from perencode.common.host import memory_available


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


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def device_memory(device: torch.device) -> tuple[int, str] | None:
    """(bytes a run can use on `device`, what they are): the free memory of a CUDA device
    (what other processes, other runs sharing it among them, leave: cudaMemGetInfo),
    `memory_available()` on the CPU; None where it cannot be told."""
    if device.type == "cuda":
        index = _index(device)
        free, total = torch.cuda.mem_get_info(index)
        name = torch.cuda.get_device_properties(index).name
        return free, f"{device} ({name}: free of its {total / (1 << 30):.1f} GiB)"
    return memory_available()


# Set by a sweep for a run it starts on a GPU: how many runs will share that GPU with it
# (`--runs-per-gpu`; 1 for a run started beside others already there, whose memory the
# free memory leaves out).
RUNS_SHARING_ENV = "PERENCODE_RUNS_SHARING"


def runs_sharing() -> int:
    """The runs this one's memory preflight counts on its device (RUNS_SHARING_ENV; 1)."""
    value = os.environ.get(RUNS_SHARING_ENV, "")
    return int(value) if value.isdigit() and int(value) >= 1 else 1


# What a checkpoint written on the CPU records as its device's model (`device_model`).
CPU_MODEL = "cpu"


def device_model(device: torch.device) -> str:
    """The model of `device` as a checkpoint records it: the GPU's name and multiprocessor
    count (CUDA's random draws depend on the count), CPU_MODEL on the CPU (the Mersenne
    Twister draws the same on every CPU)."""
    if device.type != "cuda":
        return CPU_MODEL
    props = torch.cuda.get_device_properties(_index(device))
    return f"{props.name} ({props.multi_processor_count} multiprocessors)"


def runs_on(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """Whether a torch build with kernels for `arch_list` (torch.cuda.get_arch_list():
    'sm_80', 'compute_90', ...) runs on a GPU of compute `capability` (major, minor).
    A cubin runs on GPUs of its major version and an equal or higher minor one; PTX
    ('compute_XY') is compiled by the driver for any GPU at or above XY. An
    architecture-specific cubin ('sm_90a') runs on its own GPU only."""
    major, minor = capability
    for arch in arch_list:
        kind, _, number = arch.partition("_")
        if not number.isdigit() or len(number) < 2:
            continue
        built = (int(number[:-1]), int(number[-1]))
        if kind == "sm" and built[0] == major and built[1] <= minor:
            return True
        if kind == "compute" and built <= capability:
            return True
    return False


def kernel_support(device: torch.device) -> str | None:
    """None where this torch build has kernels for the GPU `device` (or `device` is the
    CPU); else one line naming the GPU's architecture and those the build was made for:
    its first CUDA kernel would fail with "no kernel image is available"."""
    if device.type != "cuda":
        return None
    index = _index(device)
    capability = torch.cuda.get_device_capability(index)
    built = torch.cuda.get_arch_list()
    if runs_on(capability, built):
        return None
    major, minor = capability
    return (f"{torch.cuda.get_device_name(index)} is sm_{major}{minor}, and torch "
            f"{torch.__version__} (CUDA {torch.version.cuda}) has kernels for "
            f"{', '.join(built) or 'no architecture'} only: its CUDA kernels will fail "
            f"there with 'no kernel image is available'; install a torch built for "
            f"sm_{major}{minor}")




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


def synchronize(device: torch.device) -> None:
    """Wait for `device`'s queued work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_running_seconds(step: Callable[[], object], iterations: int, warmup: int,
                         device: torch.device) -> float:
    """Seconds per call of `step`, called back to back as training calls it and
    synchronised once, at the end: a host-device sync inside the step costs what it costs
    in training. On a GPU the time is CUDA events' (the device's clock from the first
    call's work to the last's), on the CPU the wall clock's."""
    for _ in range(warmup):
        step()
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(iterations):
            step()
        return (time.perf_counter() - t0) / iterations
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        step()
    end.record()
    synchronize(device)
    return start.elapsed_time(end) / 1e3 / iterations  # elapsed_time is in milliseconds


# What torch's sync debug mode warns with at each host-device synchronisation.
SYNC_WARNING = "called a synchronizing CUDA operation"


def host_syncs(step: Callable[[], object], device: torch.device, calls: int = 3
               ) -> tuple[float, dict[str, float]] | None:
    """Host-device synchronisations per call of `step` on the CUDA `device`, counted by
    torch's sync debug mode after one call to warm up: (per call, per call by the Python
    line that asked for them). None on the CPU, where the host runs the kernels itself
    and never waits for a device."""
    if device.type != "cuda":
        return None
    step()
    synchronize(device)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(calls):
                step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    where = Counter(f"{Path(w.filename).name}:{w.lineno}" for w in caught
                    if SYNC_WARNING in str(w.message))
    return sum(where.values()) / calls, {k: n / calls for k, n in where.items()}
