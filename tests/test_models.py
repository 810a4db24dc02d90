"""The model contract (perencode.kinds.models): every registered model with every registered
encoding maps tokens [B, T] to features [B, T, H] through the shared front end, is causal,
and is sized by the task's Shapes alone."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_MODEL, tiny_model

from perencode.config import registry
from perencode.config.recipe import EncodingConfig, Recipe, TaskConfig
from perencode.kinds.models import SequenceModel, Shapes, build_model
from perencode.kinds.tasks import make

SHAPES = Shapes(num_embeddings=7, num_classes=6, steps=10, outputs=5)
ARCHS = ["gru", "lstm", "s4d"]
ENCODINGS = ["none", "sinusoidal", "random", "learnable", "duplicate"]


def model_of(arch: str, encoding: str, mode: str = "concat") -> SequenceModel:
    recipe = Recipe.model_validate({"model": tiny_model(arch),
                                    "encoding": {"kind": encoding, "mode": mode}})
    torch.manual_seed(0)
    return build_model(recipe, SHAPES)


def test_the_package_registers_its_models_and_encodings():
    assert registry.names("model") == ARCHS
    assert registry.names("encoding") == ENCODINGS


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_features_shape_width_and_head(arch, encoding):
    model = model_of(arch, encoding)
    E, H = TINY_MODEL["embed_size"], TINY_MODEL["hidden_size"]
    assert isinstance(model, SequenceModel) and model.arch == arch
    assert model.in_features == (E if encoding == "none" else 2 * E)
    tokens = torch.randint(0, 7, (3, 10))
    assert model.cell_inputs(tokens).shape == (3, 10, model.in_features)
    assert model(tokens).shape == (3, 10, H)
    assert (model.head.in_features, model.head.out_features) == (H, 6)


@pytest.mark.parametrize("arch", ARCHS)
def test_added_encoding_keeps_the_width(arch):
    model = model_of(arch, "sinusoidal", mode="add")
    assert model.in_features == TINY_MODEL["embed_size"]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("encoding", ["none", "sinusoidal"])
def test_models_are_causal(arch, encoding):
    """Changing the token at step t changes no feature before t, and some feature at t."""
    model = model_of(arch, encoding)
    tokens = torch.randint(0, 7, (2, 10))
    changed = tokens.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 7
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :6], b[:, :6])
    assert not torch.allclose(a[:, 6], b[:, 6])


def test_the_sinusoidal_table_is_recomputed_the_others_are_stored():
    assert "encoding.table" not in model_of("gru", "sinusoidal").state_dict()
    assert "encoding.table" in model_of("gru", "random").state_dict()
    learnable = model_of("gru", "learnable")
    assert learnable.encoding.table is not None and learnable.encoding.table.requires_grad
    assert "encoding.table" in dict(learnable.named_parameters())


def test_the_contract_is_abstract():
    with pytest.raises(TypeError, match="forward"):
        SequenceModel(SHAPES, 4, EncodingConfig())  # type: ignore[abstract]


def test_sizes_come_from_the_task():
    """Reverse K = 6, L = 5: the command token is the 7th embedding row, 6 classes, 10
    steps of inputs (the random table's rows), 5 scored outputs."""
    task = make(TaskConfig.of(name="reverse", vocab_size=6, length=5, held_out=8), 0)
    assert task.shapes == Shapes(7, 6, 10, 5, None, 8)
    recipe = Recipe.model_validate({"model": tiny_model("gru"),
                                    "encoding": {"kind": "random"}})
    model = build_model(recipe, task.shapes)
    assert (model.embedding.num_embeddings, model.head.out_features) == (7, 6)
    assert model.encoding.table is not None and model.encoding.table.shape[0] == 10
