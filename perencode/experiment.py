"""A model run at its task's scored outputs. Models (perencode.models) and tasks
(perencode.tasks) do not know each other; this module is where they meet (the pair a
recipe describes is built by perencode.session.build)."""

from __future__ import annotations

from torch import Tensor

from perencode.models import SequenceModel
from perencode.tasks import Batch


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
