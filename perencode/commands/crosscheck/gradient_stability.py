"""The gradient-stability metric on the same weights and triplets: our analysis
(perencode.analysis.gradient_stability.analyse_triplets) against the authors' JacobianAnalyzer /
JacobianAnalyzerSSM (model/jacobian_analysis.py), docs/paper-facts.md#gradient-stability."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from perencode.analysis.gradient_stability import analyse_triplets, make_triplets
from perencode.commands.crosscheck.authors import Authors
from perencode.commands.crosscheck.models import DTYPES, K, L, pair
from perencode.commands.crosscheck.report import AGREE, DISAGREE, Comparison, numeric
from perencode.commands.crosscheck.tasks import Log

# (our column, their key without the comparison suffix)
COLUMNS = (("stability_weighted", "weighted_mean_gradient_similarity"),
           ("stability_mean", "mean_gradient_similarity"),
           ("frobenius_distance", "frobenius_dist"),
           ("forward_distance", "forward_dist"),
           ("forward_cosine", "forward_similarity"))
THEIR_COMPARISON = {"target": "common_target", "suffix": "common_suffix"}


def check_stability(authors: Authors) -> list[Comparison]:
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


def structure(tokens: Tensor, prefix: int, K: int) -> dict[str, object]:
    """What the triplets [n, 3, L] (input phases) are made of: for the prefix, the target
    and the suffix, which pairs of members are the same in every triplet, and per quarter
    of the triplets the share of target and disturbant tokens from the rare half."""
    parts = {"prefix": tokens[..., :prefix], "target": tokens[..., prefix:prefix + 1],
             "suffix": tokens[..., prefix + 1:]}
    out: dict[str, object] = {"length": tokens.shape[-1]}
    for name, part in parts.items():
        out[f"{name} always shared by"] = [
            f"{i}{j}" for i, j in ((0, 1), (0, 2), (1, 2))
            if part.shape[-1] and bool((part[:, i] == part[:, j]).all())]
    rare = (tokens >= K // 2).double()
    for q, block in enumerate(rare.chunk(4)):
        out[f"quarter {q + 1} rare share (target, disturbants)"] = (
            round(float(block[..., prefix].mean()), 3),
            round(float(torch.cat([block[..., :prefix], block[..., prefix + 1:]], -1).mean()),
                  3))
    return out


class _Recorder(nn.Module):
    """Stands in for their JacobianAnalyzerSSM: keeps the inputs their Tester builds."""
    seen: list[Tensor] = []

    def __init__(self, model):
        super().__init__()

    def forward(self, inputs, input_time=0):
        _Recorder.seen.append(inputs)
        n = inputs.shape[0]
        return ({"x": torch.zeros(n)}, {"x": torch.zeros(n)}, {"x": torch.zeros(n)})


def their_triplets(authors: Authors, K: int, L: int, count: int, prefix: int) -> Tensor:
    """The inputs [n, 3, T] their S4D stability test (test_jacobian_palindrome_ssm.py's
    Tester) builds for a dual-frequency model, its analysis replaced by a recorder."""
    module: Any = authors.script("test_jacobian_palindrome_ssm.py")  # their names, untyped
    tester = module.Tester.__new__(module.Tester)
    tester.logger, tester.device, tester.uneven_vocab_split = Log(), torch.device("cpu"), False
    tester.checkpoint = {"modules": {"ssm": {"init_args": {"vocab_size": K}}},
                         "held_out_data": torch.zeros(2, 2, 1, L, L, dtype=torch.long),
                         "iteration": 0}
    tester.checkpoint_paths = ["stand-in"]
    tester.retrieve_model = lambda checkpoint_path=None: None
    tester.rnn = tester.ssm = nn.Identity()
    saved, _Recorder.seen = module.JacobianAnalyzerSSM, []
    module.JacobianAnalyzerSSM = _Recorder
    try:
        with tempfile.TemporaryDirectory(prefix="perencode-crosscheck-") as folder:
            tester(str(Path(folder) / "stats{}.csv"), count, prefix)
    finally:
        module.JacobianAnalyzerSSM = saved
    return torch.cat(_Recorder.seen)


def check_triplets(authors: Authors) -> list[Comparison]:
    """The S4D's triplets with a prefix (the paper's 22 before the target), ours from
    perencode.analysis.gradient_stability.make_triplets against those their test builds."""
    K, L, count, prefix = 64, 12, 64, 3
    mine = make_triplets(K, L, count=count, seed=0, prefix_length=prefix).inputs(K)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        other = their_triplets(authors, K, L, count, prefix)
    ours_s, theirs_s = structure(mine[..., :L], prefix, K), structure(other[..., :L], prefix, K)
    ours_s["length"], theirs_s["length"] = mine.shape[-1], other.shape[-1]
    wrong = [f"{key}: ours {ours_s[key]}, theirs {theirs_s[key]}" for key in theirs_s
             if ours_s.get(key) != theirs_s[key]]
    check = Comparison(
        "stability: s4d triplets", f"{count} triplets, K={K}, L={L}, prefix {prefix}: which "
        "members share the prefix, the target and the suffix, the inputs' length (2L - "
        "prefix), the rare-half share of targets and disturbants per quarter",
        "test_jacobian_palindrome_ssm.Tester (its analysis replaced by a recorder)",
        {"fp32": 0.0, "fp64": 0.0}, {"fp32": float(len(wrong)), "fp64": float(len(wrong))},
        unit="properties that differ", verdict=AGREE)
    if wrong:
        check.verdict, check.reason = DISAGREE, "; ".join(wrong)
    return [check]
