"""Positional encodings (docs/paper-facts.md#positional-encodings, Appendix C/D) and how they join
the token embedding.

`sinusoidal` is the public formula; `PositionalEncoding` is the module the models use:
it maps embeddings [B, T, E] to cell inputs [B, T, out_features].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from perencode import kinds
from perencode.kinds import EncodingKind, register_encoding
from perencode.recipe import EncodingConfig

# The base of the sinusoids' wavelengths (docs/paper-facts.md#positional-encodings).
SINUSOIDAL_BASE = 10_000.0


def sinusoidal(num_positions: int, dim: int) -> Tensor:
    """Sinusoidal PE as the authors' code lays it out: [sin(angle) | cos(angle)] / sqrt(dim/2).

    angle[t, i] = t * 10000^(-2i/dim), t = 0..num_positions-1, i = 0..dim/2-1, so every row
    has L2 norm exactly 1 (docs/paper-facts.md#positional-encodings). Returns float32
    [num_positions, dim].
    """
    if dim % 2:
        raise ValueError(f"dim must be even, got {dim}")
    t = torch.arange(num_positions, dtype=torch.float64)[:, None]  # [T, 1]
    i2 = torch.arange(0, dim, 2, dtype=torch.float64)  # 2i
    freq = torch.exp(i2 * (-math.log(SINUSOIDAL_BASE) / dim))
    angle = t * freq[None, :]  # [T, dim/2]
    pe = torch.cat([angle.sin(), angle.cos()], dim=-1) / math.sqrt(dim / 2)  # [T, dim]
    return pe.float()


def random_unit(num_positions: int, dim: int) -> Tensor:
    """i.i.d. normal rows scaled onto the unit sphere (Appendix C), [num_positions, dim]."""
    return F.normalize(torch.randn(num_positions, dim), p=2.0, dim=-1)


class PositionalEncoding(nn.Module):
    """Embedding -> cell input, as the registered `encoding.kind` says (perencode.kinds):
    vanilla passes through; a per-position table is concatenated (default) or added; the
    duplicate kind concatenates a second copy of the embedding."""

    def __init__(self, cfg: EncodingConfig, dim: int, max_positions: int):
        super().__init__()
        kind = kinds.get("encoding", cfg.kind)
        self.kind, self.mode, self.dim = cfg.kind, cfg.mode, dim
        self.duplicate = kind.duplicate
        self.table: Tensor | None
        if kind.table is None:
            self.table = None
        elif kind.trained:
            self.table = nn.Parameter(kind.table(max_positions, dim))
        else:
            # A table recomputed at construction is not stored in checkpoints.
            self.register_buffer("table", kind.table(max_positions, dim),
                                 persistent=kind.stored)
        widens = kind.adds_input and cfg.mode == "concat"
        self.out_features = 2 * dim if widens else dim

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: [B, T, E] embeddings of time steps offset..offset+T-1 -> [B, T, out_features]."""
        if self.duplicate:
            return torch.cat([x, x], dim=-1)  # [B, T, 2E], "double vanilla" (Appendix D)
        if self.table is None:
            return x
        T = x.shape[1]
        if offset + T > self.table.shape[0]:
            raise ValueError(f"sequence of {offset + T} steps exceeds the encoding's "
                             f"{self.table.shape[0]} positions")
        pe = self.table[offset:offset + T].to(x.dtype)  # [T, E]
        if self.mode == "add":
            return x + pe
        return torch.cat([x, pe.expand(x.shape[0], T, self.dim)], dim=-1)  # [B, T, 2E]


register_encoding(EncodingKind("none", label="Vanilla", summary="vanilla, no encoding"))
register_encoding(EncodingKind("sinusoidal", label="Position-Encoded",
                               summary="sinusoidal, unit norm", table=sinusoidal,
                               stored=False))
register_encoding(EncodingKind("random", label="Random PE",
                               summary="random fixed vectors of unit norm", table=random_unit))
register_encoding(EncodingKind("learnable", label="Learnable PE",
                               summary="a trained table, N(0, 1) at init", table=torch.randn,
                               trained=True))
register_encoding(EncodingKind("duplicate", label="Double vanilla",
                               summary="a second copy of the embedding ('double vanilla')",
                               duplicate=True, modes=("concat",)))
