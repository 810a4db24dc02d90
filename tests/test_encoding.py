import math

import pytest
import torch

from perencode.config import registry
from perencode.config.recipe import EncodingConfig
from perencode.kinds.encoding import PositionalEncoding, input_width, sinusoidal


def test_sinusoidal_known_values_and_unit_norm():
    pe = sinusoidal(128, 8)
    assert pe.shape == (128, 8)
    torch.testing.assert_close(pe.norm(dim=1), torch.ones(128))
    # t = 0: all sines 0, all cosines 1/sqrt(E/2)
    torch.testing.assert_close(pe[0], torch.tensor([0, 0, 0, 0, .5, .5, .5, .5]))
    # t = 3, i = 1: angle = 3 * 10000^(-2/8); sine in column 1, cosine in column 5
    angle = 3 * 10000 ** (-2 / 8)
    assert pe[3, 1].item() == pytest.approx(math.sin(angle) / 2, abs=1e-7)
    assert pe[3, 5].item() == pytest.approx(math.cos(angle) / 2, abs=1e-7)


def test_sinusoidal_paper_shape_norms():
    pe = sinusoidal(128, 512)
    assert torch.allclose(pe.norm(dim=1), torch.ones(128), atol=1e-6)


@pytest.mark.parametrize("kind,mode,width", [
    ("none", "concat", 8), ("sinusoidal", "concat", 16), ("sinusoidal", "add", 8),
    ("random", "concat", 16), ("learnable", "concat", 16), ("learnable", "add", 8),
    ("duplicate", "concat", 16),
])
def test_input_width(kind, mode, width):
    enc = PositionalEncoding(EncodingConfig(kind=kind, mode=mode), 8, 10)
    x = torch.randn(3, 6, 8)
    y = enc(x)
    assert enc.out_features == width
    assert y.shape == (3, 6, width)


def test_trainability_per_kind():
    def trainable(kind):
        enc = PositionalEncoding(EncodingConfig(kind=kind), 8, 10)
        return sum(p.numel() for p in enc.parameters() if p.requires_grad)

    assert trainable("sinusoidal") == 0
    assert trainable("random") == 0
    assert trainable("none") == 0
    assert trainable("duplicate") == 0
    assert trainable("learnable") == 80


def test_random_is_fixed_unit_norm_and_saved():
    enc = PositionalEncoding(EncodingConfig(kind="random"), 8, 10)
    assert enc.table is not None
    torch.testing.assert_close(enc.table.norm(dim=1), torch.ones(10))
    assert "table" in enc.state_dict()  # the draw must survive a checkpoint
    assert "table" not in PositionalEncoding(EncodingConfig(), 8, 10).state_dict()


def test_learnable_receives_gradient_and_duplicate_copies_embedding():
    enc = PositionalEncoding(EncodingConfig(kind="learnable"), 8, 10)
    enc(torch.randn(2, 4, 8)).sum().backward()
    assert enc.table is not None and enc.table.grad is not None
    assert enc.table.grad[:4].abs().sum() > 0 and enc.table.grad[4:].abs().sum() == 0

    dup = PositionalEncoding(EncodingConfig(kind="duplicate"), 8, 10)
    x = torch.randn(2, 4, 8)
    y = dup(x)
    torch.testing.assert_close(y[..., :8], x)
    torch.testing.assert_close(y[..., 8:], x)


def test_concat_appends_time_only_information():
    enc = PositionalEncoding(EncodingConfig(kind="sinusoidal"), 8, 10)
    y = enc(torch.zeros(2, 5, 8))
    torch.testing.assert_close(y[0, :, 8:], sinusoidal(10, 8)[:5])
    torch.testing.assert_close(y[0], y[1])


def test_too_long_sequence_is_an_error():
    enc = PositionalEncoding(EncodingConfig(kind="learnable"), 8, 4)
    with pytest.raises(ValueError, match="exceeds"):
        enc(torch.randn(1, 5, 8))


def test_an_encoding_of_its_own_vectors_joins_as_the_mode_says():
    """An encoding without a table registers the vectors it joins (the duplicate kind's
    copy of the embedding); the join, and the width the memory check counts, follow
    encoding.mode."""
    registry.register_encoding(registry.EncodingKind("negated", label="Negated", vectors=torch.neg))
    try:
        x = torch.arange(12.0).view(1, 3, 4)
        concat = PositionalEncoding(EncodingConfig(kind="negated", mode="concat"), 4, 3)
        torch.testing.assert_close(concat(x), torch.cat([x, -x], dim=-1))
        added = PositionalEncoding(EncodingConfig(kind="negated", mode="add"), 4, 3)
        torch.testing.assert_close(added(x), torch.zeros_like(x))
        for enc, mode in ((concat, "concat"), (added, "add")):
            assert enc.out_features == input_width(EncodingConfig(kind="negated", mode=mode),
                                                   4) == {"concat": 8, "add": 4}[mode]
    finally:
        del registry.registry("encoding")["negated"]
