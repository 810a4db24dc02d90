"""Confidence intervals of the figures and the verify report (docs/paper-facts.md#error-bars).

The paper's error bars are "the 95% confidence interval estimated from 10,000 bootstrapped
samples of five training-test trials". The repository has no plotting code, so the
percentile bootstrap of the mean is our reading (REPRODUCE.md says so).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# A group of measurements: a list, or a column's values.
Values = Sequence[float] | np.ndarray


def _resampled_means(values: np.ndarray, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    picks = rng.integers(0, len(values), size=(n_resamples, len(values)))  # [R, n]
    return values[picks].mean(axis=1)  # [R]


def _clean(values: Values) -> np.ndarray:
    arr = np.asarray(values, dtype=float).ravel()
    return arr[~np.isnan(arr)]


def bootstrap_ci(values: Values, n_resamples: int = 10_000, seed: int = 0,
                 confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): percentile-bootstrap CI of the mean of `values` (NaNs dropped).

    One value gives a zero-width interval; no value gives NaNs. Deterministic for a seed.
    """
    arr = _clean(values)
    if len(arr) == 0:
        return (float("nan"),) * 3
    means = _resampled_means(arr, n_resamples, np.random.default_rng(seed))
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(arr.mean()), float(low), float(high)


def bootstrap_diff_ci(a: Values, b: Values, n_resamples: int = 10_000,
                      seed: int = 0, confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean(a) - mean(b), low, high): the two groups are resampled independently
    (different runs, e.g. PE and vanilla trials of the same cell)."""
    xa, xb = _clean(a), _clean(b)
    if len(xa) == 0 or len(xb) == 0:
        return (float("nan"),) * 3
    rng = np.random.default_rng(seed)
    diffs = _resampled_means(xa, n_resamples, rng) - _resampled_means(xb, n_resamples, rng)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(diffs, [alpha, 1.0 - alpha])
    return float(xa.mean() - xb.mean()), float(low), float(high)
