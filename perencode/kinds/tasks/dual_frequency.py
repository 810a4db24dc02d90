"""Reverse ordering with a dual-frequency vocabulary (Fig. 3 and 5;
docs/paper-facts.md#dual-frequency-task).

FREQUENT = ids [0, K/2), RARE = ids [K/2, K). A training token is RARE with probability
`rarity` (1/8: seven times rarer per id than a FREQUENT one, as the code had it), then
uniform within its half.

The held-out set is the structured test set of the Fig. 3 caption: for each target type
(FREQUENT/RARE) x disturbant type (FREQUENT/RARE) x target position t = 1..L, there are
`held_out_per_cell` sequences holding one target token of the target type at position t
and L-1 disturbants of the disturbant type, every token uniform within its half. All
4 x L x held_out_per_cell sequences are distinct. Each cell is drawn independently: the
mixed conditions do NOT reuse the tokens of the pure ones (the authors' code built them
by splicing the all-FREQUENT and all-RARE sets; docs/paper-facts.md#dual-frequency-task). Scoring is
on the target token alone, at its output step in the reversed output.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field, model_validator
from torch import Tensor

from perencode.config.recipe import TaskConfig
from perencode.config.registry import TaskKind, register_task
from perencode.kinds.scoring import sequence_scores
from perencode.kinds.tasks.base import Batch, redraw_duplicates
from perencode.kinds.tasks.reverse import ReverseTask

TYPES = ("frequent", "rare")


def half_tokens(rare: Tensor, K: int, generator: torch.Generator) -> Tensor:
    """A token uniform within its half of [0, K) for each element of `rare` (bool, any shape)."""
    tokens = torch.randint(0, K // 2, rare.shape, generator=generator,
                           device=generator.device)
    return tokens + rare.to(tokens.device).long() * (K // 2)


def structured_cells(length: int, per_cell: int) -> Tensor:
    """[4 * length * per_cell, 3] rows (target_rare, disturbants_rare, position 1..length),
    in the order target type, disturbant type, position, copy."""
    cells = torch.cartesian_prod(torch.arange(2), torch.arange(2),
                                 torch.arange(1, length + 1))  # [4 * length, 3]
    return cells.repeat_interleave(per_cell, dim=0)


def structured_rows(cells: Tensor, K: int, length: int, generator: torch.Generator) -> Tensor:
    """One random sequence [N, length] per row of `cells`: disturbants of the cell's
    disturbant type everywhere but the target position, which holds a target-type token."""
    n = len(cells)
    disturbants_rare = cells[:, 1:2].bool().expand(n, length)
    rows = half_tokens(disturbants_rare, K, generator)  # [N, L]
    target = half_tokens(cells[:, 0].bool(), K, generator)  # [N]
    return rows.scatter(1, (cells[:, 2] - 1)[:, None].to(rows.device), target[:, None])


class DualFrequencyTask(ReverseTask):
    def draw(self, n: int, generator: torch.Generator) -> Tensor:
        rare = torch.rand((n, self.L), generator=generator,
                          device=generator.device) < self.cfg.rarity  # [n, L]
        return half_tokens(rare, self.K, generator)

    def space(self) -> int:
        return self.K ** self.L

    def chance(self, rows: Tensor) -> Tensor:
        """Each token rarity/(K/2) if RARE, (1 - rarity)/(K/2) if FREQUENT."""
        token = torch.where(rows >= self.K // 2, self.cfg.rarity, 1.0 - self.cfg.rarity)
        return (token.double() / (self.K // 2)).prod(1)

    def make_held_out(self, generator: torch.Generator) -> Tensor:
        """The structured test set (module docstring); `self.cells` says each row's cell."""
        self.cells = structured_cells(self.L, self.cfg.held_out_per_cell)  # [N, 3]
        rows = structured_rows(self.cells, self.K, self.L, generator)
        return redraw_duplicates(
            rows, lambda idx: structured_rows(self.cells[idx], self.K, self.L, generator))

    def score(self, batches: list[Batch], predictions: list[Tensor]) -> dict:
        """Whole-sequence metrics, plus the target token's accuracy: `target_accuracy`,
        `by_condition` (per condition and position) and `by_band` (per condition and quarter
        of the positions: 1-16, 17-32, 33-48, 49-64 for L = 64)."""
        overall = sequence_scores(batches, predictions)
        pred = torch.cat([p.cpu() for p in predictions])  # [N, L], in held-out order
        rows = self.held_out.cpu()
        target_rare, disturbants_rare, position = self.cells.unbind(1)  # [N] each
        target = rows.gather(1, (position - 1)[:, None])
        # x_t (1-based) is emitted at output index L - t of the reversed output.
        hit = (pred.gather(1, (self.L - position)[:, None]) == target).squeeze(1).double()
        band = (position - 1) * 4 // self.L  # quarter of the positions, 0..3
        by_condition, by_band = [], []
        for tr in range(2):
            for dr in range(2):
                condition = (target_rare == tr) & (disturbants_rare == dr)
                names = {"target": TYPES[tr], "disturbants": TYPES[dr]}
                for t in range(1, self.L + 1):
                    cell = condition & (position == t)
                    by_condition.append(names | {"position": t} | _accuracy(hit, cell))
                for b in range(4):
                    cell = condition & (band == b)
                    if cell.any():  # L < 4 leaves some quarters empty
                        first, last = int(position[cell].min()), int(position[cell].max())
                        by_band.append(names | {"band": f"{first}-{last}", "first": first,
                                                "last": last} | _accuracy(hit, cell))
        return overall | {"target_accuracy": float(hit.mean()), "by_condition": by_condition,
                          "by_band": by_band}


def _accuracy(hit: Tensor, select: Tensor) -> dict:
    return {"accuracy": float(hit[select].mean()), "n": int(select.sum())}


class DualFrequencyConfig(TaskConfig):
    """[task] of dual_frequency: its test set is structured (no `held_out` count); its runs
    keep every checkpoint, each of which the gradient-stability analysis reads (Fig. 4-5)."""

    KEEP_CHECKPOINTS: ClassVar[int | str] = "all"

    rarity: float = Field(
        0.125, gt=0.0, lt=1.0,
        description="Probability that a training token is RARE (FREQUENT = first K/2 ids, "
        "RARE = the rest; docs/paper-facts.md#dual-frequency-task).",
    )
    held_out_per_cell: int = Field(
        16, ge=1,
        description="Test sequences per (target type, disturbant type, target position) "
        "cell: 16 gives the caption's 4,096; 4 gives the authors' 1,024.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> DualFrequencyConfig:
        if self.vocab_size % 2:
            raise ValueError(f"field 'vocab_size': dual frequency needs an even K "
                             f"(got {self.vocab_size})")
        if self.length < 2:
            raise ValueError("field 'length': dual frequency needs L >= 2 (a target among "
                             "disturbants)")
        # A pure condition (all FREQUENT, or all RARE) needs L * per_cell distinct sequences
        # of one half of the vocabulary: (K/2)^L exist.
        per_half = (self.vocab_size // 2) ** self.length
        if self.held_out_per_cell * self.length > per_half:
            raise ValueError(
                f"field 'held_out_per_cell': {self.held_out_per_cell} per cell needs "
                f"{self.held_out_per_cell * self.length} distinct sequences of one half of "
                f"the vocabulary, but only (K/2)^L = {per_half} exist")
        held_out, distinct = 4 * self.length * self.held_out_per_cell, \
            self.vocab_size ** self.length
        if held_out >= distinct:
            raise ValueError(
                f"field 'held_out_per_cell': {self.held_out_per_cell} per cell holds out "
                f"{held_out} sequences, all of the K^L = {distinct} there are: nothing is "
                f"left to train on (at most {(distinct - 1) // (4 * self.length)} per cell)")
        return self


def results(row: dict, metrics: list[dict], tables: dict) -> None:
    """The conditions of a run's tables (by_condition, stability) in the paper's spelling:
    FREQUENT, RARE."""
    for table in tables.values():
        for column in ("target", "disturbants"):
            if column in table:
                table[column] = table[column].str.upper()


register_task(TaskKind(
    "dual_frequency", DualFrequencyTask, label="Dual-frequency reverse",
    summary="reverse with a dual-frequency vocabulary (Fig. 3, 5)", config=DualFrequencyConfig,
    results=results, stability=True))
