"""Sequence models and their construction from a recipe.

The contract every model follows, and the front end they share, is `base.SequenceModel`;
each model module registers its kinds (perencode.config.registry: gru, lstm, s4d), and `build_model`
builds the one a recipe names. Models know nothing of tasks: they are sized by the task's
`Shapes` (perencode.kinds.shapes); pairing a model with its task is perencode.training.session's.
"""

from __future__ import annotations

from perencode.config import registry
from perencode.config.recipe import Recipe
from perencode.kinds.models import rnn, s4d
from perencode.kinds.models.base import SequenceModel
from perencode.kinds.shapes import Shapes

__all__ = ["MODULES", "SequenceModel", "Shapes", "build_model"]

# Imported for their registrations.
MODULES = (rnn, s4d)


def build_model(recipe: Recipe, shapes: Shapes) -> SequenceModel:
    """A freshly initialised model of `recipe` sized by what its task feeds it (`shapes`:
    `task.shapes`), built by the registered `model.arch`."""
    return registry.get("model", recipe.model.arch).build(recipe.model, recipe.encoding, shapes)
