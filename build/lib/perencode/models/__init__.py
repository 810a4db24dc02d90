"""The model contract and construction from a recipe.

Every model maps tokens [B, T] to features [B, T, H] with `forward`, has a `head` (Linear
H -> K) applied only where outputs are scored (`output_logits`) and an `arch` name. For the
gradient-stability analysis the recurrence also runs step by step from an explicit state:
`RecurrentModel.initial_state/step`, and `S4DModel.s4d.initial_state/step` for the S4D.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from perencode.models.rnn import RecurrentModel
from perencode.models.s4d import S4DModel
from perencode.recipe import Recipe
from perencode.tasks import Batch, make


def build_model(recipe: Recipe, task) -> nn.Module:
    """A freshly initialised model of `recipe` sized for `task` (its vocabulary, classes,
    longest input and padding row)."""
    m = recipe.model
    sizes = dict(num_embeddings=task.num_embeddings, num_classes=task.num_classes,
                 embed_size=m.embed_size, hidden_size=m.hidden_size, encoding=recipe.encoding,
                 max_positions=task.max_steps, padding_idx=task.pad_id)
    if m.arch == "s4d":
        return S4DModel(d_state=m.d_state, **sizes)
    return RecurrentModel(m.arch, **sizes)


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
