"""Gradient stability (Fig. 4-5; docs/paper-facts.md#gradient-stability): the metric, the
triplets it compares and the Jacobians it compares them by. `perencode stability`
(perencode.commands.stability) runs it over a run's checkpoints; `crosscheck` against the authors'.

For triplets of inputs (x, s), (x, s'), (x', s), the Jacobian J of a late output with
respect to an early latent state (GRU/LSTM: d h_{2L} / d z_1; S4D: d y_106 / d z_23) is
compared row by row between two members. `gradient_stability` is the authors' weighted row
cosine; `printed`, `mean` and `frobenius` are the alternatives. docs/stability.md has the
formulas, the triplets, what the CSV holds and what the paper leaves open.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from perencode.common.errors import UserError
from perencode.config import registry
from perencode.kinds.tasks.dual_frequency import TYPES, half_tokens
from perencode.store import checkpoints

# --------------------------------------------------------------------------------------
# The metric (pure functions of two Jacobians [..., D_out, D_in] -> [...]).
# --------------------------------------------------------------------------------------


def _masked(x: Tensor) -> Tensor:
    """Divisor that leaves zeros at zero: x with its zeros replaced by 1."""
    return x.masked_fill(x == 0, 1.0)


def _unit(x: Tensor, dims: tuple[int, ...] = (-1,)) -> tuple[Tensor, Tensor]:
    """(x / ||x||, ||x||) over `dims` (zeros stay zero), without squaring tiny entries.

    Vanishing gradients (|J| ~ 1e-25) would underflow in float32 if squared: x is first
    divided by its largest magnitude, so the squared entries are at most 1.
    """
    scale = _masked(torch.linalg.vector_norm(x, ord=float("inf"), dim=dims, keepdim=True))
    unit = x / scale
    length = torch.linalg.vector_norm(unit, dim=dims, keepdim=True)
    unit.div_(_masked(length))
    return unit, (scale * length).squeeze(dims)


def _row_terms(jac_a: Tensor, jac_b: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(cos_i, n_i^A, n_i^B), each [..., D_out]; cos_i = 0 where a row is zero.

    Rows are normalised before the dot product, as the authors did.
    """
    unit_a, n_a = _unit(jac_a)  # [..., D_out, D_in], [..., D_out]
    unit_b, n_b = _unit(jac_b)
    cos = torch.einsum("...ij,...ij->...i", unit_a, unit_b).clamp(-1.0, 1.0)
    return cos, n_a, n_b


def _relative(n: Tensor) -> Tensor:
    """Row norms divided by their maximum: the weights below are invariant to this scale,
    and it keeps products of tiny norms from underflowing."""
    return n / _masked(n.amax(dim=-1, keepdim=True))


def _weighted(cos: Tensor, n_a: Tensor, n_b: Tensor) -> Tensor:
    w = _relative(n_a) * _relative(n_b)  # [..., D_out]
    w = w / _masked(w.sum(dim=-1, keepdim=True))
    return (w * cos).sum(dim=-1).clamp(-1.0, 1.0)


def _printed(cos: Tensor, n_a: Tensor, n_b: Tensor) -> Tensor:
    alpha_a = n_a / _masked(n_a.sum(dim=-1, keepdim=True))  # Eq. 4
    alpha_b = n_b / _masked(n_b.sum(dim=-1, keepdim=True))
    # Eq. 3: sum_i a_i^A a_i^B <J^A[i], J^B[i]>, with <J^A[i], J^B[i]> = n_i^A n_i^B cos_i.
    return ((alpha_a * n_a) * (alpha_b * n_b) * cos).sum(dim=-1)


def _mean(cos: Tensor, n_a: Tensor, n_b: Tensor) -> Tensor:
    return cos.mean(dim=-1)


def _frobenius(cos: Tensor, n_a: Tensor, n_b: Tensor) -> Tensor:
    # <A, B>_F = sum_i n_i^A n_i^B cos_i; ||A||_F^2 = sum_i (n_i^A)^2 (scale-free form).
    a, b = _relative(n_a), _relative(n_b)
    norms = torch.sqrt((a * a).sum(dim=-1) * (b * b).sum(dim=-1))
    return ((a * b * cos).sum(dim=-1) / _masked(norms)).clamp(-1.0, 1.0)


# Every metric as a function of the row terms (cos_i, n_i^A, n_i^B); `--metric` names one.
METRICS: dict[str, Callable[[Tensor, Tensor, Tensor], Tensor]] = {
    "weighted": _weighted, "printed": _printed, "mean": _mean, "frobenius": _frobenius}


def gradient_stability(jac_a: Tensor, jac_b: Tensor) -> Tensor:
    """Norm-weighted mean row cosine, as the authors' code computed it
    (docs/paper-facts.md#gradient-stability).

    jac_a, jac_b [..., D_out, D_in] -> [...]: sum_i w_i cos_i with
    w_i = n_i^A n_i^B / sum_k n_k^A n_k^B. 1 for identical Jacobians, in [-1, 1]; zero rows
    contribute 0, and two all-zero Jacobians give 0.
    """
    return _weighted(*_row_terms(jac_a, jac_b))


def frobenius_distance(jac_a: Tensor, jac_b: Tensor) -> Tensor:
    """||J^A - J^B||_F, [..., D_out, D_in] -> [...]."""
    return _unit(jac_a - jac_b, (-2, -1))[1]


def forward_distance(out_a: Tensor, out_b: Tensor) -> Tensor:
    """L2 distance of the two sequences' outputs [..., D] -> [...]."""
    return _unit(out_a - out_b)[1]


def forward_cosine(out_a: Tensor, out_b: Tensor) -> Tensor:
    """Cosine of the two sequences' outputs [..., D] -> [...] (0 if either is zero)."""
    return (_unit(out_a)[0] * _unit(out_b)[0]).sum(dim=-1).clamp(-1.0, 1.0)


def stability_metrics(jac_a: Tensor, jac_b: Tensor) -> dict[str, Tensor]:
    """Every metric of METRICS plus `frobenius_distance`, sharing one pass over the rows."""
    rows = _row_terms(jac_a, jac_b)
    out = {name: fn(*rows) for name, fn in METRICS.items()}
    out["frobenius_distance"] = frobenius_distance(jac_a, jac_b)
    return out


# --------------------------------------------------------------------------------------
# Triplets (docs/paper-facts.md#stability-triplets).
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Triplets:
    """`count` triplets; tokens [count, 3, L] are the input phases of the three sequences.

    Member 0 = (p, x, s), 1 = (p, x, s'), 2 = (p', x', s): x the target, s the disturbants
    after it, p the prefix before it (S4D only; empty for the RNNs). As in the authors'
    code, the prefix is shared by the common-target pair only, and primed tokens are drawn
    independently (x' may equal x by chance). Triplet i has target type
    TYPES[target_rare[i]] and disturbant (prefix and suffix) type TYPES[disturbants_rare[i]];
    the conditions come in blocks of count/4: (F, F), (F, R), (R, F), (R, R).
    """

    tokens: Tensor  # [n, 3, L]
    target_rare: Tensor  # bool [n]
    disturbants_rare: Tensor  # bool [n]
    prefix_length: int

    def inputs(self, command: int) -> Tensor:
        """Model inputs [n, 3, 2L - prefix]: the prefix need not be reconstructed, so only
        L - prefix command tokens follow (docs/paper-facts.md#s4d-stability); for the RNNs that is
        the full 2L."""
        n, _, L = self.tokens.shape
        tail = self.tokens.new_full((n, 3, L - self.prefix_length), command)
        return torch.cat([self.tokens, tail], dim=-1)


def make_triplets(vocab_size: int, length: int, count: int, seed: int,
                  prefix_length: int = 0) -> Triplets:
    """Triplets for a dual-frequency model of vocabulary K and input length L
    (docs/paper-facts.md#stability-triplets)."""
    if count % 4 or count <= 0:
        raise UserError(f"--triplets {count}: must be a positive multiple of 4 (a quarter "
                        "per target x disturbant condition)")
    if not 0 <= prefix_length < length:
        raise UserError(f"prefix of {prefix_length} tokens does not fit an input of {length}")
    gen = torch.Generator().manual_seed(seed + checkpoints.STABILITY_SEED_OFFSET)
    condition = torch.arange(count) // (count // 4)  # 0..3 in blocks
    target_rare, disturbants_rare = condition >= 2, condition % 2 == 1

    def draw(rare: Tensor, width: int) -> Tensor:  # [n] types -> [n, 2, width] tokens
        return half_tokens(rare[:, None, None].expand(count, 2, width), vocab_size, gen)

    targets = draw(target_rare, 1)  # (x, x')
    suffixes = draw(disturbants_rare, length - 1 - prefix_length)  # (s, s')
    prefixes = draw(disturbants_rare, prefix_length)  # (p, p')
    pick = torch.tensor([0, 0, 1])  # which of (p, p') and of (x, x') each member takes
    tokens = torch.cat([prefixes[:, pick], targets[:, pick],
                        suffixes[:, torch.tensor([0, 1, 0])]], dim=-1)  # [n, 3, L]
    return Triplets(tokens, target_rare, disturbants_rare, prefix_length)


# --------------------------------------------------------------------------------------
# Jacobians of a late output w.r.t. an early state, under torch.func
# (docs/paper-facts.md#gradient-stability).
# --------------------------------------------------------------------------------------


def jacobians(model, tokens: Tensor, target_step: int,
              chunk_size: int = 128) -> tuple[Tensor, Tensor]:
    """(J [B, D_out, D_z], output [B, D_out]) for any model whose registration has a
    `jacobians` hook (perencode.config.registry; the GRU/LSTM's is beside its step function in
    models/rnn.py, the S4D's in models/s4d.py)."""
    return _hook(model.arch)(model, tokens, target_step, chunk_size)


def _hook(arch: str) -> Callable:
    hook = registry.get("model", arch).jacobians
    if hook is None:
        able = [k.name for k in registry.registry("model").values() if k.jacobians is not None]
        raise UserError(f"model.arch = '{arch}': no gradient-stability hook is registered "
                        f"for it (models with one: {', '.join(able)})")
    return hook


# --------------------------------------------------------------------------------------
# The triplets' metrics, a batch at a time.
# --------------------------------------------------------------------------------------

COMPARISONS = (("target", 1), ("suffix", 2))  # member of the triplet compared with member 0


def analyse_triplets(model, triplets: Triplets, command: int, batch: int,
                     device: torch.device, on_batch: Callable[[], None] = lambda: None,
                     ) -> list[dict[str, float | int | str]]:
    """Metrics of every triplet and comparison, `batch` triplets at a time.

    Returns rows (triplet, comparison, target, disturbants, stability_<metric>...) in
    triplet order, the "target" comparison before the "suffix" one.
    """
    inputs = triplets.inputs(command).to(device)  # [n, 3, T]
    rows = []
    for start in range(0, inputs.shape[0], batch):
        chunk = inputs[start:start + batch]
        b = chunk.shape[0]
        jac, out = jacobians(model, chunk.flatten(0, 1), triplets.prefix_length)
        jac = jac.unflatten(0, (b, 3))  # [b, 3, D_out, D_z]
        out = out.unflatten(0, (b, 3))  # [b, 3, D_out]
        values = {}
        for name, other in COMPARISONS:
            metrics = stability_metrics(jac[:, 0], jac[:, other])
            metrics["forward_distance"] = forward_distance(out[:, 0], out[:, other])
            metrics["forward_cosine"] = forward_cosine(out[:, 0], out[:, other])
            values[name] = {k: v.double().cpu().tolist() for k, v in metrics.items()}
        del jac  # free this batch's Jacobians before the next batch computes its own
        for j in range(b):
            i = start + j
            for name, _ in COMPARISONS:
                v = values[name]
                rows.append({
                    "triplet": i, "comparison": name,
                    "target": TYPES[int(triplets.target_rare[i])],
                    "disturbants": TYPES[int(triplets.disturbants_rare[i])],
                    **{f"stability_{m}": v[m][j] for m in METRICS},
                    "frobenius_distance": v["frobenius_distance"][j],
                    "forward_distance": v["forward_distance"][j],
                    "forward_cosine": v["forward_cosine"][j],
                })
        on_batch()
    return rows
