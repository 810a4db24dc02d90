"""Reverse ordering + delayed addition (Appendix A.1, Fig. 7; docs/paper-facts.md#tasks).

A row is 2L tokens uniform in [0, K): x (the first L) then y (the next L). The model reads
x, then y as the inputs of the output phase (there is no command token, so the embedding
has K rows: the code's `no_padding_token=True`), and at the step that reads y_j it emits
`(x_{L-1-j} + y_j) mod K`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from perencode.config.registry import TaskKind, register_task
from perencode.kinds.tasks.base import Batch, HeldOutConfig, SyntheticTask, all_rows


class ReverseAddTask(SyntheticTask):
    has_command_token = False

    def draw(self, n: int, generator: torch.Generator) -> Tensor:
        return torch.randint(0, self.K, (n, 2 * self.L), generator=generator,
                             device=generator.device)  # [n, 2L]

    def every_row(self) -> Tensor:
        return all_rows(self.K, 2 * self.L)  # [K^2L, 2L]

    def build(self, rows: Tensor) -> Batch:
        x, y = rows[:, :self.L], rows[:, self.L:]  # [B, L] each
        targets = (x.flip(1) + y) % self.K  # [B, L], emitted at the last L steps
        return Batch(sequences=rows, inputs=rows, targets=targets, output_targets=targets)


class ReverseAddConfig(HeldOutConfig):
    def distinct_sequences(self) -> int:
        """K^(2L): a row is x and y, 2L free tokens."""
        return self.vocab_size ** (2 * self.length)


register_task(TaskKind("reverse_add", ReverseAddTask, label="Reverse + delayed addition",
                       summary="reverse ordering + delayed addition (Fig. 7)",
                       config=ReverseAddConfig))
