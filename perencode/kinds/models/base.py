"""The model contract: what training, evaluation and the stability analysis use of a model,
and the front end every model shares (token embedding + positional encoding)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import Tensor, nn

from perencode.config.recipe import EncodingConfig
from perencode.kinds.encoding import PositionalEncoding
from perencode.kinds.shapes import Shapes


class SequenceModel(nn.Module, ABC):
    """Base of every model: `forward` maps tokens [B, T] to features [B, T, H]; `head`
    (Linear H -> K) is applied by the caller at the scored outputs only; `arch` is the name
    the model is registered under (perencode.config.registry).

    The front end is shared, sized by the task's `Shapes`: `embedding` (its `pad_id`: a
    zero row that is never trained, the authors' LM embedding,
    docs/paper-facts.md#language-modelling) and `encoding` joined to it; `cell_inputs` gives
    the first layer's inputs [B, T, in_features]. A model registered with a stability hook
    also provides the step mode its hook uses (the RNNs' `initial_state`/`step`, the S4D
    block's `step_state`/`readout`).
    """

    arch: str
    head: nn.Linear

    def __init__(self, shapes: Shapes, embed_size: int, encoding: EncodingConfig):
        super().__init__()
        self.embedding = nn.Embedding(shapes.num_embeddings, embed_size,
                                      padding_idx=shapes.pad_id)
        self.encoding = PositionalEncoding(encoding, embed_size, shapes.steps)

    @property
    def in_features(self) -> int:
        """Width of `cell_inputs`: E, or 2E where the encoding is concatenated."""
        return self.encoding.out_features

    def cell_inputs(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] -> embedding + encoding [B, T, in_features]."""
        return self.encoding(self.embedding(tokens))

    @abstractmethod
    def forward(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] -> features [B, T, H] (apply `self.head` for logits)."""
