"""Task generators behind `task.name`: `make(task_cfg, seed)` builds one.

Every task object has `.held_out` (drawn from the seed before training), `.sample(batch_size,
generator)` -> Batch (on the generator's device, never a held-out row), `.evaluate`, plus
`.shapes` (perencode.kinds.shapes.Shapes), what it feeds a model. Each task module registers its
task (perencode.config.registry); a task defined elsewhere registers the same way and `make` builds
it.
"""

from __future__ import annotations

import torch

from perencode.config import registry
from perencode.config.recipe import TaskConfig
from perencode.kinds.tasks import dual_frequency, lm, predecessor, reverse, reverse_add, sort
from perencode.kinds.tasks.base import Batch, Shapes, SyntheticTask

__all__ = ["MODULES", "TASKS", "Batch", "Shapes", "SyntheticTask", "held_out_warning", "make",
           "shapes"]

# Imported for their registrations; TASKS is the registry they fill.
MODULES = (reverse, sort, reverse_add, predecessor, dual_frequency, lm)
TASKS = registry.TASKS


def make(task_cfg: TaskConfig, seed: int, device: torch.device | str = "cpu"):
    """Build the task of a recipe's `[task]` section; held-out set fixed by `seed`."""
    return registry.get("task", task_cfg.name).make(task_cfg, seed, device)


def held_out_warning(task, batch_size: int) -> str | None:
    """One line where the task's held-out set leaves little to train on (a synthetic
    task's `held_out_warning`), else None."""
    return task.held_out_warning(batch_size) if isinstance(task, SyntheticTask) else None


_MEASURED: dict[str, Shapes] = {}


def shapes(task_cfg: TaskConfig) -> Shapes:
    """What the task of `task_cfg` feeds a model, for estimates made before a run: its
    registration's `shapes` where it has one (the language model's, which reads no data);
    otherwise the task is built once on the CPU (seed 0) and its `shapes` read, so no formula
    can drift from the task it describes."""
    kind = registry.get("task", task_cfg.name)
    if kind.shapes is not None:
        return kind.shapes(task_cfg)
    key = task_cfg.model_dump_json()
    if key not in _MEASURED:
        _MEASURED[key] = make(task_cfg, 0).shapes
    return _MEASURED[key]
