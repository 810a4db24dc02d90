"""The bootstrap behind every error bar and verify CI (perencode.stats;
docs/paper-facts.md#error-bars)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perencode.stats import bootstrap_ci, bootstrap_diff_ci


def test_two_values_known_percentiles():
    # Resampled means of [0, 1] are 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4: the 2.5%
    # and 97.5% percentiles are exactly 0 and 1.
    mean, low, high = bootstrap_ci([0.0, 1.0])
    assert (mean, low, high) == (0.5, 0.0, 1.0)


def test_deterministic_and_seeded():
    values = np.random.default_rng(0).normal(size=20)
    assert bootstrap_ci(values) == bootstrap_ci(values)
    assert bootstrap_ci(values, seed=1) != bootstrap_ci(values, seed=2)


def test_interval_holds_the_mean_and_stays_in_range():
    values = [0.91, 0.95, 0.97, 0.88, 0.99]
    mean, low, high = bootstrap_ci(values)
    assert mean == pytest.approx(np.mean(values))
    assert min(values) <= low <= mean <= high <= max(values)


def test_single_value_and_empty_and_nan():
    assert bootstrap_ci([0.7]) == (0.7, 0.7, 0.7)
    assert all(math.isnan(v) for v in bootstrap_ci([]))
    assert bootstrap_ci([0.2, float("nan"), 0.2]) == (0.2, 0.2, 0.2)


def test_interval_narrows_with_more_trials():
    rng = np.random.default_rng(0)
    few, many = rng.normal(size=5), rng.normal(size=500)
    _, lo5, hi5 = bootstrap_ci(few)
    _, lo500, hi500 = bootstrap_ci(many)
    assert hi500 - lo500 < hi5 - lo5


def test_coverage_near_95_percent():
    # Percentile intervals of n = 30 normal draws cover the true mean about 95% of the time.
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(200):
        _, low, high = bootstrap_ci(rng.normal(size=30), n_resamples=2000,
                                    seed=int(rng.integers(1 << 30)))
        hits += low <= 0.0 <= high
    assert 0.88 <= hits / 200 <= 0.99


def test_difference_of_independent_groups():
    assert bootstrap_diff_ci([0.9, 0.9], [0.5, 0.5]) == pytest.approx((0.4, 0.4, 0.4))
    diff, low, high = bootstrap_diff_ci([0.9, 1.0, 0.95], [0.2, 0.4, 0.3])
    assert diff == pytest.approx(0.65) and low <= diff <= high and low > 0
    assert all(math.isnan(v) for v in bootstrap_diff_ci([], [1.0]))
