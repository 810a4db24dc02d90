"""Read a folder made by `perencode lm-prepare` (flat and memory-mapped, as nanoGPT's prepare.py).

Layout: `<split>.bin` holds the SentencePiece ids of every kept paragraph back to back
(uint16 when the vocabulary fits, else int32); `<split>.idx` holds int64 offsets, so
paragraph i is `bin[idx[i]:idx[i+1]]`; `manifest.json` lists every other file with its
SHA-256, and the counts and options of the build.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perencode.common.errors import UserError

FORMAT = "perencode-lm-data"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SPLITS = ("train", "valid", "test")
REBUILD = "run `perencode lm-prepare` again"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def file_record(path: Path) -> dict:
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def read_manifest(root: Path) -> dict:
    """The manifest of a prepared folder; UserError if it is missing, unreadable or foreign."""
    path = root / MANIFEST
    if not path.is_file():
        raise UserError(f"{root}: no {MANIFEST}; run `perencode lm-prepare`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise UserError(f"{path}: not readable JSON; {REBUILD}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserError(f"{path}: not a manifest of `perencode lm-prepare`")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise UserError(f"{path}: format version {manifest.get('format_version')}, this "
                        f"perencode reads {FORMAT_VERSION}; {REBUILD}")
    return manifest


def check_files(root: Path, manifest: dict) -> None:
    """Every file the manifest lists exists with its size and SHA-256; else UserError."""
    for name, expected in manifest["files"].items():
        path = root / name
        if not path.is_file():
            raise UserError(f"{path}: missing (listed in {MANIFEST}); {REBUILD}")
        if path.stat().st_size != expected["bytes"] or sha256_file(path) != expected["sha256"]:
            raise UserError(f"{path}: contents differ from its SHA-256 in {MANIFEST} "
                            f"(changed or corrupted); {REBUILD}")


@dataclass
class Split:
    """One split: paragraph i is `tokens[offsets[i]:offsets[i + 1]]` (SentencePiece ids)."""

    tokens: np.ndarray  # [N_tokens], memory-mapped
    offsets: np.ndarray  # [N + 1] int64

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)  # [N]


def load(root: str | Path, vocab_size: int | None = None,
         max_tokens: int | None = None) -> dict[str, Split]:
    """Verify a prepared folder (manifest, hashes, sizes) and memory-map its splits.

    `vocab_size` / `max_tokens`, when given, must be what the folder was prepared with
    (the recipe's task.vocab_size and task.length).
    """
    root = Path(root)
    manifest = read_manifest(root)
    check_files(root, manifest)
    if vocab_size is not None and vocab_size != manifest["vocab_size"]:
        raise UserError(f"{root}: prepared with a {manifest['vocab_size']}-piece vocabulary "
                        f"but task.vocab_size = {vocab_size}; set task.vocab_size = "
                        f"{manifest['vocab_size']} or prepare with --vocab-size {vocab_size}")
    if max_tokens is not None and max_tokens != manifest["max_tokens"]:
        raise UserError(f"{root}: prepared with --max-tokens {manifest['max_tokens']} but "
                        f"task.length = {max_tokens}; set task.length = "
                        f"{manifest['max_tokens']} or prepare with --max-tokens {max_tokens}")
    dtype = np.dtype(manifest["token_dtype"])
    splits = {}
    for name in SPLITS:
        offsets = np.fromfile(root / f"{name}.idx", dtype=np.int64)
        if len(offsets) < 2:
            raise UserError(f"{root}: split '{name}' has no usable paragraph (each needs at "
                            f"least 2 tokens)")
        tokens = np.memmap(root / f"{name}.bin", dtype=dtype, mode="r")
        splits[name] = Split(tokens=tokens, offsets=offsets)
    return splits
