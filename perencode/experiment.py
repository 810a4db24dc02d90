"""A task and its model: the pair a recipe describes, and the model run at the task's
scored outputs. Models (perencode.models) and tasks (perencode.tasks) do not know each
other; this module is where they meet."""

from __future__ import annotations

import torch
from torch import Tensor

from perencode.models import SequenceModel, build_model
from perencode.recipe import Recipe
from perencode.tasks import Batch, make


def build(recipe: Recipe, device: torch.device) -> tuple:
    """(task, model): the task with its held-out set drawn from the seed, and the model
    initialised from the seed, on `device`."""
    task = make(recipe.task, recipe.train.seed, device)
    torch.manual_seed(recipe.train.seed)
    return task, build_model(recipe, task.shapes).to(device)


def output_features(model: SequenceModel, batch: Batch) -> Tensor:
    """Model features at the output steps only [B, T_out, H]."""
    h = model(batch.inputs)  # [B, T, H]
    T_out = batch.output_targets.shape[1]
    if batch.output_steps is None:
        return h[:, -T_out:]  # [B, T_out, H]
    return h.gather(1, batch.output_steps[..., None].expand(-1, -1, h.shape[-1]))


def output_logits(model: SequenceModel, batch: Batch) -> Tensor:
    """Logits at the output steps [B, T_out, K]: the head never runs on input steps."""
    return model.head(output_features(model, batch))
