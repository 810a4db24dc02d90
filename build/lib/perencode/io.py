"""Atomic file writes and safe checkpoint loading.

Every result or checkpoint is written to a temporary file in the same folder, flushed
and fsync'ed, then renamed over the target: a reader sees the old file or the new one,
never half of one.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from perencode.errors import UserError


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def fsync_dir(path: str | Path) -> None:
    """Make a rename inside `path` durable (the directory entry itself is fsync'ed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def atomic_torch_save(path: str | Path, obj: Any) -> None:
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def safe_torch_load(path: str | Path, kind: str, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint without unpickling arbitrary objects.

    `kind` is the expected `format` tag of the dict (e.g. "perencode-checkpoint"); a file
    that is truncated, corrupted, not a dict or of another kind raises UserError.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: checkpoint file not found")
    try:
        obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to parse means a bad file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(
            f"{path}: not a readable perencode checkpoint (corrupted, truncated or foreign: "
            f"{first[:160]})"
        ) from None
    if not isinstance(obj, dict) or obj.get("format") != kind:
        raise UserError(f"{path}: foreign checkpoint (expected format '{kind}')")
    return obj
