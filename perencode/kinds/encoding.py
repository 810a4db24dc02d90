"""Positional encodings (docs/paper-facts.md#positional-encodings, Appendix C/D) and how they join
the token embedding.

`sinusoidal` is the public formula; `PositionalEncoding` is the module the models use:
it maps embeddings [B, T, E] to cell inputs [B, T, out_features].
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from perencode.config import registry
from perencode.config.recipe import EncodingConfig
from perencode.config.registry import EncodingKind, register_encoding

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


@dataclass(frozen=True)
class Join:
    """How an encoding's vectors v join the embedding x [B, T, E] (`encoding.mode`): the
    cell input, `width` times E wide."""

    apply: Callable[[Tensor, Tensor], Tensor]
    width: int


def concatenate(x: Tensor, v: Tensor) -> Tensor:
    """[x | v]: [B, T, 2E] (v [T, E] is the same for every row)."""
    return torch.cat([x, v.expand_as(x)], dim=-1)


def add(x: Tensor, v: Tensor) -> Tensor:
    """x + v: [B, T, E]."""
    return x + v


# Named functions, not lambdas: a model holding its join still pickles.
JOINS = {"concat": Join(concatenate, 2), "add": Join(add, 1)}


def input_width(cfg: EncodingConfig, embed_size: int) -> int:
    """D_in, the width of the cell input: E joined with the encoding as `cfg.mode` says, E
    without an encoding (vanilla)."""
    if not registry.get("encoding", cfg.kind).adds_input:
        return embed_size
    return JOINS[cfg.mode].width * embed_size


def _takes_config(hook: Callable | None) -> bool:
    """Whether a kind's table or vectors function takes the validated [encoding] table: it
    has a parameter named `cfg`."""
    if hook is None:
        return False
    try:
        return "cfg" in inspect.signature(hook).parameters
    except (TypeError, ValueError):  # a builtin (torch.randn): no config
        return False


class PositionalEncoding(nn.Module):
    """Embedding -> cell input, as the registered `encoding.kind` says (perencode.config.registry):
    vanilla passes through; a per-position table, or the vectors the kind makes of the
    embedding (the duplicate kind's copy), join it as `encoding.mode` says (`JOINS`)."""

    def __init__(self, cfg: EncodingConfig, dim: int, steps: int):
        super().__init__()
        kind = registry.get("encoding", cfg.kind)
        self.kind, self.mode, self.dim = cfg.kind, cfg.mode, dim
        self.vectors = functools.partial(kind.vectors, cfg=cfg) if _takes_config(
            kind.vectors) else kind.vectors
        self.join = JOINS[cfg.mode] if kind.adds_input else None
        # The kind's own module (its parameters train with the model, in its state_dict).
        self.own = kind.module(cfg, dim, steps) if kind.module is not None else None
        self.table: Tensor | None
        if kind.table is None:
            self.table = None
        else:
            table = kind.table(steps, dim, cfg=cfg) if _takes_config(kind.table) else \
                kind.table(steps, dim)
            if kind.trained:
                self.table = nn.Parameter(table)
            else:
                # A table recomputed at construction is not stored in checkpoints.
                self.register_buffer("table", table, persistent=kind.stored)
        self.out_features = input_width(cfg, dim)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: [B, T, E] embeddings of time steps offset..offset+T-1 -> [B, T, out_features]."""
        if self.join is None:
            return x
        if self.own is not None:
            return self.join.apply(x, self.own(x, offset).to(x.dtype))  # [T, E] or [B, T, E]
        if self.vectors is not None:
            return self.join.apply(x, self.vectors(x))
        assert self.table is not None  # adds_input: a table or vectors
        T = x.shape[1]
        if offset + T > self.table.shape[0]:
            raise ValueError(f"sequence of {offset + T} steps exceeds the encoding's "
                             f"{self.table.shape[0]} positions")
        return self.join.apply(x, self.table[offset:offset + T].to(x.dtype))  # pe [T, E]


register_encoding(EncodingKind("none", label="Vanilla", summary="vanilla, no encoding"))
register_encoding(EncodingKind("sinusoidal", label="Position-Encoded",
                               summary="sinusoidal, unit norm", table=sinusoidal,
                               stored=False))
register_encoding(EncodingKind("random", label="Random PE",
                               summary="random fixed vectors of unit norm", table=random_unit))
register_encoding(EncodingKind("learnable", label="Learnable PE",
                               summary="a trained table, N(0, 1) at init", table=torch.randn,
                               trained=True))
def embedding_copy(x: Tensor) -> Tensor:
    """The duplicate kind's vectors: the embedding itself ("double vanilla", Appendix D: the
    embedding twice, as wide as a concatenated encoding)."""
    return x


register_encoding(EncodingKind("duplicate", label="Double vanilla",
                               summary="a second copy of the embedding ('double vanilla')",
                               vectors=embedding_copy, modes=("concat",)))
