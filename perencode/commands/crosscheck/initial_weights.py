"""Initialisation: perencode's freshly built model against the authors' model built with the
same sizes, per architecture and encoding. The other checks copy our weights into their
model, so how each side draws its initial weights is compared here only.

Per parameter (under the authors' names, `models.their_state_dict`): the same set of names
(roles) and shapes, and the same distribution over SEEDS fresh builds of each side: mean
and standard deviation within 5 standard errors, minimum and maximum within 2 standard
deviations, and a two-sample Kolmogorov-Smirnov test at ALPHA. Where both sides draw from
the same generator in the same order the values are identical, and the check says so.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from perencode.commands.crosscheck.authors import Authors
from perencode.commands.crosscheck.models import ours, their_name, their_state_dict, theirs
from perencode.commands.crosscheck.report import AGREE, DISAGREE, Comparison

SEEDS = (0, 1, 2, 3)
ALPHA = 1e-4  # the KS test's level: 1 in 10,000 agreeing tensors would fail by chance
CASES = [(a, f) for a in ("gru", "lstm", "s4d") for f in ("none", "sinusoidal")]
CASES += [("gru", "random"), ("gru", "learnable")]


def trainable(model: torch.nn.Module, rename=lambda n: n) -> set[str]:
    """The names of the parameters that take a gradient: named_parameters, not state_dict,
    which cannot tell a trained table from a fixed buffer."""
    return {rename(n) for n, p in model.named_parameters() if p.requires_grad}


def _draws(authors: Authors, arch: str, form: str) -> tuple[dict, dict, tuple]:
    """{their name: [tensor per seed]} of each side, ours renamed; and the names of the
    trainable parameters on each side (ours, theirs)."""
    mine: dict[str, list[Tensor]] = {}
    other: dict[str, list[Tensor]] = {}
    for seed in SEEDS:
        torch.manual_seed(seed)
        model = ours(arch, form)
        torch.manual_seed(seed)
        target = theirs(authors, arch, form)
        names = (trainable(model, their_name), trainable(target))
        for name, value in their_state_dict(model, target).items():
            mine.setdefault(name, []).append(value.detach().double().flatten())
        for name, value in target.state_dict().items():
            other.setdefault(name, []).append(value.detach().double().flatten())
    return mine, other, names


def ks_statistic(a: Tensor, b: Tensor) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    both = torch.cat([a, b]).sort().values
    cdf_a = torch.searchsorted(a.sort().values, both, right=True) / len(a)
    cdf_b = torch.searchsorted(b.sort().values, both, right=True) / len(b)
    return float((cdf_a - cdf_b).abs().max())


def compare_tensor(a: Tensor, b: Tensor) -> list[str]:
    """What differs between two samples of initial values (empty: the same distribution)."""
    if a.numel() == b.numel() and torch.equal(a, b):
        return []
    n, m = len(a), len(b)
    sa, sb = float(a.std()) if n > 1 else 0.0, float(b.std()) if m > 1 else 0.0
    wrong = []
    se_mean = math.sqrt(sa ** 2 / n + sb ** 2 / m)
    if abs(float(a.mean() - b.mean())) > 5 * se_mean + 1e-12:
        wrong.append(f"mean {float(a.mean()):.4g} vs {float(b.mean()):.4g}")
    se_std = math.sqrt(sa ** 2 / (2 * n) + sb ** 2 / (2 * m))
    if abs(sa - sb) > 5 * se_std + 1e-12:
        wrong.append(f"std {sa:.4g} vs {sb:.4g}")
    spread = 2 * max(sa, sb) + 1e-12
    for what, x, y in (("min", float(a.min()), float(b.min())),
                       ("max", float(a.max()), float(b.max()))):
        if abs(x - y) > spread:
            wrong.append(f"{what} {x:.4g} vs {y:.4g}")
    critical = math.sqrt(-math.log(ALPHA / 2) / 2) * math.sqrt((n + m) / (n * m))
    d = ks_statistic(a, b)
    if d > critical:
        wrong.append(f"KS D = {d:.3g} > {critical:.3g}")
    return wrong


def check_case(authors: Authors, arch: str, form: str) -> Comparison:
    mine, other, (ours_trained, theirs_trained) = _draws(authors, arch, form)
    wrong, exact = [], 0
    for name in sorted(set(mine) | set(other)):
        if name.endswith("time_encoder.frequencies"):
            continue  # their buffer, kept in the mapping (models.their_state_dict)
        if name not in mine or name not in other:
            wrong.append(f"{name}: {'theirs' if name in other else 'ours'} only")
            continue
        if mine[name][0].numel() != other[name][0].numel():
            wrong.append(f"{name}: {mine[name][0].numel()} values vs {other[name][0].numel()}")
            continue
        a, b = torch.cat(mine[name]), torch.cat(other[name])
        exact += torch.equal(a, b)
        wrong += [f"{name}: {w} (ours vs theirs)" for w in compare_tensor(a, b)]
    if ours_trained != theirs_trained:
        wrong.append(f"trainable parameters: ours only {sorted(ours_trained - theirs_trained)}"
                     f", theirs only {sorted(theirs_trained - ours_trained)}")
    total = len([n for n in other if not n.endswith("time_encoder.frequencies")])
    check = Comparison(
        f"initialisation: {arch} {form}", f"{total} tensors of fresh models (seeds "
        f"{', '.join(map(str, SEEDS))}): names, shapes, mean, std, min, max, KS; {exact} of "
        f"{total} drawn identically; the {len(theirs_trained)} trainable parameters by name "
        "(named_parameters: a fixed table is a buffer)",
        f"model.{'ssm.SSM' if arch == 's4d' else 'rnn.RNN'}.__init__", {"fp32": 0.0, "fp64": 0.0},
        {"fp32": float(len(wrong)), "fp64": float(len(wrong))},
        unit="parameters whose initial distribution differs", verdict=AGREE)
    if wrong:
        check.verdict, check.reason = DISAGREE, "; ".join(wrong)
    return check


def check_init(authors: Authors) -> list[Comparison]:
    return [check_case(authors, arch, form) for arch, form in CASES]
