"""Alpha spent across the looks of a staged plan (perencode.analysis.sequential): the spending
functions by hand, and by simulation the level over two looks (a first stage, then a top-up)
held with the rule and broken without it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perencode.analysis import sequential
from perencode.analysis.stats import mean_p_values


def test_spending_functions_by_hand():
    # Pocock-type: alpha ln(1 + (e - 1) t)
    assert sequential.spent(0.5, 0.05) == pytest.approx(0.05 * math.log(1 + (math.e - 1) / 2))
    assert sequential.spent(0.5, 0.05) == pytest.approx(0.0310057, abs=1e-6)
    assert sequential.spent(1.0, 0.05) == pytest.approx(0.05)
    # O'Brien-Fleming-type: 2 (1 - Phi(z_{1 - alpha/2} / sqrt(t))): 1.95996 / sqrt(.5) = 2.7718
    obf = sequential.OBRIEN_FLEMING
    assert sequential.spent(0.5, 0.05, obf) == pytest.approx(0.005575, abs=2e-6)
    assert sequential.spent(1.0, 0.05, obf) == pytest.approx(0.05, abs=1e-9)
    looks = sequential.look_alphas([0.5, 1.0], 0.05)
    assert sum(looks) == pytest.approx(0.05) and looks[0] > looks[1] > 0
    assert sequential.share(1, 1) == pytest.approx(1.0)
    assert sequential.share(1, 2) + sequential.share(2, 2) == pytest.approx(1.0)


def test_a_plans_look_gives_each_claims_share():
    plan = {"looks": {"look": 2, "of": 2, "rule": sequential.POCOCK}, "decided": ["b"],
            "settled": {"a": "pass"}}
    shares, words = sequential.plan_shares(plan)
    assert shares == {"a": pytest.approx(sequential.share(1, 2)),
                      "b": pytest.approx(sequential.share(2, 2))}
    assert words == "look 2 of 2, Lan-DeMets Pocock-type spending"
    assert sequential.plan_shares({"looks": {"look": 1, "of": 1}, "decided": ["a"]}) == ({}, "")


def _false_passes(alphas: list[float], draws: int = 40_000) -> float:
    """Seeds drawn where the claim 'mean > 0' is false at its boundary (mean 0): a first
    stage of 3 seeds tested at alphas[0]; if undecided, 3 seeds more and all 6 tested at
    alphas[1] (Student's t, as the verdicts test a threshold). The share passing at a look."""
    rng = np.random.default_rng(53)
    x = rng.normal(0.0, 1.0, size=(draws, 6))
    first, _, _ = mean_p_values(x[:, :3], 0.0)
    second, _, _ = mean_p_values(x, 0.0)
    return float(np.mean((first <= alphas[0]) | (second <= alphas[1])))


def test_the_level_over_two_looks_holds_with_the_rule_and_not_without():
    se = math.sqrt(0.05 * 0.95 / 40_000)  # 0.0011
    one_look = _false_passes([0.0, 0.05])
    uncorrected = _false_passes([0.05, 0.05])
    spent = _false_passes(sequential.look_alphas([0.5, 1.0], 0.05))
    assert one_look == pytest.approx(0.05, abs=3 * se)
    assert uncorrected > 0.05 + 10 * se  # two looks at 5% each: 8.7% measured
    assert spent <= 0.05 + 2 * se  # the rule: 4.6% measured, at most the stated 5%
