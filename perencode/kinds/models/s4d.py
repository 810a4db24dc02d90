"""S4D sequence model (docs/paper-facts.md#s4d-model): embedding (+ encoding) -> Linear -> one S4D
block -> head.

The S4D block (Gu et al., 2022a, "S4D-Lin", ZOH) runs in convolution mode for training and
step by step from an explicit complex state for the gradient-stability analysis
(docs/paper-facts.md#s4d-stability). Per channel h there are N/2 complex modes n; their
conjugate partners are implicit in the factor 2*Re(.) of the readout, so a state is a complex
tensor [..., H, N/2].
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from pydantic import Field, model_validator
from torch import Tensor, nn
from torch.func import jacrev, vmap

from perencode.config.recipe import EncodingConfig, ModelConfig
from perencode.config.registry import ModelKind, register_model
from perencode.kinds.models.base import SequenceModel
from perencode.kinds.shapes import Shapes


class S4D(nn.Module):
    """One S4D block, [B, L, H] -> [B, L, H]:
    y = GLU(Linear_{H -> 2H}(GELU(SSM(u) + D*u))), no residual and no norm (as the authors).

    Step mode (same output as `forward`, one time step at a time, any leading dims):
        state_t = step_state(u_t, state_{t-1})   # h_t = dA*h_{t-1} + dB*u_t
        y_t     = readout(u_t, state_t)          # GLU(W GELU(2 Re(sum_n C_n h_t,n) + D u_t))
    `step` does both. They are pure functions of their arguments (and the parameters), so
    torch.func.vmap / jacrev can differentiate y w.r.t. the state (via torch.view_as_real).
    """

    def __init__(self, d_model: int, d_state: int = 64, dt_min: float = 1e-3,
                 dt_max: float = 1e-1):
        super().__init__()
        H, N = d_model, d_state // 2  # N complex conjugate-pair modes per channel
        self.D = nn.Parameter(torch.randn(H))  # skip connection, N(0, 1)
        # log dt ~ U[log dt_min, log dt_max] per channel.
        self.log_dt = nn.Parameter(
            torch.rand(H) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        # Complex normal: real and imaginary parts each N(0, 1/2). Stored as real [H, N, 2]
        # so optimizers and state_dicts see only real tensors.
        self.C = nn.Parameter(torch.view_as_real(torch.randn(H, N, dtype=torch.cfloat)))
        # S4D-Lin: A_n = -1/2 + i*pi*n.
        self.log_A_real = nn.Parameter(torch.full((H, N), math.log(0.5)))
        self.A_imag = nn.Parameter(math.pi * torch.arange(N, dtype=torch.float).repeat(H, 1))
        # The authors' 1x1 Conv1d(H, 2H); nn.Linear on the last dim is the same map and init.
        self.out_proj = nn.Linear(H, 2 * H)

    def _discretize(self) -> tuple[Tensor, Tensor]:
        """ZOH with B = 1: returns dtA [H, N] and dB = (exp(dtA) - 1) / A [H, N] (complex)."""
        A = -self.log_A_real.exp() + 1j * self.A_imag  # [H, N]
        dtA = self.log_dt.exp()[:, None] * A  # [H, N]
        return dtA, (dtA.exp() - 1) / A

    def kernel(self, L: int) -> Tensor:
        """K[h, l] = 2 Re(sum_n C_n (exp(dtA_n) - 1)/A_n exp(dtA_n l)), l = 0..L-1 -> [H, L]."""
        dtA, dB = self._discretize()
        steps = torch.arange(L, dtype=self.log_dt.dtype, device=self.log_dt.device)  # [L]
        vandermonde = torch.exp(dtA[:, :, None] * steps)  # [H, N, L]
        CB = torch.view_as_complex(self.C) * dB  # [H, N]
        return 2 * torch.einsum("hn,hnl->hl", CB, vandermonde).real  # [H, L]

    def ssm(self, u: Tensor) -> Tensor:
        """Linear SSM from a zero state: causal conv with the kernel plus D*u. [B, L, H]."""
        L = u.shape[1]
        u = u.transpose(1, 2)  # [B, H, L]
        # FFT length 2L: the circular convolution then equals the causal linear one on 0..L-1.
        k_f = torch.fft.rfft(self.kernel(L), n=2 * L)  # [H, L+1]
        u_f = torch.fft.rfft(u, n=2 * L)  # [B, H, L+1]
        y = torch.fft.irfft(u_f * k_f, n=2 * L)[..., :L]  # [B, H, L]
        return (y + self.D[:, None] * u).transpose(1, 2)  # [B, L, H]

    def mix(self, y: Tensor) -> Tensor:
        """Position-wise part: GELU, (dropout 0 omitted), Linear H -> 2H, GLU. [..., H]."""
        return F.glu(self.out_proj(F.gelu(y)), dim=-1)  # [..., H]

    def forward(self, u: Tensor) -> Tensor:
        """u [B, L, H] -> block output [B, L, H] (convolution mode)."""
        return self.mix(self.ssm(u))

    def initial_state(self, batch: int) -> Tensor:
        """Zero state [batch, H, N], complex64 for float32 parameters, complex128 for float64."""
        C = torch.view_as_complex(self.C)
        return torch.zeros(batch, *C.shape, dtype=C.dtype, device=C.device)

    def step_state(self, u_t: Tensor, state: Tensor) -> Tensor:
        """h_t = exp(dtA) h_{t-1} + dB u_t. u_t [..., H], state [..., H, N] -> [..., H, N]."""
        dtA, dB = self._discretize()
        return dtA.exp() * state + dB * u_t[..., None]

    def readout(self, u_t: Tensor, state: Tensor) -> Tensor:
        """Block output y_t from u_t [..., H] and the state *after* step t [..., H, N]."""
        C = torch.view_as_complex(self.C)  # [H, N]
        y = 2 * (C * state).sum(-1).real + self.D * u_t  # [..., H]
        return self.mix(y)

    def step(self, u_t: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """One recurrent step: (u_t [..., H], state [..., H, N]) -> (y_t [..., H], new state)."""
        state = self.step_state(u_t, state)
        return self.readout(u_t, state), state


class S4DModel(SequenceModel):
    """Tokens [B, T] -> S4D features [B, T, H]; `head` (Linear H -> K) gives the logits.
    The S4D block's input is `in_proj(cell_inputs(.))`."""

    arch = "s4d"

    def __init__(self, shapes: Shapes, embed_size: int, hidden_size: int, d_state: int,
                 encoding: EncodingConfig):
        super().__init__(shapes, embed_size, encoding)
        self.in_proj = nn.Linear(self.in_features, hidden_size)
        self.s4d = S4D(hidden_size, d_state)
        self.head = nn.Linear(hidden_size, shapes.num_classes)

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] -> S4D block outputs [B, T, H] (apply `self.head` for logits)."""
        return self.s4d(self.in_proj(self.cell_inputs(tokens)))  # [B, T, H]


@torch.no_grad()  # torch.func transforms still differentiate; no graph on the parameters
def s4d_jacobians(model, tokens: Tensor, target_step: int,
                  chunk_size: int = 128) -> tuple[Tensor, Tensor]:
    """tokens [B, T] -> (J [B, H, 2HN], y_T [B, H]), J = d y_T / d z for an S4DModel.

    z = the complex state right after `target_step` (0-based), [H, N] complex, as a real
    vector in `view_as_real` layout (re/im interleaved per mode; docs/paper-facts.md#s4d-stability).
    y_T = the S4D block's output at the last step (after GELU and Linear + GLU, before the head).
    """
    layer = model.s4d
    u = model.in_proj(model.cell_inputs(tokens))  # [B, T, H]
    B, T, H = u.shape
    z = layer.initial_state(B)  # [B, H, N] complex
    for t in range(target_step + 1):
        z = layer.step_state(u[:, t], z)
    # After the target the state is linear in z: state_T = dA^k z + w, with w the state the
    # later inputs reach from zero and dA^k = k zero-input steps from an all-ones state.
    # This equals stepping from z (the authors' `AL * state + v`) but differentiates
    # one product instead of k steps.
    w = layer.initial_state(B)
    decay = torch.ones_like(w[0])  # [H, N]
    no_input = u.new_zeros(H)
    for t in range(target_step + 1, T):
        w = layer.step_state(u[:, t], w)
        decay = layer.step_state(no_input, decay)
    z_real = torch.view_as_real(z).flatten(1)  # [B, H*N*2]

    def last_output(u_T: Tensor, w_real: Tensor, z_real: Tensor) -> tuple[Tensor, Tensor]:
        """One sequence: u_T [H], w_real [H, N, 2], z_real [2HN] -> y_T [H] (twice)."""
        z = torch.view_as_complex(z_real.view(*decay.shape, 2))  # [H, N]
        y = layer.readout(u_T, decay * z + torch.view_as_complex(w_real))
        return y, y

    # jacrev takes real inputs only (even those it does not differentiate): w goes real too.
    jac = jacrev(last_output, argnums=2, has_aux=True, chunk_size=chunk_size)
    return vmap(jac)(u[:, -1], torch.view_as_real(w), z_real)


def build(cfg: S4DConfig, encoding: EncodingConfig, shapes: Shapes) -> S4DModel:
    """The S4D model of a recipe's [model] and [encoding] tables, sized by the task."""
    return S4DModel(shapes, cfg.embed_size, cfg.hidden_size, cfg.d_state, encoding)


class S4DConfig(ModelConfig):
    """[model] of s4d: the state size beside the common sizes."""

    d_state: int = Field(
        64, ge=2, le=4096,
        description="S4D state size N (N/2 complex conjugate-pair modes per channel).",
    )

    @model_validator(mode="after")
    def _even_state(self) -> S4DConfig:
        if self.d_state % 2:
            raise ValueError(f"field 'd_state': must be even, got {self.d_state}")
        return self


def flops_per_step(cfg: S4DConfig, inputs: int, steps: int) -> float:
    """Multiply-adds per sample and step: the input map, the kernel (H x N), the FFT
    convolution over 2T points and the output GLU map."""
    H = cfg.hidden_size
    return inputs * H + H * cfg.d_state + 2 * H * H + 5 * H * math.log2(2 * steps)


register_model(ModelKind(
    "s4d", build, label="S4D", summary="one S4D layer (state size model.d_state)",
    config=S4DConfig, flops_per_step=flops_per_step, jacobians=s4d_jacobians,
    # Stability pairs share 22 steps before the target at t = 23 (Fig. 5 caption;
    # docs/paper-facts.md#s4d-stability).
    stability_prefix=22,
    # Kept for backward (perencode.training.planning): in_proj's output, the FFT spectra and
    # products, the 2L-long inverse, the GELU input and output, out_proj's 2H output and
    # the GLU's output.
    saved_per_step=13,
    # Doctor's checks: N = 16 keeps its kernel small beside their widths of 16 to 128.
    tiny={"d_state": 16}))
