"""Alpha spent across looks at the same claims (a first stage of seeds, then a top-up):
group-sequential testing with a Lan-DeMets spending function, so that the chance of a false
pass over all looks stays at the claim's stated alpha.

The rule, named in plan.json and in each verdict's method: **Lan-DeMets Pocock-type
spending**, alpha(t) = alpha x ln(1 + (e - 1) t) at information fraction t (DeMets & Lan,
1994), with the looks fixed when the plan is written (the first stage at t = 1/2 of the
planned seeds, the top-up at t = 1). Look k tests at the alpha spent between looks k - 1 and
k; a false pass at any look is the union of the looks' events, so by Bonferroni the level
over all looks is at most the sum, alpha. (Conservative: the looks' statistics are
correlated, which a recursive boundary would use; the verdicts' own tests at 2-10 seeds are
not the normal ones such boundaries assume.) The O'Brien-Fleming-type function is here for
comparison: it spends almost nothing at a first stage of a few seeds, where the exact tests
could then decide nothing.
"""

from __future__ import annotations

import math

POCOCK = "Lan-DeMets Pocock-type spending"
OBRIEN_FLEMING = "Lan-DeMets O'Brien-Fleming-type spending"
RULE = POCOCK
FIRST_LOOK = 0.5  # information fraction of a first stage: half the planned seeds


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2))


def _normal_quantile(p: float) -> float:
    """The p-quantile of the standard normal (bisection on erfc: exact to 1e-12)."""
    low, high = -40.0, 40.0
    for _ in range(200):
        mid = (low + high) / 2
        if 1 - _normal_sf(mid) < p:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def spent(t: float, alpha: float, rule: str = RULE) -> float:
    """Alpha spent by information fraction t in [0, 1] (one-sided)."""
    t = min(max(t, 0.0), 1.0)
    if t == 0:
        return 0.0
    if rule == POCOCK:
        return alpha * math.log(1 + (math.e - 1) * t)
    if rule == OBRIEN_FLEMING:
        return 2 * _normal_sf(_normal_quantile(1 - alpha / 2) / math.sqrt(t))
    raise ValueError(f"unknown spending rule '{rule}'")


def look_alphas(fractions: list[float], alpha: float, rule: str = RULE) -> list[float]:
    """Each look's alpha: what the rule spends between the last look and this one
    (fractions increasing, the last 1)."""
    out, before = [], 0.0
    for t in fractions:
        now = spent(t, alpha, rule)
        out.append(now - before)
        before = now
    return out


def look_fractions(looks: int) -> list[float]:
    """The information fractions of a plan's looks: one look at 1; two at 1/2 and 1."""
    return [1.0] if looks == 1 else [FIRST_LOOK, 1.0]


def share(look: int, looks: int, rule: str = RULE) -> float:
    """The fraction of a claim's alpha that look `look` (1-based) of `looks` tests at: the
    same for every alpha under the Pocock-type rule (spent is alpha times a function of t)."""
    return look_alphas(look_fractions(looks), 1.0, rule)[look - 1]


def first_look_share(looks: int) -> float:
    return share(1, looks)


def plan_shares(plan: dict) -> tuple[dict[str, float], str]:
    """From a plan.json of `perencode plan --stages 2` (or its top-up): each of its claims'
    share of alpha at this look, and the look in words ('look 2 of 2, Lan-DeMets
    Pocock-type spending'); ({}, "") for a plan of one look. The claims a first look decided
    (`settled`) keep that look's share: they were tested then and are not tested again on
    more runs."""
    looks = plan.get("looks") or {}
    of, look = int(looks.get("of", 1)), int(looks.get("look", 1))
    if of <= 1:
        return {}, ""
    rule = looks.get("rule", RULE)
    shares = {cid: share(look, of, rule) for cid in plan.get("decided", [])}
    shares.update({cid: share(1, of, rule) for cid in plan.get("settled", {})})
    return shares, f"look {look} of {of}, {rule}"
