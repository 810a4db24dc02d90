"""minGRU (Feng et al. 2024, "Were RNNs All We Needed?"), written from the paper's equations.

The GRU without its reset gate, and with gates that read the input only:

    z_t  = sigmoid(k_t),  k_t = W_z x_t + b_z     update gate              [B, H]
    h~_t = W_h x_t + b_h                          candidate state          [B, H]
    h_t  = (1 - z_t) * h_{t-1} + z_t * h~_t       h_0 = 0

Neither z_t nor h~_t depends on h_{t-1}, so h_t = a_t h_{t-1} + b_t (a_t = 1 - z_t,
b_t = z_t h~_t) is a linear recurrence whose coefficients are known for every step at once:
training computes all T states by a scan instead of T dependent steps. With h_0 = 0,

    h_t = sum_{s<=t} (prod_{s<r<=t} a_r) b_s = exp(A_t) * sum_{s<=t} exp(-A_s) b_s,
    A_t = sum_{r<=t} log a_r.

A product of many gates in (0, 1) underflows; the paper computes the scan in log space,

    log h_t = A_t + logcumsumexp_{s<=t}(log b_s - A_s),

which needs b_t > 0: the candidate goes through g(x) = x + 0.5 for x >= 0 and sigmoid(x)
for x < 0 (positive, continuous, increasing), and log z_t = -softplus(-k_t),
log(1 - z_t) = -softplus(k_t) are taken from k_t without forming z_t. The sequential form
(`MinGRU.step`, the stability analysis's step mode) applies the same g, so both give the
same h_t; `log_space = false` keeps the candidate as it is and runs the recurrence step by
step (the equations as first written, without the scan).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn
from torch.func import jacrev, vmap

from perencode.api import EncodingConfig, ModelConfig, SequenceModel, Shapes


class MinGRUConfig(ModelConfig):
    """The [model] table of `arch = "mingru"`: the common sizes and how the layer runs."""

    log_space: bool = Field(
        True, description="Train with the paper's log-space parallel scan, the candidate "
        "made positive by g(x) = x + 0.5 (x >= 0) else sigmoid(x); false: the candidate as "
        "it is and the recurrence run step by step (slower, no g).")


def g(x: Tensor) -> Tensor:
    """x + 0.5 for x >= 0, sigmoid(x) below: a positive candidate state."""
    return torch.where(x >= 0, x + 0.5, torch.sigmoid(x))


def log_g(x: Tensor) -> Tensor:
    """log g(x) without forming g where it is tiny (log sigmoid(x) = -softplus(-x)); the
    clamp keeps the unused branch of `where` finite, so its gradient is too."""
    return torch.where(x >= 0, torch.log(x.clamp(min=0) + 0.5), -F.softplus(-x))


def scan_log(log_a: Tensor, log_b: Tensor) -> Tensor:
    """log h of h_t = a_t h_{t-1} + b_t, h_0 = 0, along dim 1 ([B, T, H] -> [B, T, H]),
    from the logs of a_t > 0 and b_t > 0: A_t + logcumsumexp(log b - A)."""
    a_star = torch.cumsum(log_a, dim=1)  # A_t, [B, T, H]
    return a_star + torch.logcumsumexp(log_b - a_star, dim=1)


class MinGRU(nn.Module):
    """One minGRU layer, x [B, T, D] -> h [B, T, H]; `step` is the same layer one step at a
    time (any leading dims), from an explicit state."""

    def __init__(self, inputs: int, hidden: int, log_space: bool = True):
        super().__init__()
        self.hidden_size, self.log_space = hidden, log_space
        self.gates = nn.Linear(inputs, 2 * hidden)  # k (the update gate's input) and h~

    def _parts(self, x: Tensor) -> tuple[Tensor, Tensor]:
        k, candidate = self.gates(x).chunk(2, dim=-1)  # [..., H] each
        return k, candidate

    def forward(self, x: Tensor) -> Tensor:
        if not self.log_space:
            h = x.new_zeros(x.shape[0], self.hidden_size)
            out = []
            for x_t in x.unbind(1):
                h = self.step(x_t, h)
                out.append(h)
            return torch.stack(out, dim=1)  # [B, T, H]
        k, candidate = self._parts(x)  # [B, T, H]
        log_a = -F.softplus(k)                       # log(1 - z_t)
        log_b = -F.softplus(-k) + log_g(candidate)   # log z_t + log g(h~_t)
        return torch.exp(scan_log(log_a, log_b))

    def step(self, x_t: Tensor, h: Tensor) -> Tensor:
        """h_t = (1 - z_t) h_{t-1} + z_t g(h~_t) (no g with log_space = false)."""
        k, candidate = self._parts(x_t)
        z = torch.sigmoid(k)
        return (1 - z) * h + z * (g(candidate) if self.log_space else candidate)


class MinGRUModel(SequenceModel):
    """The shared front end (embedding + encoding) -> one minGRU layer -> head."""

    arch = "mingru"

    def __init__(self, cfg: MinGRUConfig, encoding: EncodingConfig, shapes: Shapes):
        super().__init__(shapes, cfg.embed_size, encoding)
        self.rnn = MinGRU(self.in_features, cfg.hidden_size, cfg.log_space)
        self.head = nn.Linear(cfg.hidden_size, shapes.num_classes)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.rnn(self.cell_inputs(tokens))  # [B, T, H]

    # Step mode, as the package's RNNs have it (perencode stability): the state is h.
    def initial_state(self, batch: int) -> Tensor:
        return self.head.weight.new_zeros(batch, self.rnn.hidden_size)

    def step(self, x_t: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        h = self.rnn.step(x_t, state)
        return h, h


def build(cfg: MinGRUConfig, encoding: EncodingConfig, shapes: Shapes) -> MinGRUModel:
    return MinGRUModel(cfg, encoding, shapes)


def flops_per_step(cfg: MinGRUConfig, inputs: int, steps: int) -> float:
    """Multiply-adds per sample and step: the gate and the candidate read the input only
    (2 D H, no H x H term: the recurrence is elementwise), plus the scan's few per unit."""
    H = cfg.hidden_size
    return 2 * inputs * H + 6 * H


@torch.no_grad()  # torch.func transforms still differentiate
def jacobians(model: MinGRUModel, tokens: Tensor, target_step: int = 0,
              chunk_size: int = 128) -> tuple[Tensor, Tensor]:
    """tokens [B, T] -> (J [B, H, H], h_T [B, H]), J = d h_T / d h at the state right after
    the (0-based) `target_step`: the gradient-stability hook of `perencode stability`."""
    x = model.cell_inputs(tokens)  # [B, T, D]
    h = model.initial_state(x.shape[0])
    for t in range(target_step + 1):
        h, _ = model.step(x[:, t], h)

    def last(suffix: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        for x_t in suffix.unbind(0):
            state, _ = model.step(x_t, state)
        return state, state

    return vmap(jacrev(last, argnums=1, has_aux=True, chunk_size=chunk_size))(
        x[:, target_step + 1:], h)
