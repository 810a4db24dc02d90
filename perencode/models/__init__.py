"""The model contract and construction from a recipe.

Every model maps tokens [B, T] to features [B, T, H] with `forward`, has a `head` (Linear
H -> K) applied only where outputs are scored (`output_logits`) and an `arch` name. For the
gradient-stability analysis the recurrence also runs step by step from an explicit state:
`RecurrentModel.initial_state/step`, and `S4DModel.s4d.initial_state/step` for the S4D.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from perencode import kinds
from perencode.models import rnn, s4d
from perencode.recipe import Recipe
from perencode.tasks import Batch, make

# Imported for their registrations (perencode.kinds): gru, lstm, s4d.
MODULES = (rnn, s4d)


def build_model(recipe: Recipe, task) -> nn.Module:
    """A freshly initialised model of `recipe` sized for `task` (its vocabulary, classes,
    longest input and padding row), built by the registered `model.arch`."""
    sizes = dict(num_embeddings=task.num_embeddings, num_classes=task.num_classes,
                 max_positions=task.max_steps, padding_idx=task.pad_id)
    return kinds.get("model", recipe.model.arch).build(recipe.model, recipe.encoding, sizes)


def build(recipe: Recipe, device: torch.device) -> tuple:
    """(task, model): the task with its held-out set drawn from the seed, and the model
    initialised from the seed, on `device`."""
    task = make(recipe.task, recipe.train.seed, device)
    torch.manual_seed(recipe.train.seed)
    return task, build_model(recipe, task).to(device)


def output_features(model: nn.Module, batch: Batch) -> Tensor:
    """Model features at the output steps only [B, T_out, H]."""
    h = model(batch.inputs)  # [B, T, H]
    T_out = batch.output_targets.shape[1]
    if batch.output_steps is None:
        return h[:, -T_out:]  # [B, T_out, H]
    return h.gather(1, batch.output_steps[..., None].expand(-1, -1, h.shape[-1]))


def output_logits(model: nn.Module, batch: Batch) -> Tensor:
    """Logits at the output steps [B, T_out, K]: the head never runs on input steps."""
    return model.head(output_features(model, batch))
