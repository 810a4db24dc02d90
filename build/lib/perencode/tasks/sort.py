"""Sorting (Appendix A.2, Fig. 8 and 12; SPEC §4).

L tokens uniform in [0, K) drawn with replacement, then L command tokens; during the
command steps the model emits the input in ascending order, ties kept (8, 2, 8 -> 2, 8, 8).
"""

from __future__ import annotations

from torch import Tensor

from perencode.tasks.reverse import ReverseTask


class SortTask(ReverseTask):
    """Reverse ordering's layout and draws; only the target differs."""

    name = "sort"

    def transform(self, rows: Tensor) -> Tensor:
        return rows.sort(dim=1).values  # [B, L], stable for ties
