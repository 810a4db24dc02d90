"""The bootstrap behind every error bar and verify CI (perencode.analysis.stats;
docs/paper-facts.md#error-bars)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perencode.analysis.stats import (
    at_bound,
    bootstrap_ci,
    bootstrap_diff_ci,
    difference_p_values,
    difference_test,
    mean_p_values,
    mean_test,
    outliers,
)


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


# -- the verdict statistics: known answers -------------------------------------------------

def test_t_distribution_known_values():
    from perencode.analysis.stats import t_quantile, t_sf

    # Tables of Student's t: t(0.975; 2) = 4.3027, t(0.95; 4) = 2.1318, t(0.975; 1) = 12.706;
    # a million degrees of freedom is the normal's 1.6449.
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-5)
    assert t_quantile(0.95, 4) == pytest.approx(2.131847, abs=1e-5)
    assert t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-3)
    assert t_quantile(0.95, 1e6) == pytest.approx(1.644854, abs=1e-4)
    assert t_quantile(0.05, 4) == pytest.approx(-2.131847, abs=1e-5)
    assert float(t_sf(0.0, 3.7)) == pytest.approx(0.5)
    # Cauchy (1 df): P(T > 1) = 1/4; fractional df is smooth between its neighbours.
    assert float(t_sf(1.0, 1)) == pytest.approx(0.25)
    assert float(t_sf(2.0, 3)) < float(t_sf(2.0, 2.5)) < float(t_sf(2.0, 2))


def test_welch_on_the_readme_numbers():
    """The six numbers of the old README: the bootstrap's 95% CI [+0.027, +0.124] excludes 0,
    Welch's 95% interval does not: [-0.0475, +0.2129] at the Welch-Satterthwaite 2.15
    degrees of freedom ([-0.057, +0.222] with them floored to 2, as the issue computed);
    the one-sided test misses 0.05 (p = 0.058)."""
    from perencode.analysis.stats import difference_test

    pe, vanilla = [0.279, 0.300, 0.196], [0.170, 0.188, 0.169]
    test = difference_test(pe, vanilla, 0.0, alpha=0.025)  # both 2.5% ends: the 95% interval
    assert test.method == "Welch t" and test.n == (3, 3)
    assert (test.low, test.high) == pytest.approx((-0.0475, 0.2129), abs=1e-4)
    assert test.p_above == pytest.approx(0.0582, abs=1e-3)
    assert bootstrap_diff_ci(pe, vanilla)[1] > 0  # the paper's method: "significant"


def test_constant_cells_use_exact_tests():
    from perencode.analysis.stats import difference_test, mean_test

    five = mean_test([1.0] * 5, 0.95, bounded=True)
    assert five.method == "exact sign test" and five.p_above == 0.5 ** 5 and five.p_below == 1
    assert mean_test([1.0] * 3, 0.95).p_above == 0.125  # 3 seeds cannot reach 0.05
    assert mean_test([0.95] * 4, 0.95).p_above == 1.0   # on the threshold: nothing shown
    apart = difference_test([1.0] * 3, [0.5] * 3)
    assert apart.method == "exact permutation test" and apart.p_above == pytest.approx(0.05)
    assert difference_test([0.5] * 3, [0.5] * 3).p_above == 1.0
    # One group constant: Welch's t with the other group's spread (df = n_b - 1).
    one = difference_test([1.0] * 3, [0.5, 0.6, 0.7])
    assert one.method == "Welch t" and one.sd[0] == 0


def test_seeds_to_decide():
    from perencode.analysis.stats import difference_test, mean_test, seeds_to_decide

    # Normal approximation: n = (z_0.95 + z_0.8)^2 (sd_a^2 + sd_b^2) / gap^2 = 2.486^2 * 2 / 0.25
    # = 49.4 for a gap of half of each group's sd; t quantiles add a little.
    rng = np.random.default_rng(0)
    a = rng.normal(0.0, 1.0, size=4)
    a = (a - a.mean()) / a.std(ddof=1) + 0.5
    b = rng.normal(0.0, 1.0, size=4)
    b = (b - b.mean()) / b.std(ddof=1)
    n = seeds_to_decide(difference_test(a, b))
    assert n is not None and 50 <= n <= 52
    assert seeds_to_decide(difference_test([0.5, 0.6], [0.5, 0.6])) is None  # no gap
    assert seeds_to_decide(mean_test([1.0] * 3, 0.95)) == 5  # the sign test's 2^-5
    assert seeds_to_decide(difference_test([1.0, 1.0], [0.5, 0.5])) == 3  # 1 / C(6, 3)


# -- the verdict statistics: their level, measured by simulation ---------------------------
# A verdict passes a claim "quantity > threshold" when the one-sided test rejects at the
# alpha the output states: 0.05 for a difference (Welch), 0.025 for a threshold on a metric
# in [0, 1] (Student's t with the variance at the threshold), 0.05 for the exact tests of
# constant cells. Under a null at the boundary, "false pass" is the claim "> truth" passing
# and "false fail" the claim ">= truth" (true there) failing; each must stay within alpha +
# 2.5 points on the shapes where docs/claims.md says the level holds. MEASURED states the
# rates (4,000 draws, these seeds: the tests check them to a point). On the shapes that
# break every test at these seed counts (issue 55's audit: seeds stuck on a plateau, most
# seeds at exactly 1.0, a skewed group beside a tight one) the level is stated as broken,
# and the tests check what the output does about it: the runs' shape is said on the
# verdict's line whenever the draw shows it (stats.outliers, stats.at_bound).

ALPHA, TOLERANCE, DRAWS = 0.05, 0.025, 4000


def _beta(rng, mean, concentration, size):
    return rng.beta(mean * concentration, (1 - mean) * concentration, size=size)


def _proportion(rng, mean, concentration, size, items=2000):
    """A seed's accuracy over `items` test items, its true rate drawn from a beta."""
    return rng.binomial(items, _beta(rng, mean, concentration, size)) / items


def _solved_often(rng, mean_rest, size, solved=0.3):
    """A run solves the task exactly (1.0) with probability `solved`, else a beta: constant
    cells are frequent."""
    rest = _beta(rng, mean_rest, 40, size)
    return np.where(rng.random(size) < solved, 1.0, rest)


def _stuck(rng, size, stuck=0.1, good=0.99, plateau=0.17):
    """This paper's usual outcome: solved on most seeds, stuck on the last-token plateau
    (about 1/L) on some."""
    return np.where(rng.random(size) < stuck, _beta(rng, plateau, 400, size),
                    _beta(rng, good, 300, size))


def _at_one(rng, size, share=0.8, rest=0.75):
    """Most seeds at exactly 1.0 (mean 0.95 with the defaults)."""
    return np.where(rng.random(size) < share, 1.0, _beta(rng, rest, 20, size))


def _rejects(p, exact, alpha):
    return p <= np.where(exact, ALPHA, alpha)


# name -> (draw(rng, size), true mean); threshold tests of a metric in [0, 1] except normal
ONE_SAMPLE = {
    "normal": (lambda rng, size: rng.normal(0.5, 0.05, size), 0.5),
    "beta(19, 1), mean 0.95": (lambda rng, size: _beta(rng, 0.95, 20, size), 0.95),
    "beta(99, 1), mean 0.99": (lambda rng, size: _beta(rng, 0.99, 100, size), 0.99),
    "beta(1, 19), mean 0.05": (lambda rng, size: _beta(rng, 0.05, 20, size), 0.05),
    "beta(9, 1), mean 0.9": (lambda rng, size: _beta(rng, 0.9, 10, size), 0.9),
    "proportion, mean 0.97": (lambda rng, size: _proportion(rng, 0.97, 30, size), 0.97),
    "solved 30%, else mean 0.9": (lambda rng, size: _solved_often(rng, 0.9, size),
                                  0.3 + 0.7 * 0.9),
}
ONE_SAMPLE_BREAKS = {
    "80% of seeds at 1.0, mean 0.95": (_at_one, 0.8 + 0.2 * 0.75),
    "10% stuck at 0.17, else 0.99": (_stuck, 0.1 * 0.17 + 0.9 * 0.99),
}

# name -> (draw a, draw b, true difference); Welch's t at the full alpha
TWO_SAMPLE = {
    "normal, equal spread": (lambda rng, size: rng.normal(0.3, 0.05, size),
                             lambda rng, size: rng.normal(0.2, 0.05, size), 0.1),
    "normal, spread 10x apart": (lambda rng, size: rng.normal(0.3, 0.1, size),
                                 lambda rng, size: rng.normal(0.2, 0.01, size), 0.1),
    "beta near 1, same shape": (lambda rng, size: _beta(rng, 0.95, 20, size),
                                lambda rng, size: _beta(rng, 0.95, 20, size), 0.0),
    "beta 0.99 vs 0.9": (lambda rng, size: _beta(rng, 0.99, 50, size),
                         lambda rng, size: _beta(rng, 0.9, 50, size), 0.09),
    "beta 0.1 vs 0.02": (lambda rng, size: _beta(rng, 0.1, 30, size),
                         lambda rng, size: _beta(rng, 0.02, 30, size), 0.08),
    "proportions 0.97 vs 0.9": (lambda rng, size: _proportion(rng, 0.97, 30, size),
                                lambda rng, size: _proportion(rng, 0.9, 30, size), 0.07),
    "solved often, both": (lambda rng, size: _solved_often(rng, 0.9, size, solved=0.6),
                           lambda rng, size: _solved_often(rng, 0.9, size, solved=0.6), 0.0),
    "10% stuck, both": (_stuck, _stuck, 0.0),
}
TWO_SAMPLE_BREAKS = {
    "80% at 1.0 beside a tight 0.95": (_at_one, lambda rng, size: _beta(rng, 0.95, 2000, size),
                                       0.0),
    "10% stuck beside a tight group": (_stuck, lambda rng, size: _beta(
        rng, 0.1 * 0.17 + 0.9 * 0.99, 3000, size), 0.0),
    "beta 0.95 skewed beside a tight 0.95": (lambda rng, size: _beta(rng, 0.95, 20, size),
                                             lambda rng, size: _beta(rng, 0.95, 300, size),
                                             0.0),
}

# (shape, n) -> (false pass, false fail), measured with the draws below
MEASURED: dict[tuple[str, int], tuple[float, float]] = {
    ('normal', 3): (0.056, 0.056),
    ('beta(19, 1), mean 0.95', 3): (0.051, 0.005),
    ('beta(99, 1), mean 0.99', 3): (0.048, 0.006),
    ('beta(1, 19), mean 0.05', 3): (0.007, 0.043),
    ('beta(9, 1), mean 0.9', 3): (0.041, 0.009),
    ('proportion, mean 0.97', 3): (0.047, 0.005),
    ('solved 30%, else mean 0.9', 3): (0.002, 0.025),
    ('80% of seeds at 1.0, mean 0.95', 3): (0.000, 0.006),
    ('10% stuck at 0.17, else 0.99', 3): (0.693, 0.001),
    ('normal, equal spread', 3): (0.046, 0.045),
    ('normal, spread 10x apart', 3): (0.059, 0.046),
    ('beta near 1, same shape', 3): (0.026, 0.029),
    ('beta 0.99 vs 0.9', 3): (0.038, 0.070),
    ('beta 0.1 vs 0.02', 3): (0.030, 0.068),
    ('proportions 0.97 vs 0.9', 3): (0.036, 0.057),
    ('solved often, both', 3): (0.021, 0.019),
    ('10% stuck, both', 3): (0.019, 0.018),
    ('80% at 1.0 beside a tight 0.95', 3): (0.517, 0.005),
    ('10% stuck beside a tight group', 3): (0.729, 0.002),
    ('beta 0.95 skewed beside a tight 0.95', 3): (0.144, 0.015),
    ('normal', 5): (0.050, 0.041),
    ('beta(19, 1), mean 0.95', 5): (0.054, 0.005),
    ('beta(99, 1), mean 0.99', 5): (0.058, 0.004),
    ('beta(1, 19), mean 0.05', 5): (0.004, 0.058),
    ('beta(9, 1), mean 0.9', 5): (0.053, 0.006),
    ('proportion, mean 0.97', 5): (0.059, 0.004),
    ('solved 30%, else mean 0.9', 5): (0.006, 0.024),
    ('80% of seeds at 1.0, mean 0.95', 5): (0.325, 0.001),
    ('10% stuck at 0.17, else 0.99', 5): (0.586, 0.001),
    ('normal, equal spread', 5): (0.052, 0.046),
    ('normal, spread 10x apart', 5): (0.052, 0.046),
    ('beta near 1, same shape', 5): (0.040, 0.034),
    ('beta 0.99 vs 0.9', 5): (0.031, 0.075),
    ('beta 0.1 vs 0.02', 5): (0.026, 0.070),
    ('proportions 0.97 vs 0.9', 5): (0.030, 0.063),
    ('solved often, both', 5): (0.035, 0.036),
    ('10% stuck, both', 5): (0.019, 0.016),
    ('80% at 1.0 beside a tight 0.95', 5): (0.337, 0.006),
    ('10% stuck beside a tight group', 5): (0.596, 0.000),
    ('beta 0.95 skewed beside a tight 0.95', 5): (0.144, 0.012),
}


def _one_sample(name, n):
    draw, mean = {**ONE_SAMPLE, **ONE_SAMPLE_BREAKS}[name]
    x = draw(np.random.default_rng(n), (DRAWS, n))
    bounded = name != "normal"
    p_above, p_below, exact = mean_p_values(x, mean, bounded)
    alpha = ALPHA / 2 if bounded else ALPHA
    return x, _rejects(p_above, exact, alpha), _rejects(p_below, exact, alpha)


def _two_sample(name, n):
    draw_a, draw_b, difference = {**TWO_SAMPLE, **TWO_SAMPLE_BREAKS}[name]
    rng = np.random.default_rng(10 + n)
    a, b = draw_a(rng, (DRAWS, n)), draw_b(rng, (DRAWS, n))
    p_above, p_below, exact = difference_p_values(a, b, difference)
    return (a, b), _rejects(p_above, exact, ALPHA), _rejects(p_below, exact, ALPHA)


@pytest.mark.parametrize("n", [3, 5])
@pytest.mark.parametrize("name", list(ONE_SAMPLE))
def test_threshold_verdicts_hold_their_level(name, n):
    _, false_pass, false_fail = _one_sample(name, n)
    rates = (false_pass.mean(), false_fail.mean())
    assert max(rates) <= ALPHA + TOLERANCE
    assert rates == pytest.approx(MEASURED[(name, n)], abs=0.01)


@pytest.mark.parametrize("n", [3, 5])
@pytest.mark.parametrize("name", list(TWO_SAMPLE))
def test_difference_verdicts_hold_their_level(name, n):
    _, false_pass, false_fail = _two_sample(name, n)
    rates = (false_pass.mean(), false_fail.mean())
    assert max(rates) <= ALPHA + TOLERANCE
    assert rates == pytest.approx(MEASURED[(name, n)], abs=0.01)


def _shown(*groups):
    """Per draw: the verdict's line names the shape (a seed split off, a seed at a bound)."""
    return np.array([any(outliers(g[i]) or at_bound(g[i]) for g in groups)
                     for i in range(len(groups[0]))])


# (shape, n) -> share of the false passes (either side) whose runs showed the shape
SHOWN: dict[tuple[str, int], float] = {
    ('80% of seeds at 1.0, mean 0.95', 3): 0.00,
    ('10% stuck at 0.17, else 0.99', 3): 0.05,
    ('80% at 1.0 beside a tight 0.95', 3): 0.99,
    ('10% stuck beside a tight group', 3): 0.11,
    ('beta 0.95 skewed beside a tight 0.95', 3): 0.12,
    ('80% of seeds at 1.0, mean 0.95', 5): 1.00,
    ('10% stuck at 0.17, else 0.99', 5): 0.08,
    ('80% at 1.0 beside a tight 0.95', 5): 1.00,
    ('10% stuck beside a tight group', 5): 0.12,
    ('beta 0.95 skewed beside a tight 0.95', 5): 0.15,
}


@pytest.mark.parametrize("n", [3, 5])
@pytest.mark.parametrize("name", list(ONE_SAMPLE_BREAKS) + list(TWO_SAMPLE_BREAKS))
def test_shapes_that_break_the_level_are_said_when_the_runs_show_them(name, n):
    """No test holds the level on these shapes at 3-5 seeds (docs/claims.md#shapes): the
    rates are stated, and a false pass comes with the shape said on its line whenever the
    draw shows a seed split off or at a bound; the stuck shapes' other false passes are
    draws that never saw a stuck seed (a failure mode of probability p goes unseen in n
    seeds with probability (1 - p)^n: 0.9^3 = 73%). A skewed group beside a tight one is
    not detected (SHOWN: 12-15%, by chance): docs/claims.md lists it as not covered."""
    groups, false_pass, false_fail = (_one_sample if name in ONE_SAMPLE_BREAKS
                                      else _two_sample)(name, n)
    groups = groups if isinstance(groups, tuple) else (groups,)
    rates = (false_pass.mean(), false_fail.mean())
    # The level is broken, and the docs say so; at 3 seeds the sign test of a cell all at
    # 1.0 (p = 1/8) cannot pass, so most seeds at 1.0 break it from 5 seeds on.
    assert (max(rates) > ALPHA + TOLERANCE) == ((name, n) != ("80% of seeds at 1.0, mean 0.95",
                                                              3))
    assert rates == pytest.approx(MEASURED[(name, n)], abs=0.01)
    wrong = false_pass | false_fail
    shown = _shown(*groups)
    assert (shown & wrong).sum() / wrong.sum() == pytest.approx(SHOWN[(name, n)], abs=0.02)
    if "stuck" in name:  # the unseen ones: every seed of a group on one side of 0.5
        unseen = wrong & ~shown
        assert all(((g[unseen] > 0.5).all(axis=1) | (g[unseen] < 0.5).all(axis=1)).all()
                   for g in groups)


def _bootstrap_diffs(a, b, resamples=1000, seed=0):
    """The paper's percentile bootstrap of mean(a) - mean(b) for every row: [D, R]."""
    rng = np.random.default_rng(seed)
    n_a, n_b = a.shape[1], b.shape[1]
    pick_a = rng.integers(0, n_a, size=(resamples, n_a))
    pick_b = rng.integers(0, n_b, size=(resamples, n_b))
    return a[:, pick_a].mean(axis=2) - b[:, pick_b].mean(axis=2)


@pytest.mark.parametrize("n, most", [(3, 0.85), (5, 0.92)])
def test_the_papers_bootstrap_does_not_hold_its_level(n, most):
    """The rule verdicts used before (pass when the 95% percentile-bootstrap CI lies above
    the threshold) fails the test above: its interval of a difference covers the truth about
    79% of the time at 3 seeds per side and 88% at 5 (normal data, true difference 0.1),
    and its false passes exceed 2.5% + 2.5 points, where Welch's do not."""
    from perencode.analysis.stats import difference_p_values

    rng = np.random.default_rng(5)
    a, b = rng.normal(0.3, 0.05, (2000, n)), rng.normal(0.2, 0.05, (2000, n))
    low, high = np.quantile(_bootstrap_diffs(a, b), [0.025, 0.975], axis=1)
    assert ((low <= 0.1) & (0.1 <= high)).mean() < most
    assert (low > 0.1).mean() > 0.025 + TOLERANCE
    p_above, _, exact = difference_p_values(a, b, 0.1)
    assert _rejects(p_above, exact, False).mean() <= 0.05 + TOLERANCE


@pytest.mark.parametrize("n, least", [(3, 0.6), (5, 0.95)])
def test_the_conservative_rule_still_decides_clear_cases(n, least):
    """Power of the bounded rule (alpha halved, variance at the threshold): seeds at 0.99
    (sd 0.007) against the paper's 95% threshold pass most of the time; measured 0.72 at 3
    seeds and 0.99 at 5."""
    from perencode.analysis.stats import mean_p_values

    rng = np.random.default_rng(7)
    x = _beta(rng, 0.99, 200, (DRAWS, n))
    p_above, _, exact = mean_p_values(x, 0.95, True)
    assert _rejects(p_above, exact, True).mean() >= least


def test_bounds_of_a_bounded_metric_stay_in_its_range():
    from perencode.analysis.stats import difference_test, mean_test

    near_one = mean_test([0.99, 0.985, 0.995], 0.95, bounded=True)
    assert near_one.high == 1.0 and 0.95 < near_one.low < 0.99
    assert mean_test([0.99, 0.97, 1.0], 0.95).high > 1.0  # unbounded: as computed
    assert difference_test([0.0, 0.5, 1.0], [1.0, 0.5, 0.0], alpha=0.005,
                           bounded=True).low == -1.0


def test_welch_at_the_full_alpha_keeps_the_power_halving_cost():
    """The quick demo's K = 1,024 truth (PE 0.262, sd 0.045; vanilla 0.174, sd 0.009) at 3 + 3
    seeds: Welch's t at alpha = 0.05 decides 71% of the time, at the halved 0.025 it did 49%
    (issue 55); the level of a difference of groups of one shape holds at the full alpha
    (test_difference_verdicts_hold_their_level)."""
    rng = np.random.default_rng(3)
    a, b = rng.normal(0.262, 0.045, (DRAWS, 3)), rng.normal(0.174, 0.009, (DRAWS, 3))
    p_above, _, _ = difference_p_values(a, b, 0.0)
    assert (p_above <= 0.05).mean() == pytest.approx(0.71, abs=0.02)
    assert (p_above <= 0.025).mean() == pytest.approx(0.49, abs=0.02)
    assert difference_test([0.3, 0.31, 0.32], [0.2, 0.21, 0.22], bounded=True).alpha == 0.05


def test_smaller_items_of_the_statistics():
    """t_sf(nan) is NaN (was 0.5); one value is no test (was a math domain error); the t
    quantile is fast (was 16 ms a call) and agrees with t_sf."""
    import time

    from perencode.analysis.stats import t_quantile, t_sf

    assert math.isnan(float(t_sf(math.nan, 3))) and math.isnan(float(t_sf(1.0, math.nan)))
    one = mean_test([0.5], 0.3)
    assert one.method == "no test: fewer than two values in a group" and one.p_above == 1.0
    assert one.estimate == 0.5 and math.isnan(one.low)
    assert difference_test([0.5], [0.2, 0.3]).method.startswith("no test")
    raw = t_quantile.__wrapped__
    start = time.perf_counter()
    for i in range(200):
        df, q = 1.5 + i * 0.37, 0.9 + 0.0004 * i
        t = raw(q, df)
        assert float(t_sf(t, df)) == pytest.approx(1 - q, rel=1e-7)
    assert (time.perf_counter() - start) / 200 < 0.008  # seconds a call, loaded machine
