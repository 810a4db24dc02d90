"""The example plugin's minGRU (examples/perencode-minrnn) against known answers: the
log-space parallel scan equals the recurrence written out from the paper's equations, step
by step, to float precision. Imported from the example's folder without registering it
(its `plugin` module does that; tests/test_plugins.py installs the package)."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import ROOT
from torch import Tensor

sys.path.insert(0, str(ROOT / "examples" / "perencode-minrnn"))
from perencode_minrnn.mingru import (  # noqa: E402
    MinGRU,
    MinGRUConfig,
    MinGRUModel,
    flops_per_step,
    g,
    jacobians,
    log_g,
    scan_log,
)

from perencode.config.recipe import EncodingConfig  # noqa: E402
from perencode.kinds.models import Shapes  # noqa: E402


def config(**fields) -> MinGRUConfig:
    """The [model] table, validated without the kind being registered in this process."""
    return MinGRUConfig.model_validate({"arch": "mingru", **fields}, context={"any_kind": True})


def written_out(layer: MinGRU, x: Tensor, positive: bool) -> Tensor:
    """h_t = (1 - z_t) h_{t-1} + z_t h~_t from the layer's weights, one step at a time
    (h~ through g where `positive`): the paper's equations, none of the layer's code."""
    H = layer.hidden_size
    W, b = layer.gates.weight, layer.gates.bias
    z = torch.sigmoid(x @ W[:H].T + b[:H])          # [B, T, H]
    candidate = x @ W[H:].T + b[H:]                  # [B, T, H]
    if positive:
        candidate = torch.where(candidate >= 0, candidate + 0.5, torch.sigmoid(candidate))
    h, out = torch.zeros(x.shape[0], H, dtype=x.dtype), []
    for t in range(x.shape[1]):
        h = (1 - z[:, t]) * h + z[:, t] * candidate[:, t]
        out.append(h)
    return torch.stack(out, dim=1)


def test_the_log_space_scan_solves_the_linear_recurrence():
    # h1 = 1, h2 = 0.5 * 1 + 1 = 1.5, h3 = 0.25 * 1.5 + 2 = 2.375
    a = torch.tensor([0.5, 0.5, 0.25], dtype=torch.float64)[None, :, None]
    b = torch.tensor([1.0, 1.0, 2.0], dtype=torch.float64)[None, :, None]
    torch.testing.assert_close(scan_log(a.log(), b.log()).exp().flatten(),
                               torch.tensor([1.0, 1.5, 2.375], dtype=torch.float64),
                               rtol=0, atol=1e-15)


@pytest.mark.parametrize("dtype,tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-4)])
def test_the_parallel_scan_equals_the_sequential_recurrence(dtype, tolerance):
    torch.manual_seed(0)
    layer = MinGRU(6, 5).to(dtype)
    x = 3 * torch.randn(4, 256, 6, dtype=dtype)  # saturated gates: long products underflow
    with torch.no_grad():
        parallel = layer(x)
        stepped = torch.stack(_steps(layer, x), dim=1)
        reference = written_out(layer, x, positive=True)
    torch.testing.assert_close(parallel, reference, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(stepped, reference, rtol=tolerance, atol=tolerance)
    assert (parallel > 0).all()  # g keeps the state positive, as the log-space scan needs


def _steps(layer: MinGRU, x):
    h, out = x.new_zeros(x.shape[0], layer.hidden_size), []
    for t in range(x.shape[1]):
        h = layer.step(x[:, t], h)
        out.append(h)
    return out


def test_without_log_space_the_candidate_is_used_as_it_is():
    torch.manual_seed(1)
    layer = MinGRU(3, 4, log_space=False).double()
    x = torch.randn(2, 20, 3, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), written_out(layer, x, positive=False),
                                   rtol=0, atol=1e-14)


def test_g_is_positive_continuous_and_its_log_is_exact_far_below_zero():
    x = torch.tensor([-80.0, -5.0, -1e-6, 0.0, 1e-6, 3.0], dtype=torch.float64)
    torch.testing.assert_close(g(x), torch.tensor([torch.sigmoid(torch.tensor(-80.0)).item(),
                                                   torch.sigmoid(torch.tensor(-5.0)).item(),
                                                   0.5 - 2.5e-7, 0.5, 0.5 + 1e-6, 3.5],
                                                  dtype=torch.float64))
    # log sigmoid(-80) is -80 - log(1 + e^-80): no underflow to -inf.
    torch.testing.assert_close(log_g(x), torch.log(g(x)))
    assert log_g(torch.tensor([-200.0])).item() == pytest.approx(-200.0)


def test_gradients_stay_finite_over_a_long_sequence():
    torch.manual_seed(2)
    layer = MinGRU(4, 8)
    x = (10 * torch.randn(2, 2048, 4)).requires_grad_()
    layer(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


def test_the_stability_hook_is_the_jacobian_of_the_last_state():
    torch.manual_seed(3)
    model = MinGRUModel(config(hidden_size=5, embed_size=4), EncodingConfig(kind="sinusoidal"),
                        Shapes(9, 8, 12, 12))
    model.double()
    tokens = torch.randint(0, 8, (2, 7))
    J, h_T = jacobians(model, tokens, target_step=2)
    x = model.cell_inputs(tokens).detach()
    for i in range(2):
        h = torch.zeros(5, dtype=torch.float64)
        for t in range(3):
            h = model.rnn.step(x[i, t], h)

        def rest(state, i=i):
            for t in range(3, 7):
                state = model.rnn.step(x[i, t], state)
            return state

        torch.testing.assert_close(J[i], torch.autograd.functional.jacobian(rest, h.detach()))
        torch.testing.assert_close(h_T[i], model(tokens)[i, -1].detach())


def test_its_cost_hook_counts_the_input_maps_and_no_state_matrix():
    assert flops_per_step(config(hidden_size=4, embed_size=8), 16, 10) == 2 * 16 * 4 + 6 * 4
