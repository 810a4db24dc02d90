"""How runs are named: the short axis names and value spellings of run directories
(`vocab_size=256/encoding=none/seed=111`), shared by grids, results, figures and verify."""

from __future__ import annotations

import numbers
import os
from collections import Counter
from typing import Any


def short_key(key: str) -> str:
    """`task.vocab_size` -> `vocab_size`; `encoding.kind` -> `encoding`; `task.name` -> `task`."""
    section, _, name = key.rpartition(".")
    return section if name in ("kind", "name") and section else name


def short_names(keys) -> dict[str, str]:
    """Short names for dotted keys; keys whose short names collide keep their dotted form."""
    short = {k: short_key(k) for k in keys}
    counts = Counter(short.values())
    return {k: s if counts[s] == 1 else k for k, s in short.items()}


def format_value(value: Any) -> str:
    """An axis value as it appears in a directory name (stable, no path separators)."""
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, (list, tuple)):
        text = ",".join(format_value(v) for v in value)
    else:
        text = str(value)  # floats: shortest repr, 1e-3 -> 0.001
    return text.replace(os.sep, "-").replace(" ", "_")


def ordered(values) -> list:
    """Distinct axis values in the order a reader expects: numbers by size (32, 64, 128, not
    128, 32, 64), anything else as first seen."""
    distinct = list(dict.fromkeys(values))
    numeric = all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in distinct)
    return sorted(distinct) if numeric else distinct
