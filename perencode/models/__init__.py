"""Model construction from a recipe. Every model maps tokens [B, T] to features [B, T, H]
with `forward` and has a `head` (Linear H -> K) applied only where outputs are scored."""

from __future__ import annotations

from torch import nn

from perencode.recipe import Recipe


def build_model(recipe: Recipe, num_embeddings: int, num_classes: int,
                max_positions: int) -> nn.Module:
    m = recipe.model
    if m.arch in ("gru", "lstm"):
        from perencode.models.rnn import RecurrentModel

        return RecurrentModel(m.arch, num_embeddings, num_classes, m.embed_size,
                              m.hidden_size, recipe.encoding, max_positions)
    if m.arch == "s4d":
        from perencode.models.s4d import S4DModel

        return S4DModel(num_embeddings, num_classes, m.embed_size, m.hidden_size, m.d_state,
                        recipe.encoding, max_positions)
    raise ValueError(f"unknown model.arch {m.arch!r}")
