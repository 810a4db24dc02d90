"""Reverse ordering (the paper's main task, "palindrome" in the authors' code; SPEC §4).

L tokens uniform in [0, K), then L command tokens; during the command steps the model
emits the input reversed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from perencode.tasks.base import Batch, SyntheticTask


class ReverseTask(SyntheticTask):
    name = "reverse"

    def draw(self, n: int, generator: torch.Generator) -> Tensor:
        return torch.randint(0, self.K, (n, self.L), generator=generator,
                             device=generator.device)  # [n, L]

    def build(self, rows: Tensor) -> Batch:
        command = torch.full_like(rows, self.command)
        inputs = torch.cat([rows, command], dim=1)  # [B, 2L]
        targets = rows.flip(1)  # [B, L]
        return Batch(sequences=rows, inputs=inputs, targets=targets, output_targets=targets)
