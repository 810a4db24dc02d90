"""perencode.commands.bench (the timed training step and its bare reference; tests/test_cli.py times
both through `perencode bench --baseline`) and the compute model of perencode.training.planning
(FLOPs and parameters per iteration), on known answers."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

from perencode.commands.bench import bare_loop, bench
from perencode.common.errors import UserError
from perencode.config import registry
from perencode.config.recipe import validate
from perencode.kinds.models import SequenceModel, Shapes
from perencode.kinds.models.rnn import CELLS
from perencode.training.planning import flops_per_iteration, layer_parameters
from perencode.training.session import build

CPU = torch.device("cpu")


def recipe(task="reverse", arch="gru", kind="sinusoidal", **task_cfg):
    t = {"name": task, "vocab_size": 16, "length": 6, **task_cfg}
    if task != "dual_frequency":
        t.setdefault("held_out", 8)
    return validate({"task": t, "model": {"arch": arch, "hidden_size": 12, "embed_size": 8},
                     "encoding": {"kind": kind}, "train": {"batch_size": 4}}, "test")


@pytest.mark.parametrize("task, arch", [("reverse", "s4d"), ("predecessor", "gru")])
def test_the_bare_loop_is_refused_where_it_has_no_twin(task, arch):
    with pytest.raises(UserError, match="--baseline: the bare reference loop exists for gru "
                                        "and lstm on the fixed-length reverse and sort"):
        bench(recipe(task, arch), CPU, iterations=1, warmup=0, baseline=True)


@pytest.mark.slow
@pytest.mark.compat
def test_the_bare_loop_learns_the_reverse_task():
    """The reference is a real training loop: from the uniform guess's loss (log K) it
    learns to reverse K = 4 tokens of L = 3 within a hundred steps."""
    r = validate({"task": {"vocab_size": 4, "length": 3, "held_out": 8},
                  "model": {"hidden_size": 32, "embed_size": 16},
                  "train": {"batch_size": 64}}, "test")
    step = bare_loop(r, CPU)
    losses = [float(step()) for _ in range(100)]
    assert losses[0] == pytest.approx(math.log(4), abs=0.2)
    assert max(losses[-5:]) < 0.7 * losses[0]


@pytest.mark.parametrize("kind, mode", [("sinusoidal", "concat"), ("sinusoidal", "add"),
                                        ("none", "concat"), ("duplicate", "concat")])
def test_the_bare_cell_reads_the_models_input_width(monkeypatch, kind, mode):
    """E = 8: 2E where the encoding is concatenated (or the embedding duplicated), E where
    it is added or absent; the same width as the model's own first layer."""
    widths = []

    def recording_gru(input_size, *args, **kwargs):
        widths.append(input_size)
        return nn.GRU(input_size, *args, **kwargs)

    r = validate({**recipe(kind=kind).to_dict(), "encoding": {"kind": kind, "mode": mode}},
                 "test")
    model = build(r, CPU)[1]
    monkeypatch.setitem(CELLS, "gru", recording_gru)  # the cell bench shares with the model
    step = bare_loop(r, CPU)
    assert math.isfinite(float(step()))
    assert widths == [model.in_features] == [{"concat": 16, "add": 8}[mode]
                                              if kind != "none" else 8]


def test_the_printed_ratio_is_the_ratio_of_the_printed_times():
    result = bench(recipe(), CPU, iterations=3, warmup=1, baseline=True)
    assert result["ratio_to_bare"] == pytest.approx(
        result["seconds_per_iteration"] / result["bare_seconds_per_iteration"], rel=1e-12)
    assert result["sequences_per_second"] == pytest.approx(4 / result["seconds_per_iteration"])


def test_the_baseline_times_both_loops_free_running_in_blocks(monkeypatch):
    """Each timed call synchronises once, at its end (perencode.common.device.free_running_seconds):
    the steps run back to back between, as in training, so a host sync inside the step
    costs what it costs there. Timing each step on its own hid it."""
    from perencode.commands import bench as bench_module

    timed = []
    real = bench_module._time

    def spy(step, iterations, warmup, device):
        timed.append(iterations)
        return real(step, iterations, warmup, device)

    monkeypatch.setattr(bench_module, "_time", spy)
    bench(recipe(), CPU, iterations=25, warmup=1, baseline=True)
    assert timed == [10, 10, 10, 10, 5, 5]  # ours and the bare loop in turn, 25 steps each
    assert bench_module.BASELINE_BLOCK == 10


# -- cost: FLOPs per iteration ---------------------------------------------------------
# D = 2E = 16 (concatenated encoding), H = 12, K = 16, L = 6, B = 4; forward + backward = 3x.

def test_flops_of_a_gru_on_reverse():
    T, outputs, per_step = 12, 6, 3 * (16 * 12 + 12 * 12)  # 3 gates map input and state
    assert flops_per_iteration(recipe()) == 3 * 2 * 4 * (T * per_step + outputs * 12 * 16)


def test_flops_follow_the_tasks_own_shapes():
    """Predecessor: L + 1 steps and one output; reverse_add: 2L steps (x, then y as the
    inputs of the output phase), L outputs; an LSTM has four gates."""
    per_step = 4 * (16 * 12 + 12 * 12)
    assert flops_per_iteration(recipe("predecessor", "lstm")) == \
        3 * 2 * 4 * (7 * per_step + 1 * 12 * 16)
    assert flops_per_iteration(recipe("reverse_add", "lstm")) == \
        3 * 2 * 4 * (12 * per_step + 6 * 12 * 16)


def test_flops_of_the_s4d_and_of_a_vanilla_input():
    # S4D: input map D x H, kernel H x N, output GLU map 2H x H, FFT over 2T points.
    s4d = recipe(arch="s4d")
    per_step = 16 * 12 + 12 * 64 + 2 * 12 * 12 + 5 * 12 * 4.584962500721156  # log2(24)
    assert flops_per_iteration(s4d) == pytest.approx(3 * 2 * 4 * (12 * per_step + 6 * 12 * 16))
    # Without an encoding the cell reads E = 8 inputs.
    assert flops_per_iteration(recipe(kind="none")) == \
        3 * 2 * 4 * (12 * 3 * (8 * 12 + 12 * 12) + 6 * 12 * 16)


class ElmanModel(SequenceModel):
    arch = "elman_bench"

    def __init__(self, cfg, encoding, shapes: Shapes):
        super().__init__(shapes, cfg.embed_size, encoding)
        self.rnn = nn.RNN(self.in_features, cfg.hidden_size, batch_first=True)
        self.head = nn.Linear(cfg.hidden_size, shapes.num_classes)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.rnn(self.cell_inputs(tokens))[0]


def test_a_model_without_a_flops_hook_counts_one_per_layer_parameter():
    registry.register_model(registry.ModelKind("elman_bench", ElmanModel, label="Elman"))
    try:
        r = recipe(arch="elman_bench")
        layer = 12 * (16 + 12) + 2 * 12  # weight_ih, weight_hh, two biases
        assert layer_parameters(r) == layer
        assert flops_per_iteration(r) == 3 * 2 * 4 * (12 * layer + 6 * 12 * 16)
    finally:
        del registry.registry("model")["elman_bench"]
    # The GRU's layer, for comparison: its hook counts the weights, not the biases.
    assert layer_parameters(recipe()) == 3 * 12 * (16 + 12) + 6 * 12
