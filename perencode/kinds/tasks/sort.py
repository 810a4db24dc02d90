"""Sorting (Appendix A.2, Fig. 8 and 12; docs/paper-facts.md#tasks).

L tokens uniform in [0, K) drawn with replacement, then L command tokens; during the
command steps the model emits the input in ascending order, ties kept (8, 2, 8 -> 2, 8, 8).
"""

from __future__ import annotations

from torch import Tensor

from perencode.config.registry import TaskKind, register_task
from perencode.kinds.tasks.base import HeldOutConfig
from perencode.kinds.tasks.reverse import ReverseTask


class SortTask(ReverseTask):
    """Reverse ordering's layout and draws; only the target differs."""

    def transform(self, rows: Tensor) -> Tensor:
        return rows.sort(dim=1).values  # [B, L], stable for ties


register_task(TaskKind("sort", SortTask, label="Sort", summary="sorting (Fig. 8, 12)",
                       config=HeldOutConfig, baseline=True))
