"""Positional encodings (SPEC §1, Appendix C/D) and how they join the token embedding.

`sinusoidal` is the public formula; `PositionalEncoding` is the module the models use:
it maps embeddings [B, T, E] to cell inputs [B, T, out_features].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from perencode.recipe import EncodingConfig


def sinusoidal(num_positions: int, dim: int) -> Tensor:
    """Sinusoidal PE as the authors' code lays it out: [sin(angle) | cos(angle)] / sqrt(dim/2).

    angle[t, i] = t * 10000^(-2i/dim), t = 0..num_positions-1, i = 0..dim/2-1, so every row
    has L2 norm exactly 1 (SPEC §1). Returns float32 [num_positions, dim].
    """
    if dim % 2:
        raise ValueError(f"dim must be even, got {dim}")
    t = torch.arange(num_positions, dtype=torch.float64)[:, None]  # [T, 1]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    angle = t * freq[None, :]  # [T, dim/2]
    pe = torch.cat([angle.sin(), angle.cos()], dim=-1) / math.sqrt(dim / 2)  # [T, dim]
    return pe.float()


class PositionalEncoding(nn.Module):
    """Embedding -> cell input. `none` passes through; the others concat (default) or add."""

    def __init__(self, cfg: EncodingConfig, dim: int, max_positions: int):
        super().__init__()
        self.kind, self.mode, self.dim = cfg.kind, cfg.mode, dim
        self.table: Tensor | None
        if cfg.kind == "sinusoidal":
            # Recomputed at construction, so it is not stored in checkpoints.
            self.register_buffer("table", sinusoidal(max_positions, dim), persistent=False)
        elif cfg.kind == "random":
            # Fixed, not trained: i.i.d. normal rows on the unit sphere (Appendix C).
            table = F.normalize(torch.randn(max_positions, dim), p=2.0, dim=-1)
            self.register_buffer("table", table)
        elif cfg.kind == "learnable":
            self.table = nn.Parameter(torch.randn(max_positions, dim))
        else:  # none, duplicate
            self.table = None
        widens = cfg.kind != "none" and cfg.mode == "concat"
        self.out_features = 2 * dim if widens else dim

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: [B, T, E] embeddings of time steps offset..offset+T-1 -> [B, T, out_features]."""
        if self.kind == "none":
            return x
        if self.kind == "duplicate":
            return torch.cat([x, x], dim=-1)  # [B, T, 2E], "double vanilla" (Appendix D)
        T = x.shape[1]
        if offset + T > self.table.shape[0]:
            raise ValueError(f"sequence of {offset + T} steps exceeds the encoding's "
                             f"{self.table.shape[0]} positions")
        pe = self.table[offset:offset + T].to(x.dtype)  # [T, E]
        if self.mode == "add":
            return x + pe
        return torch.cat([x, pe.expand(x.shape[0], T, self.dim)], dim=-1)  # [B, T, 2E]
