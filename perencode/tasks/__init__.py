"""Task generators behind `task.name`: `make(task_cfg, seed)` builds one.

Every task object has `.held_out` (drawn from the seed before training), `.sample(batch_size,
generator)` -> Batch (on the generator's device, never a held-out row), `.evaluate`, plus
`num_embeddings`, `num_classes`, `max_steps` and `pad_id` (None, or the embedding row that
is padding) for the model. Each task module registers its task (perencode.kinds); a task
defined elsewhere registers the same way and `make` builds it.
"""

from __future__ import annotations

import torch

from perencode import kinds
from perencode.recipe import TaskConfig
from perencode.tasks import dual_frequency, lm, predecessor, reverse, reverse_add, sort
from perencode.tasks.base import Batch, SyntheticTask

__all__ = ["MODULES", "TASKS", "Batch", "SyntheticTask", "make"]

# Imported for their registrations; TASKS is the registry they fill.
MODULES = (reverse, sort, reverse_add, predecessor, dual_frequency, lm)
TASKS = kinds.TASKS


def make(task_cfg: TaskConfig, seed: int, device: torch.device | str = "cpu"):
    """Build the task of a recipe's `[task]` section; held-out set fixed by `seed`."""
    return kinds.get("task", task_cfg.name).make(task_cfg, seed, device)
