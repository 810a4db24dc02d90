"""The statistics of figures and verdicts: two methods, each for its own use.

Figures: the paper's error bars, "the 95% confidence interval estimated from 10,000
bootstrapped samples of five training-test trials" (docs/paper-facts.md#error-bars). The
repository has no plotting code, so the percentile bootstrap of the mean is our reading
(REPRODUCE.md says so). It redraws the paper's figures; it is not a test.

Verdicts (`perencode verify`): one-sided t-tests whose level holds at the seed counts used
here on near-normal runs (Student's t for a mean, Welch's t for a difference; exact tests
for constant cells; a conservative rule for a threshold on a metric bounded in [0, 1]), the
distribution-free sign and rank tests (a claim's `statistic = "median"`, and the other
reading of runs whose shape breaks a t-test: `outliers`, `at_bound`), and the seeds that
would decide an inconclusive one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from statistics import NormalDist

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


# --------------------------------------------------------------------------------------
# Verdict statistics: tests whose level holds at 2-10 seeds (docs/claims.md#statistics)
# --------------------------------------------------------------------------------------
# The percentile bootstrap above is the paper's error bar, not a test: at 3 seeds per side
# its "95%" interval of a difference covers the truth about 79% of the time (tests/
# test_stats.py measures it). A verdict is a one-sided t-test instead: Student's t for a
# mean against a threshold, Welch's t for a difference of two groups' means. Its level is
# measured by simulation in tests/test_stats.py (normal, beta-distributed and
# binomial-proportion-like accuracies near 0 and 1, constant cells; n = 3 and 5).

_lgamma = np.vectorize(math.lgamma, otypes=[float])


def _betainc(a: np.ndarray, b: np.ndarray, x: np.ndarray, terms: int = 200) -> np.ndarray:
    """The regularised incomplete beta function I_x(a, b), elementwise: Lentz's continued
    fraction (Numerical Recipes 6.4), on the side of x where it converges fast. numpy only:
    scipy is not a dependency for one function."""
    flip = x > (a + 1) / (a + b + 2)
    a, b, x = np.where(flip, b, a), np.where(flip, a, b), np.where(flip, 1 - x, x)
    tiny = 1e-300
    c = np.ones_like(x)
    d = 1 - (a + b) * x / (a + 1)
    d = 1 / np.where(np.abs(d) < tiny, tiny, d)
    h = d
    for m in range(1, terms + 1):
        for coef in (m * (b - m) * x / ((a - 1 + 2 * m) * (a + 2 * m)),
                     -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1 + 2 * m))):
            d = 1 + coef * d
            d = 1 / np.where(np.abs(d) < tiny, tiny, d)
            c = 1 + coef / c
            c = np.where(np.abs(c) < tiny, tiny, c)
            step = d * c
            h = h * step
        if np.all(np.abs(step - 1) < 1e-15):  # converged everywhere (t: some 10-40 terms)
            break
    with np.errstate(divide="ignore"):
        log_front = (a * np.log(x) + b * np.log1p(-x)
                     - (_lgamma(a) + _lgamma(b) - _lgamma(a + b)))
    out = np.where(x <= 0, 0.0, np.exp(log_front) * h / a)
    return np.where(flip, 1 - out, out)


def t_sf(t: Values | float, df: Values | float) -> np.ndarray:
    """P(T > t) for Student's t with `df` degrees of freedom (any positive real), elementwise;
    t = +-inf gives 0 or 1, a NaN t or df gives NaN."""
    t, df = np.broadcast_arrays(np.asarray(t, dtype=float), np.asarray(df, dtype=float))
    finite = np.where(np.isfinite(t), t, 0.0)
    safe_df = np.where(np.isnan(df) | (df <= 0), 1.0, df)
    tail = 0.5 * _betainc(safe_df / 2, np.full_like(df, 0.5),
                          safe_df / (safe_df + finite * finite))
    out = np.where(finite >= 0, tail, 1 - tail)
    out = np.where(np.isposinf(t), 0.0, np.where(np.isneginf(t), 1.0, out))
    return np.where(np.isnan(t) | np.isnan(df) | (df <= 0), math.nan, out)


def _betainc_scalar(a: float, b: float, x: float) -> float:
    """`_betainc` for one point, in plain floats: the same continued fraction, some 30 times
    faster than numpy on arrays of one element (t_quantile calls it a few times a step)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _betainc_scalar(b, a, 1.0 - x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) >= tiny else tiny)
    h = d
    for m in range(1, 201):
        step = 1.0
        for coef in (m * (b - m) * x / ((a - 1 + 2 * m) * (a + 2 * m)),
                     -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 1 + 2 * m))):
            d = 1.0 + coef * d
            d = 1.0 / (d if abs(d) >= tiny else tiny)
            c = 1.0 + coef / c
            c = c if abs(c) >= tiny else tiny
            step = d * c
            h *= step
        if abs(step - 1.0) < 1e-15:
            break
    log_front = a * math.log(x) + b * math.log1p(-x) - (
        math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    return math.exp(log_front) * h / a


def _t_tail(t: float, df: float) -> float:
    """P(T > t) for t >= 0, one point."""
    return 0.5 * _betainc_scalar(df / 2, 0.5, df / (df + t * t))


@lru_cache(maxsize=4096)
def t_quantile(q: float, df: float) -> float:
    """The q-quantile of Student's t: exact for 1 and 2 degrees of freedom, else the
    Cornish-Fisher expansion around the normal quantile refined by Newton's method on
    P(T > t) (two or three steps; a step that would cross 0 is halved instead). Cached: the
    verdicts ask for the same few quantiles again and again."""
    if not 0.0 < q < 1.0 or not df > 0:
        return math.nan if not (q in (0.0, 1.0) and df > 0) else math.copysign(
            math.inf, q - 0.5)
    if q < 0.5:
        return -t_quantile(1 - q, df)
    if q == 0.5:
        return 0.0
    if df == 1.0:
        return math.tan(math.pi * (q - 0.5))
    if df == 2.0:
        return (2 * q - 1) / math.sqrt(2 * q * (1 - q))
    z = NormalDist().inv_cdf(q)
    t = z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df * df) + (
        3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3)
    log_norm = (math.lgamma((df + 1) / 2) - math.lgamma(df / 2)
                - 0.5 * math.log(df * math.pi))
    for _ in range(100):
        density = math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))
        step = (_t_tail(t, df) - (1 - q)) / density
        t = t + step if t + step > 0 else t / 2
        if abs(step) < 1e-12 * (1 + t):
            break
    return t


@dataclass(frozen=True)
class HypothesisTest:
    """One test of a quantity (a mean, or a difference of two groups' means) against a
    threshold: p-values for either side and the one-sided bounds at the level used."""
    method: str           # "Student t", "Welch t", "exact sign test", "exact permutation test"
    estimate: float       # the mean, or mean(a) - mean(b)
    threshold: float
    low: float            # one-sided (1 - alpha) lower bound (= estimate for exact tests)
    high: float           # one-sided (1 - alpha) upper bound
    p_above: float        # p-value of "the quantity > threshold"
    p_below: float        # p-value of "the quantity < threshold"
    n: tuple[int, ...]    # runs per group
    alpha: float          # the level of each side as used (halved for bounded metrics)
    sd: tuple[float, ...]  # per group
    bounded: bool         # the metric lies in [0, 1]: the conservative rule applied


def _bounded_scale(mean: np.ndarray, threshold: float) -> np.ndarray:
    """A proportion-like metric's variance shrinks toward its bounds (var ~ mu (1 - mu), the
    beta and binomial models): the variance at the threshold is t (1 - t) / (m (1 - m))
    times the one seen at mean m, when m lies nearer a bound than t (else 1)."""
    inside = (mean > 0) & (mean < 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = threshold * (1 - threshold) / (mean * (1 - mean))
    return np.where(inside, np.maximum(1.0, ratio), 1.0)


def mean_p_values(x: np.ndarray, threshold: float,
                  bounded: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of `x` [D, n] tested as in `mean_test`: (p_above, p_below, exact) per row, where
    `exact` marks the constant rows the sign test decided."""
    n = x.shape[1]
    m, var = x.mean(axis=1), x.var(axis=1, ddof=1)  # [D]
    if bounded:
        var = var * _bounded_scale(m, threshold)
    exact = var == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (m - threshold) / np.sqrt(var / n)
    sign = 0.5 ** n
    p_above = np.where(exact, np.where(m > threshold, sign, 1.0), t_sf(t, n - 1.0))
    p_below = np.where(exact, np.where(m < threshold, sign, 1.0), t_sf(-t, n - 1.0))
    return p_above, p_below, exact


def difference_p_values(a: np.ndarray, b: np.ndarray, threshold: float = 0.0
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of `a` [D, n_a] and `b` [D, n_b] tested as in `difference_test`: (p_above,
    p_below, exact) per row, `exact` marking the rows with both groups constant."""
    na, nb = a.shape[1], b.shape[1]
    va, vb = a.var(axis=1, ddof=1) / na, b.var(axis=1, ddof=1) / nb  # [D]
    d = a.mean(axis=1) - b.mean(axis=1)
    exact = (va == 0) & (vb == 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (d - threshold) / np.sqrt(va + vb)
        df = (va + vb) ** 2 / (va * va / (na - 1) + vb * vb / (nb - 1))
    df = np.where(exact, 1.0, df)
    permutation = 1.0 / math.comb(na + nb, na)
    p_above = np.where(exact, np.where(d > threshold, permutation, 1.0), t_sf(t, df))
    p_below = np.where(exact, np.where(d < threshold, permutation, 1.0), t_sf(-t, df))
    return p_above, p_below, exact


ONE_VALUE = "no test: fewer than two values in a group"


def _untestable(groups: tuple[np.ndarray, ...], threshold: float, alpha: float,
                bounded: bool) -> HypothesisTest:
    """A group of one value (or none) has no spread to test with: nothing is shown either
    way (p = 1 on both sides), the estimate is the values' own (NaN without one)."""
    means = [float(g.mean()) if len(g) else math.nan for g in groups]
    estimate = means[0] if len(groups) == 1 else means[0] - means[1]
    return HypothesisTest(ONE_VALUE, estimate, threshold, math.nan, math.nan, 1.0, 1.0,
                          tuple(len(g) for g in groups), alpha, (math.nan,) * len(groups),
                          bounded)


def mean_test(values: Values, threshold: float, alpha: float = 0.05,
              bounded: bool = False) -> HypothesisTest:
    """Student's one-sample t-test of mean(values) against `threshold`, one-sided both ways.

    Bounded metrics (every value in [0, 1]: accuracies) are skewed near their bounds, which
    makes the t-test liberal toward the bound (measured: 15% instead of 5% at 3 seeds for
    beta-distributed accuracies with mean 0.95); for them the variance is the one a
    proportion-like metric has at the threshold (`_bounded_scale`) and alpha is halved. A
    constant sample has no spread to test with: the exact sign test decides (p = 2^-n when
    every run lies on the claimed side), at the full alpha."""
    x = _clean(values)
    if len(x) < 2:
        return _untestable((x,), threshold, alpha, bounded)
    n, m = len(x), float(x.mean())
    s = float(x.std(ddof=1))
    p_above, p_below, exact = (float(v[0]) for v in mean_p_values(x[None], threshold, bounded))
    if exact:
        return HypothesisTest("exact sign test", m, threshold, m, m, p_above, p_below, (n,),
                              alpha, (0.0,), bounded)
    used = alpha / 2 if bounded else alpha
    se = s * math.sqrt(float(_bounded_scale(np.array([m]), threshold)[0]) if bounded
                       else 1.0) / math.sqrt(n)
    margin = t_quantile(1 - used, n - 1.0) * se
    low, high = m - margin, m + margin
    if bounded:  # a mean of values in [0, 1] lies there too
        low, high = max(low, 0.0), min(high, 1.0)
    return HypothesisTest("Student t", m, threshold, low, high, p_above, p_below, (n,), used,
                          (s,), bounded)


def welch_df(var_a: float, n_a: int, var_b: float, n_b: int) -> float:
    """Welch-Satterthwaite degrees of freedom of mean(a) - mean(b)."""
    va, vb = var_a / n_a, var_b / n_b
    return (va + vb) ** 2 / (va * va / (n_a - 1) + vb * vb / (n_b - 1))


def difference_test(a: Values, b: Values, threshold: float = 0.0, alpha: float = 0.05,
                    bounded: bool = False) -> HypothesisTest:
    """Welch's t-test of mean(a) - mean(b) against `threshold`, one-sided both ways, at the
    full alpha for bounded metrics too (issue 55's measurement, tests/test_stats.py: halving
    it kept groups of the same shape at 1-3% where plain Welch holds 2.5-5%, cost power,
    and did not protect the shapes that break the level: a skewed group beside a tight one,
    seeds stuck on a plateau; `shape_warnings` detects those). `bounded` only keeps the
    bounds in [-1, 1]. Both groups constant: the exact permutation test decides (p = 1 /
    C(n_a + n_b, n_a) when they differ: 0.05 at 3 + 3)."""
    xa, xb = _clean(a), _clean(b)
    if min(len(xa), len(xb)) < 2:
        return _untestable((xa, xb), threshold, alpha, bounded)
    na, nb = len(xa), len(xb)
    d = float(xa.mean() - xb.mean())
    sa, sb = float(xa.std(ddof=1)), float(xb.std(ddof=1))
    p_above, p_below, exact = (float(v[0]) for v in
                               difference_p_values(xa[None], xb[None], threshold))
    if exact:
        return HypothesisTest("exact permutation test", d, threshold, d, d, p_above,
                              p_below, (na, nb), alpha, (0.0, 0.0), bounded)
    used = alpha
    se = math.sqrt(sa * sa / na + sb * sb / nb)
    margin = t_quantile(1 - used, welch_df(sa * sa, na, sb * sb, nb)) * se
    low, high = d - margin, d + margin
    if bounded:  # a difference of two means in [0, 1] lies in [-1, 1]
        low, high = max(low, -1.0), min(high, 1.0)
    return HypothesisTest("Welch t", d, threshold, low, high, p_above, p_below, (na, nb),
                          used, (sa, sb), bounded)


def seeds_to_decide(test: HypothesisTest, power: float = 0.8,
                    most: int = 1000) -> int | None:
    """Runs per group that would decide the test (reject on the side its estimate lies)
    with probability `power` if the observed difference from the threshold and the observed
    spread were the truth: the smallest n with |estimate - threshold| / se(n) >=
    t_(1-alpha) + t_(power) (the usual t approximation of the power); None when the
    estimate equals the threshold or more than `most` runs would be needed. Constant
    cells: the n at which the exact test can reach alpha."""
    gap = abs(test.estimate - test.threshold)
    if gap == 0.0 or not all(math.isfinite(s) for s in test.sd):
        return None
    if all(s == 0.0 for s in test.sd):
        n = 2
        while (0.5 ** n if len(test.n) == 1 else 1 / math.comb(2 * n, n)) > test.alpha:
            n += 1
        return n
    var = sum(s * s for s in test.sd)
    if test.bounded and len(test.n) == 1 and 0 < test.estimate < 1:
        t, m = test.threshold, test.estimate
        var *= max(1.0, t * (1 - t) / (m * (1 - m)))
    def decides(n: int) -> bool:  # monotone in n: a bisection finds the smallest
        df = n - 1.0 if len(test.n) == 1 else welch_df(test.sd[0] ** 2, n, test.sd[1] ** 2, n)
        return gap / math.sqrt(var / n) >= t_quantile(1 - test.alpha, df) + t_quantile(
            power, df)

    if not decides(most):
        return None
    low, high = 1, most  # decides(high); not decides(low)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if decides(mid) else (mid, high)
    return high


# --------------------------------------------------------------------------------------
# Seeds a plan needs (`perencode plan`): the power of the verdicts' test (a one-sided
# Welch t at 95%)
# --------------------------------------------------------------------------------------

LEVEL, POWER = 0.95, 0.80


def detectable_effect(n: int, groups: int = 2, alpha: float = 1 - LEVEL) -> float:
    """The smallest effect, in units of the seeds' standard deviation, that a one-sided t
    test at LEVEL decides with POWER from n seeds a group: two groups (a difference of
    means; Welch's df at equal n and spread is 2n - 2) or one (a mean against a threshold,
    df n - 1). The usual approximation (t_level + t_power) x standard error, with central
    t quantiles."""
    if n < 2:
        return math.inf
    df = groups * (n - 1)
    return (t_quantile(1 - alpha, df) + t_quantile(POWER, df)) * math.sqrt(groups / n)


def seeds_needed(effect: float, groups: int = 2, most: int = 100,
                 alpha: float = 1 - LEVEL, floor: int | None = None) -> int | None:
    """Seeds a group that decide an effect of `effect` standard deviations at `alpha` with
    POWER (detectable_effect), never fewer than `floor` (default: what the exact test of a
    constant cell needs at `alpha`, exact_minimum: a cell whose seeds agree is decided by
    it); None if more than `most`."""
    for n in range(exact_minimum(groups, alpha) if floor is None else floor, most + 1):
        if detectable_effect(n, groups, alpha) <= effect:
            return n
    return None


def exact_minimum(groups: int, alpha: float = 1 - LEVEL) -> int:
    """The fewest seeds a group at which the verdicts' exact test of a constant cell can
    decide at `alpha` (sign_test, rank_test): the sign test, p = 2^-n, for one group
    (5 at 0.05); the permutation test, p = 1 / C(2n, n), for two (3 at 0.05)."""
    n = 2
    while (0.5 ** n if groups == 1 else 1 / math.comb(2 * n, n)) > alpha + 1e-12:
        n += 1
    return n


# --------------------------------------------------------------------------------------
# The distribution-free reading, and runs whose shape contradicts a t-test's assumption
# --------------------------------------------------------------------------------------

def sign_test(values: Values, threshold: float) -> tuple[float, float]:
    """(p_above, p_below): the exact sign test of "most seeds lie above / below
    `threshold`" (the median), for any shape: P(Binomial(n, 1/2) >= seeds strictly on that
    side). A seed on the threshold counts against either claim."""
    x = _clean(values)
    n = len(x)

    def tail(k: int) -> float:
        return sum(math.comb(n, j) for j in range(k, n + 1)) / 2.0 ** n

    return tail(int((x > threshold).sum())), tail(int((x < threshold).sum()))


def rank_test(a: Values, b: Values, threshold: float = 0.0,
              most: int = 20_000) -> tuple[float, float]:
    """(p_above, p_below): the exact permutation test of the Mann-Whitney statistic of
    a - threshold against b: "a seed of a (less the threshold) beats a seed of b more often
    than not", for any shape (ties count a half). Every split of the pooled seeds is
    enumerated (C(n_a + n_b, n_a) of them, up to `most`; beyond, the normal
    approximation)."""
    xa, xb = _clean(a) - threshold, _clean(b)
    na, nb = len(xa), len(xb)
    if na == 0 or nb == 0:
        return 1.0, 1.0
    pooled = np.concatenate([xa, xb])

    def u_of(first: np.ndarray, second: np.ndarray) -> np.ndarray:  # [S, na], [S, nb]
        diff = first[:, :, None] - second[:, None, :]
        return (diff > 0).sum(axis=(1, 2)) + 0.5 * (diff == 0).sum(axis=(1, 2))

    observed = float(u_of(xa[None], xb[None])[0])
    total = math.comb(na + nb, na)
    if total <= most:
        picks = np.array(list(combinations(range(na + nb), na)))  # [S, na]
        mask = np.ones((len(picks), na + nb), bool)
        mask[np.arange(len(picks))[:, None], picks] = False
        rest = np.nonzero(mask)[1].reshape(len(picks), nb)
        u = u_of(pooled[picks], pooled[rest])
        eps = 1e-9
        return float((u >= observed - eps).mean()), float((u <= observed + eps).mean())
    mean, sd = na * nb / 2, math.sqrt(na * nb * (na + nb + 1) / 12)
    z = (observed - mean) / sd
    upper = 0.5 * math.erfc(z / math.sqrt(2))
    return upper, 1.0 - upper


# Dixon's Q at 95% (n = 3..10; Rorabacher 1991): an extreme seed whose gap to its neighbour
# exceeds this share of the range is an outlier.
DIXON_Q95 = {3: 0.970, 4: 0.829, 5: 0.710, 6: 0.625, 7: 0.568, 8: 0.526, 9: 0.493, 10: 0.466}


def outliers(values: Values) -> list[int]:
    """Indices of the seeds Dixon's Q test (95%) flags, applied once at each end: a seed
    split off from the others (stuck on a plateau while they succeed, or the reverse).
    Up to 10 seeds; [] beyond, or with fewer than 3, or without spread."""
    x = _clean(values)
    n = len(x)
    if n not in DIXON_Q95:
        return []
    order = np.argsort(x, kind="stable")
    spread = float(x[order[-1]] - x[order[0]])
    if spread <= 0:
        return []
    found = []
    if (x[order[1]] - x[order[0]]) / spread > DIXON_Q95[n]:
        found.append(int(order[0]))
    if (x[order[-1]] - x[order[-2]]) / spread > DIXON_Q95[n]:
        found.append(int(order[-1]))
    return found


def at_bound(values: Values) -> int:
    """How many seeds lie exactly on a bound of [0, 1] (a solved task's 1.0, a collapsed
    one's 0.0)."""
    x = _clean(values)
    return int(((x == 0.0) | (x == 1.0)).sum())
