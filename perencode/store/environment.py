"""The environment report: what `perencode env` prints and every run's env.json records
(versions of perencode, its git commit, Python, torch, CUDA and cuDNN, the device, threads,
and the packages results depend on)."""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

import perencode
from perencode.common.device import device_model
from perencode.common.host import available_cores
from perencode.config import plugins

PACKAGE_DIR = Path(perencode.__file__).resolve().parent


# Where the package is no git checkout (a wheel, a container image), the commit it was built
# from can be given here; the Docker image sets it from a build argument.
GIT_COMMIT_VARIABLE = "PERENCODE_GIT_COMMIT"
PACKAGES = ("numpy", "pydantic", "typer", "rich", "pandas", "matplotlib", "seaborn",
            "submitit", "sentencepiece", "tensorboard", "datasets")


def git_commit(folder: str | Path | None = None) -> str | None:
    """HEAD of the git checkout holding `folder` (default: the package); else the variable
    PERENCODE_GIT_COMMIT; else None."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=folder or PACKAGE_DIR, timeout=5)
        commit = out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return commit or os.environ.get(GIT_COMMIT_VARIABLE) or None


def git_dirty(folder: str | Path | None = None) -> bool | None:
    """Whether the checkout holding `folder` (default: the package) has changes that are
    not committed (`git status --porcelain` lists something): its commit alone does not
    say what ran. None where it is no checkout."""
    try:
        out = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True,
                             cwd=folder or PACKAGE_DIR, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


def package_versions() -> dict[str, str | None]:
    """Installed versions (None: not installed), read from the package metadata without
    importing the packages."""
    return dict(_installed())


@functools.lru_cache(maxsize=1)
def _installed() -> tuple[tuple[str, str | None], ...]:
    """PACKAGES' versions, read once per process (each look-up searches every folder on
    sys.path): a process runs with the packages it started with."""
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return tuple(versions.items())


def gpu_driver() -> str | None:
    """The NVIDIA driver's version (nvidia-smi's), or None where there is none to ask."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def gpu_report(device: torch.device) -> dict[str, Any]:
    """What a CUDA result depends on beyond the versions: the GPU's model (its name and
    multiprocessors: CUDA's random draws depend on them), compute capability, the driver,
    the architectures this torch build has kernels for, and the cuDNN and TF32 switches
    as training runs (train.deterministic sets cuDNN's). Nones on the CPU."""
    cuda = device.type == "cuda"
    capability = torch.cuda.get_device_capability(device) if cuda else None
    backends = torch.backends
    return {
        "gpu_model": device_model(device) if cuda else None,
        "compute_capability": "{}.{}".format(*capability) if capability else None,
        "driver": gpu_driver() if cuda else None,
        "torch_cuda_archs": torch.cuda.get_arch_list() if cuda else [],
        "cudnn_deterministic": backends.cudnn.deterministic if cuda else None,
        "cudnn_benchmark": backends.cudnn.benchmark if cuda else None,
        "tf32_cudnn": backends.cudnn.allow_tf32 if cuda else None,
        "tf32_matmul": backends.cuda.matmul.allow_tf32 if cuda else None,
    }


CPUINFO = Path("/proc/cpuinfo")


def cpu_model(cpuinfo: Path = CPUINFO) -> str | None:
    """The CPU's model name ("AMD EPYC 7763 64-Core Processor"): /proc/cpuinfo's `model
    name` on Linux, `sysctl machdep.cpu.brand_string` on macOS, else platform.processor();
    None where nothing says."""
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"],
                                 capture_output=True, text=True, timeout=5).stdout.strip()
            if out:
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or None


def cpu_capability() -> str | None:
    """The vector instruction set torch's CPU kernels run with here (DEFAULT, AVX2,
    AVX512, ...: torch.backends.cpu.get_cpu_capability, torch >= 2.2; torch 2.1 has no
    such call and its build configuration names the highest one compiled in, not the one
    used): what decides whether two CPUs compute the same float digits. None if unknown."""
    backend = getattr(torch.backends, "cpu", None)
    get = getattr(backend, "get_cpu_capability", None)
    if get is None:
        return None
    try:
        return str(get())
    except Exception:  # noqa: BLE001 - a report field, never a crash
        return None


def report(device: torch.device) -> dict[str, Any]:
    """The environment of a run on `device`, as JSON-ready values."""
    cuda = torch.cuda.is_available()
    return {
        "perencode_version": perencode.__version__,
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "device": str(device),
        "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                        else platform.processor() or platform.machine()),
        "cuda_devices": ([torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                         if cuda else []),
        **gpu_report(device),
        # What decides the float digits of a CPU run (and of the CPU side of any run): two
        # machines of the same model and ISA compute the same digits, others need not.
        "cpu_model": cpu_model(),
        "cpu_capability": cpu_capability(),
        "torch_threads": torch.get_num_threads(),
        "cpu_cores": available_cores(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "hostname": platform.node(),
        "packages": package_versions(),
        # Where the kinds that are not the package's own came from (perencode.config.plugins).
        "plugins": plugins.records(),
    }


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def format_report(env: dict[str, Any]) -> str:
    """The report as aligned `key  value` lines for people (`perencode env`)."""
    packages = env.get("packages", {})
    width = max(len(k) for k in [*env, *(f"  {n}" for n in packages)]) + 2
    lines = [f"{k:<{width}}{_text(v)}" for k, v in env.items()
             if k not in ("packages", "plugins")]
    lines.append("packages:")
    lines += [f"{'  ' + n:<{width}}{_text(v)}" for n, v in packages.items()]
    lines.append(f"{'plugins:':<{width}}{'' if env.get('plugins') else 'none'}".rstrip())
    lines += [f"  {plugins.Plugin(**p).describe()}" for p in env.get("plugins", [])]
    return "\n".join(lines)
