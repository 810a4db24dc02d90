"""Task generators behind `task.name`: `make(task_cfg, seed)` builds one.

Every task object has `.held_out` (drawn from the seed before training), `.sample(batch_size,
generator)` -> Batch (on the generator's device, never a held-out row), `.evaluate`, plus
`num_embeddings`, `num_classes`, `max_steps` and `pad_id` (None, or the embedding row that
is padding) for the model.
"""

from __future__ import annotations

import torch

from perencode.recipe import TaskConfig
from perencode.tasks.base import Batch, SyntheticTask
from perencode.tasks.dual_frequency import DualFrequencyTask
from perencode.tasks.lm import LanguageModelTask
from perencode.tasks.predecessor import PredecessorTask
from perencode.tasks.reverse import ReverseTask, VariableLengthReverseTask
from perencode.tasks.reverse_add import ReverseAddTask
from perencode.tasks.sort import SortTask

__all__ = ["TASKS", "Batch", "SyntheticTask", "make"]

TASKS = {
    "reverse": ReverseTask,
    "sort": SortTask,
    "reverse_add": ReverseAddTask,
    "predecessor": PredecessorTask,
    "dual_frequency": DualFrequencyTask,
    "variable_length": VariableLengthReverseTask,
    "lm": LanguageModelTask,
}


def make(task_cfg: TaskConfig, seed: int, device: torch.device | str = "cpu"):
    """Build the task of a recipe's `[task]` section; held-out set fixed by `seed`."""
    return TASKS[task_cfg.name](task_cfg, seed, device)
