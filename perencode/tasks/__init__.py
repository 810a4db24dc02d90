"""Task generators behind `task.name`: `make(task_cfg, seed)` builds one.

Every task object has `.held_out` (drawn from the seed before training), `.sample(batch_size,
generator)` -> Batch (on the generator's device, never a held-out row), `.held_out_batches`
and `.score`, plus `num_embeddings`, `num_classes` and `max_steps` for the model.
"""

from __future__ import annotations

import torch

from perencode.recipe import TaskConfig
from perencode.tasks.base import Batch, SyntheticTask
from perencode.tasks.dual_frequency import DualFrequencyTask
from perencode.tasks.predecessor import PredecessorTask
from perencode.tasks.reverse import ReverseTask, VariableLengthReverseTask
from perencode.tasks.reverse_add import ReverseAddTask
from perencode.tasks.sort import SortTask

__all__ = ["Batch", "SyntheticTask", "make"]


def make(task_cfg: TaskConfig, seed: int, device: torch.device | str = "cpu"):
    """Build the task of a recipe's `[task]` section; held-out set fixed by `seed`."""
    if task_cfg.name == "lm":
        from perencode.tasks.lm import LanguageModelTask

        return LanguageModelTask(task_cfg, seed, device)
    if task_cfg.name == "reverse":
        if task_cfg.dual_frequency:
            return DualFrequencyTask(task_cfg, seed, device)
        if task_cfg.min_length is not None:
            return VariableLengthReverseTask(task_cfg, seed, device)
        return ReverseTask(task_cfg, seed, device)
    tasks = {"sort": SortTask, "reverse_add": ReverseAddTask, "predecessor": PredecessorTask}
    return tasks[task_cfg.name](task_cfg, seed, device)
