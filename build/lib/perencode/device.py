"""Where work runs: the torch device of `--device`, the cores and GPUs a sweep spreads over."""

from __future__ import annotations

import os

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
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


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
