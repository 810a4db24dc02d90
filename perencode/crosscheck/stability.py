"""The gradient-stability metric on the same weights and triplets: our analysis
(perencode.stability.analyse_triplets) against the authors' JacobianAnalyzer /
JacobianAnalyzerSSM (model/jacobian_analysis.py), docs/paper-facts.md#gradient-stability."""

from __future__ import annotations

import torch

from perencode.crosscheck.authors import Authors
from perencode.crosscheck.models import DTYPES, K, L, pair
from perencode.crosscheck.report import Check, numeric
from perencode.stability import analyse_triplets, make_triplets

# (our column, their key without the comparison suffix)
COLUMNS = (("stability_weighted", "weighted_mean_gradient_similarity"),
           ("stability_mean", "mean_gradient_similarity"),
           ("frobenius_distance", "frobenius_dist"),
           ("forward_distance", "forward_dist"),
           ("forward_cosine", "forward_similarity"))
THEIR_COMPARISON = {"target": "common_target", "suffix": "common_suffix"}


def check_stability(authors: Authors) -> list[Check]:
    ja = authors.module("model.jacobian_analysis")
    checks = []
    for arch, prefix in (("gru", 0), ("lstm", 0), ("s4d", 3)):
        triplets = make_triplets(K, L, count=8, seed=0, prefix_length=prefix)
        inputs = triplets.inputs(K)  # [n, 3, T]
        errors = {}
        for name, dtype in DTYPES.items():
            mine, other = pair(authors, arch, "sinusoidal", seed=21)
            mine, other = mine.to(dtype), other.to(dtype)
            rows = analyse_triplets(mine, triplets, K, batch=8, device=torch.device("cpu"))
            analyzer = (ja.JacobianAnalyzerSSM(other) if arch == "s4d"
                        else ja.JacobianAnalyzer(other))
            stats = analyzer(inputs, input_time=prefix)
            if arch == "s4d":
                stats = stats[0]  # the real view of the complex state, as the paper used
            worst = 0.0
            for row in rows:
                suffix = THEIR_COMPARISON[str(row["comparison"])]
                for ours_key, their_key in COLUMNS:
                    theirs = float(stats[f"{their_key}_{suffix}"][row["triplet"]])
                    ours = float(row[ours_key])
                    worst = max(worst, abs(ours - theirs) / max(1.0, abs(theirs)))
            errors[name] = worst
        # fp64: the sinusoidal tables are fp32-computed on both sides (~1e-9 here).
        checks.append(numeric(
            f"stability: {arch}", "weighted and mean row cosine, Frobenius and forward "
            "distance, forward cosine of 8 triplets x 2 comparisons"
            + (f" (target at t={prefix + 1}, shortened output)" if prefix else ""),
            "model.jacobian_analysis."
            + ("JacobianAnalyzerSSM" if arch == "s4d" else "JacobianAnalyzer"),
            {"fp32": 1e-4, "fp64": 1e-7}, errors, unit="max relative error"))
    return checks
