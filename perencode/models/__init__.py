"""Sequence models and their construction from a recipe.

The contract every model follows, and the front end they share, is `base.SequenceModel`;
each model module registers its kinds (perencode.kinds: gru, lstm, s4d), and `build_model`
builds the one a recipe names. Models know nothing of tasks: they are sized by
`ModelSizes`; pairing a model with its task is perencode.experiment's.
"""

from __future__ import annotations

from perencode import kinds
from perencode.models import rnn, s4d
from perencode.models.base import ModelSizes, SequenceModel
from perencode.recipe import Recipe

__all__ = ["MODULES", "ModelSizes", "SequenceModel", "build_model"]

# Imported for their registrations.
MODULES = (rnn, s4d)


def build_model(recipe: Recipe, task) -> SequenceModel:
    """A freshly initialised model of `recipe` sized for `task` (anything with the task
    attributes `ModelSizes.of` reads), built by the registered `model.arch`."""
    sizes = ModelSizes.of(task)
    return kinds.get("model", recipe.model.arch).build(recipe.model, recipe.encoding, sizes)
