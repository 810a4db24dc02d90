"""The plugin API: everything a task, model or encoding of one's own needs from perencode, in
one module (docs/extending.md). A plugin imports from here; the modules these names live in
may move, this module's names stay.

- Registering a kind: `register_task` / `register_model` / `register_encoding` with a
  `TaskKind` / `ModelKind` / `EncodingKind`.
- A task: subclass `SyntheticTask` (or a task close to yours, e.g. `ReverseTask`); its
  config extends `HeldOutConfig` (or `TaskConfig`); it yields `Batch`es and its sizes are
  one `Shapes`.
- A model: subclass `SequenceModel` (the shared front end); its config extends
  `ModelConfig`, and it reads the recipe's `EncodingConfig`.
- An encoding: vectors by position, joined to the token embedding by one of `JOINS`.
- Running one from Python: `load_recipe` and `train`.
"""

from __future__ import annotations

from perencode.config.recipe import EncodingConfig, ModelConfig, Recipe, TaskConfig, load_recipe
from perencode.config.registry import (
    EncodingKind,
    ModelKind,
    TaskKind,
    register_encoding,
    register_model,
    register_task,
)
from perencode.kinds.encoding import JOINS
from perencode.kinds.models.base import SequenceModel
from perencode.kinds.shapes import Shapes
from perencode.kinds.tasks.base import Batch, HeldOutConfig, SyntheticTask
from perencode.kinds.tasks.reverse import ReverseTask
from perencode.training.loop import train

__all__ = ["JOINS", "Batch", "EncodingConfig", "EncodingKind", "HeldOutConfig", "ModelConfig",
           "ModelKind", "Recipe", "ReverseTask", "SequenceModel", "Shapes", "SyntheticTask",
           "TaskConfig", "TaskKind", "load_recipe", "register_encoding", "register_model",
           "register_task", "train"]
