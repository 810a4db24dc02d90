"""Sorting (Appendix A.2, Fig. 8 and 12; SPEC §4).

L tokens uniform in [0, K) drawn with replacement, then L command tokens; during the
command steps the model emits the input in ascending order, ties kept (8, 2, 8 -> 2, 8, 8).
"""

from __future__ import annotations

import torch
from torch import Tensor

from perencode.tasks.base import Batch, SyntheticTask


class SortTask(SyntheticTask):
    name = "sort"

    def draw(self, n: int, generator: torch.Generator) -> Tensor:
        return torch.randint(0, self.K, (n, self.L), generator=generator,
                             device=generator.device)  # [n, L]

    def build(self, rows: Tensor) -> Batch:
        command = torch.full_like(rows, self.command)
        inputs = torch.cat([rows, command], dim=1)  # [B, 2L]
        targets = rows.sort(dim=1).values  # [B, L]
        return Batch(sequences=rows, inputs=inputs, targets=targets, output_targets=targets)
