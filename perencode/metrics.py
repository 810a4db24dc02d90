"""Sequence metrics (SPEC §5)."""

from __future__ import annotations

import numpy as np
from rapidfuzz.distance import DamerauLevenshtein


def dl_distance(prediction, target) -> int:
    """Unrestricted Damerau-Levenshtein distance between two token sequences."""
    return DamerauLevenshtein.distance(prediction, target)


def dl_distances(predictions: np.ndarray, targets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Row-wise DL distance of [N, T] arrays, each row cut to its own length."""
    return np.array([
        dl_distance(p[:n].tolist(), t[:n].tolist())
        for p, t, n in zip(predictions, targets, lengths)
    ], dtype=np.int64)
