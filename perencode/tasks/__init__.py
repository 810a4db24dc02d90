"""Task generators behind `task.name`: `make(task_cfg, seed)` builds one.

Every task object has `.held_out` (drawn from the seed before training), `.sample(batch_size,
generator)` -> Batch (on the generator's device, never a held-out row), `.held_out_batches`
and `.score`, plus `num_embeddings`, `num_classes` and `max_steps` for the model.
"""

from __future__ import annotations

import torch

from perencode.recipe import TaskConfig
from perencode.tasks.base import Batch, SyntheticTask
from perencode.tasks.reverse import ReverseTask

__all__ = ["Batch", "SyntheticTask", "make"]


def make(task_cfg: TaskConfig, seed: int, device: torch.device | str = "cpu"):
    """Build the task of a recipe's `[task]` section; held-out set fixed by `seed`."""
    if task_cfg.name == "reverse":
        return ReverseTask(task_cfg, seed, device)
    raise NotImplementedError(f"task.name = {task_cfg.name!r} is not implemented yet")
