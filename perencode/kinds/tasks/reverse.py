"""Reverse ordering (the paper's main task, "palindrome" in the authors' code;
docs/paper-facts.md#tasks).

L tokens uniform in [0, K), then L command tokens; during the command steps the model
emits the input reversed. `VariableLengthReverseTask` is the variable-length version of
Appendix B (Fig. 11, 14); the dual-frequency version is in `dual_frequency.py`.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import Tensor

from perencode.config.registry import TaskKind, register_task
from perencode.kinds.scoring import row_scores, summarise
from perencode.kinds.tasks.base import (
    Batch,
    HeldOutConfig,
    SyntheticTask,
    all_rows,
    redraw_duplicates,
)


class ReverseTask(SyntheticTask):
    def draw(self, n: int, generator: torch.Generator) -> Tensor:
        return torch.randint(0, self.K, (n, self.L), generator=generator,
                             device=generator.device)  # [n, L]

    def every_row(self) -> Tensor:
        return all_rows(self.K, self.L)  # [K^L, L]

    def transform(self, rows: Tensor) -> Tensor:
        """What the model must emit during the command steps: the input reversed."""
        return rows.flip(1)  # [B, L]

    def build(self, rows: Tensor) -> Batch:
        command = torch.full_like(rows, self.command)
        inputs = torch.cat([rows, command], dim=1)  # [B, 2L]
        targets = self.transform(rows)  # [B, L]
        return Batch(sequences=rows, inputs=inputs, targets=targets, output_targets=targets)


class VariableLengthReverseTask(ReverseTask):
    """Reverse ordering with a length l ~ U{min_length..length} per sequence
    (docs/paper-facts.md#variable-length-task).

    A row is [L] with -1 beyond its own length l. The model reads the l tokens, then l
    command tokens, and emits the reversal at its own steps l..2l-1. A batch is padded to
    2 x (its longest l) with the command token, as the authors' code did
    (docs/paper-facts.md#variable-length-task); the models are causal, so the padding after step
    2l-1 does not change a row's outputs and scoring held-out batches padded this way equals the
    code's test with exactly l command tokens. The held-out set holds `held_out` distinct sequences
    of each length.
    """

    def _rows(self, lengths: Tensor, generator: torch.Generator) -> Tensor:
        """Random rows of the given lengths [n] -> [n, L], -1 beyond each length."""
        tokens = torch.randint(0, self.K, (len(lengths), self.L), generator=generator,
                               device=generator.device)  # [n, L]
        beyond = torch.arange(self.L, device=generator.device) >= lengths[:, None].to(
            generator.device)
        return tokens.masked_fill(beyond, -1)

    def draw(self, n: int, generator: torch.Generator) -> Tensor:
        lengths = torch.randint(self.cfg.min_length, self.L + 1, (n,), generator=generator,
                                device=generator.device)
        return self._rows(lengths, generator)

    def space(self) -> int:
        """K^l rows of each length l."""
        return sum(self.K ** length for length in range(self.cfg.min_length, self.L + 1))

    def every_row(self) -> Tensor:
        return torch.cat([torch.nn.functional.pad(all_rows(self.K, length),
                                                  (0, self.L - length), value=-1)
                          for length in range(self.cfg.min_length, self.L + 1)])  # [space, L]

    def chance(self, rows: Tensor) -> Tensor:
        """A length l uniform in min_length..L, then one of its K^l rows."""
        lengths = (rows >= 0).sum(1).double()  # [N]
        return self.K ** -lengths / (self.L + 1 - self.cfg.min_length)

    def make_held_out(self, generator: torch.Generator) -> Tensor:
        """`held_out` distinct rows per length, ordered by length
        (docs/paper-facts.md#held-out-test-sets)."""
        lengths = torch.arange(self.cfg.min_length, self.L + 1).repeat_interleave(
            self.cfg.held_out)  # [n_lengths * held_out]
        rows = self._rows(lengths, generator)
        return redraw_duplicates(rows, lambda idx: self._rows(lengths[idx], generator))

    def build(self, rows: Tensor) -> Batch:
        lengths = (rows >= 0).sum(1)  # [B]
        longest = int(lengths.max())
        rows = rows[:, :longest]  # [B, l_max]
        j = torch.arange(longest, device=rows.device)  # output index
        valid = j < lengths[:, None]  # [B, l_max]
        inputs = torch.full((len(rows), 2 * longest), self.command, dtype=rows.dtype,
                            device=rows.device)  # [B, 2 l_max]
        inputs[:, :longest] = rows.masked_fill(~valid, self.command)
        # Output j of a row of length l is x_{l-1-j}, emitted at step l+j (<= 2 l_max - 1).
        reversed_ = rows.gather(1, (lengths[:, None] - 1 - j).clamp(min=0))
        targets = reversed_.masked_fill(~valid, -1)  # [B, l_max]
        return Batch(sequences=rows, inputs=inputs, targets=targets, output_targets=targets,
                     output_steps=lengths[:, None] + j, output_mask=valid, lengths=lengths)

    def score(self, batches: list[Batch], predictions: list[Tensor]) -> dict:
        """Whole-set metrics plus `by_length`: one row of metrics per input length."""
        rows = row_scores(batches, predictions)
        lengths = torch.cat([b.lengths.cpu() for b in batches])  # type: ignore[union-attr]
        by_length = []
        for length in range(self.cfg.min_length, self.L + 1):
            part = summarise(rows, lengths == length)
            by_length.append({"length": length, "token_accuracy": part["token_accuracy"],
                              "sequence_accuracy": part["sequence_accuracy"],
                              "dl_distance": part["dl_distance"], "n": part["n_sequences"]})
        return summarise(rows) | {"by_length": by_length}


class VariableLengthConfig(HeldOutConfig):
    """[task] of variable_length: `held_out` rows per length min_length..length."""

    min_length: int | None = Field(
        None, ge=1,
        description="The shortest input length (lengths uniform in min_length..length, "
        "docs/paper-facts.md#variable-length-task).",
    )

    def distinct_sequences(self) -> int:
        """K^l of the shortest length l: each length draws its own `held_out` rows."""
        return self.vocab_size ** (self.min_length or self.length)

    def check(self) -> None:
        if self.min_length is None:
            raise ValueError("field 'min_length': task.name = 'variable_length' needs "
                             "task.min_length (the paper: 32 with length 64)")
        if self.min_length > self.length:
            raise ValueError(f"field 'min_length': {self.min_length} > task.length = "
                             f"{self.length}")


register_task(TaskKind("reverse", ReverseTask, label="Reverse",
                       summary="reverse ordering (Fig. 2)", config=HeldOutConfig,
                       baseline=True))
register_task(TaskKind(
    "variable_length", VariableLengthReverseTask, label="Variable-length reverse",
    summary="reverse with lengths min_length..length (Fig. 11, 14)",
    config=VariableLengthConfig))
