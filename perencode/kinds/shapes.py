"""What a task feeds a model: the one record of a task's sizes.

A task gives it (`task.shapes`, or `perencode.kinds.tasks.shapes(task_cfg)` from its config
alone), a model is built from it (perencode.kinds.models), and the memory and cost estimates read
it. It lives below both, so that models and tasks need not import each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shapes:
    """Embedding rows (tokens, plus the command token or the padding row where the task has
    one), head classes, the longest input T (the positions an encoding covers), the scored
    outputs of a sequence, the embedding row that is padding (None: every row is a token)
    and the held-out rows an evaluation batches (None: as many as an evaluation batch
    holds)."""

    num_embeddings: int
    num_classes: int
    steps: int
    outputs: int
    pad_id: int | None = None
    held_out_rows: int | None = None
