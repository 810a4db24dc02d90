"""S4D block and model (docs/paper-facts.md#s4d-model): kernel, convolution vs step mode, init,
causality, and the step function under torch.func as the gradient-stability analysis uses it
(docs/paper-facts.md#s4d-stability)."""

from __future__ import annotations

import cmath
import math

import pytest
import torch
from torch.func import jacrev, vmap

from perencode.config.recipe import EncodingConfig
from perencode.kinds.models.s4d import S4D, S4DModel
from perencode.kinds.shapes import Shapes


def make_layer(d_model: int = 6, d_state: int = 8, dtype: torch.dtype = torch.float64,
               seed: int = 0) -> S4D:
    torch.manual_seed(seed)
    return S4D(d_model, d_state).to(dtype)


def run_steps(layer: S4D, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Step mode over u [B, L, H] from the zero state -> outputs [B, L, H], final state."""
    state = layer.initial_state(u.shape[0])
    ys = []
    for t in range(u.shape[1]):
        y, state = layer.step(u[:, t], state)
        ys.append(y)
    return torch.stack(ys, dim=1), state


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.float64, 1e-10)])
def test_step_mode_equals_convolution_mode(dtype, tol):
    layer = make_layer(dtype=dtype)
    with torch.no_grad():
        # Larger steps than the init's (dt up to ~0.7) so the modes rotate and decay visibly.
        layer.log_dt.uniform_(math.log(1e-2), math.log(0.7))
        u = torch.randn(3, 64, 6, dtype=dtype)
        y_conv = layer(u)  # [B, L, H]
        y_step, _ = run_steps(layer, u)
    assert y_step.dtype == y_conv.dtype == dtype
    assert (y_step - y_conv).abs().max() <= tol * y_conv.abs().max()


def test_step_state_and_readout_compose_to_step():
    layer = make_layer()
    u_t = torch.randn(2, 6, dtype=torch.float64)
    state = torch.randn(2, 6, 4, dtype=torch.complex128)
    y, new_state = layer.step(u_t, state)
    expected_state = layer.step_state(u_t, state)
    torch.testing.assert_close(new_state, expected_state)
    torch.testing.assert_close(y, layer.readout(u_t, expected_state))


def test_init_values():
    torch.manual_seed(0)
    H, N = 256, 64
    layer = S4D(H, N)
    n = torch.arange(N // 2, dtype=torch.float32)
    torch.testing.assert_close(layer.A_imag, (math.pi * n).expand(H, N // 2))  # S4D-Lin
    torch.testing.assert_close(layer.log_A_real, torch.full((H, N // 2), math.log(0.5)))
    dt = layer.log_dt.exp()
    assert dt.min() >= 1e-3 and dt.max() <= 1e-1
    assert dt.min() < 2e-3 and dt.max() > 5e-2  # spread over the range, not a constant
    assert layer.C.shape == (H, N // 2, 2) and layer.D.shape == (H,)
    # Complex normal C: real and imaginary parts each of variance 1/2; D ~ N(0, 1).
    assert abs(layer.C[..., 0].var().item() - 0.5) < 0.05
    assert abs(layer.C[..., 1].var().item() - 0.5) < 0.05
    assert abs(layer.D.var().item() - 1.0) < 0.3
    assert all(p.requires_grad and p.dtype == torch.float32 for p in layer.parameters())


def set_one_mode(layer: S4D, dt: float, a_real: float, a_imag: float, c: complex) -> None:
    with torch.no_grad():
        layer.log_dt.fill_(math.log(dt))
        layer.log_A_real.fill_(math.log(-a_real))
        layer.A_imag.fill_(a_imag)
        layer.C[..., 0].fill_(c.real)
        layer.C[..., 1].fill_(c.imag)


def test_kernel_known_answer_real_mode():
    # A = -1, dt = ln 2, C = 1/2: exp(dtA) = 1/2, (exp(dtA) - 1)/A = 1/2, so
    # K[l] = 2 * 1/2 * 1/2 * (1/2)^l = 2^-(l+1).
    layer = make_layer(d_model=1, d_state=2)
    set_one_mode(layer, dt=math.log(2.0), a_real=-1.0, a_imag=0.0, c=0.5)
    expected = torch.tensor([2.0 ** -(k + 1) for k in range(8)], dtype=torch.float64)
    torch.testing.assert_close(layer.kernel(8)[0], expected, rtol=1e-12, atol=1e-15)


def test_kernel_known_answer_oscillating_mode():
    layer = make_layer(d_model=1, d_state=2)
    dt, A, C = 0.1, complex(-0.5, math.pi), complex(1.0, 2.0)
    set_one_mode(layer, dt=dt, a_real=A.real, a_imag=A.imag, c=C)
    dtA = dt * A
    expected = [2 * (C * (cmath.exp(dtA) - 1) / A * cmath.exp(dtA * k)).real for k in range(16)]
    torch.testing.assert_close(layer.kernel(16)[0], torch.tensor(expected, dtype=torch.float64),
                               rtol=1e-12, atol=1e-14)


def test_ssm_is_the_causal_convolution_plus_skip():
    layer = make_layer()
    u = torch.randn(2, 20, 6, dtype=torch.float64)
    K = layer.kernel(20)  # [H, L]
    direct = torch.stack([(K[:, :t + 1].flip(-1) * u[:, :t + 1].transpose(1, 2)).sum(-1)
                          for t in range(20)], dim=1)  # [B, L, H]
    torch.testing.assert_close(layer.ssm(u), direct + layer.D * u, rtol=1e-10, atol=1e-12)


def test_output_shapes_and_state_dtypes():
    layer = S4D(5, 6)
    u = torch.randn(4, 9, 5)
    assert layer(u).shape == (4, 9, 5)
    state = layer.initial_state(4)
    assert state.shape == (4, 5, 3) and state.dtype == torch.complex64 and not state.any()
    y, new_state = layer.step(u[:, 0], state)
    assert y.shape == (4, 5) and new_state.shape == (4, 5, 3)
    assert layer.double().initial_state(2).dtype == torch.complex128


def test_causality():
    layer = make_layer()
    u = torch.randn(2, 32, 6, dtype=torch.float64)
    t = 17
    v = u.clone()
    v[:, t] += torch.randn(2, 6, dtype=torch.float64)
    y_u, y_v = layer(u), layer(v)
    torch.testing.assert_close(y_v[:, :t], y_u[:, :t], rtol=0, atol=1e-12)
    assert (y_v[:, t] - y_u[:, t]).abs().max() > 1e-3


@pytest.mark.parametrize("kind", ["none", "sinusoidal", "learnable"])
def test_model_forward_shape_and_gradients_reach_every_parameter(kind):
    torch.manual_seed(0)
    K, T, H = 11, 10, 8
    model = S4DModel(Shapes(K + 1, K, T, T), 6, H, 4, EncodingConfig(kind=kind))
    tokens = torch.randint(K + 1, (3, T))
    features = model(tokens)
    assert features.shape == (3, T, H)
    assert model.cell_inputs(tokens).shape == (3, T, model.encoding.out_features)
    logits = model.head(features[:, T // 2:])  # [B, T/2, K], scored steps only
    torch.nn.functional.cross_entropy(logits.reshape(-1, K),
                                      tokens[:, :T // 2].reshape(-1) % K).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_step_under_vmap_jacrev_matches_autograd():
    """d y_T / d z (z = real view of the state after step 0), as docs/paper-facts.md#s4d-stability
    computes it."""
    layer = make_layer(d_model=3, d_state=4)
    B, T, H, N = 2, 5, 3, 2
    u = torch.randn(B, T, H, dtype=torch.float64)
    _, z = run_steps(layer, u[:, :1])  # state after the first step, [B, H, N] complex

    def last_output(z_real: torch.Tensor, suffix: torch.Tensor) -> torch.Tensor:
        """z_real [H, N, 2], suffix [T-1, H] (one sample) -> y at the last step [H]."""
        state = torch.view_as_complex(z_real)
        for t in range(suffix.shape[0]):
            state = layer.step_state(suffix[t], state)
        return layer.readout(suffix[-1], state)

    z_real = torch.view_as_real(z).contiguous()  # [B, H, N, 2]
    J = vmap(jacrev(last_output))(z_real, u[:, 1:])  # [B, H, H, N, 2]
    assert J.shape == (B, H, H, N, 2)

    for b in range(B):
        x = z_real[b].clone().requires_grad_(True)
        y = last_output(x, u[b, 1:])
        for i in range(H):
            (grad,) = torch.autograd.grad(y[i], x, retain_graph=True)
            torch.testing.assert_close(J[b, i], grad, rtol=1e-10, atol=1e-12)
    assert J.abs().max() > 0

    # `step` itself, batched by vmap over the leading dim, equals the batched call.
    y_vmap, s_vmap = vmap(layer.step)(u[:, 0], z)
    y_batch, s_batch = layer.step(u[:, 0], z)
    torch.testing.assert_close(y_vmap, y_batch)
    torch.testing.assert_close(s_vmap, s_batch)
