"""GRU/LSTM sequence model (docs/paper-facts.md#common-model): embedding (row K = learnable command
token) -> positional encoding -> single-layer nn.GRU/nn.LSTM (cuDNN on GPU) -> Linear head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import jacrev, vmap

from perencode.config.recipe import EncodingConfig, ModelConfig
from perencode.config.registry import ModelKind, register_model
from perencode.kinds.models.base import SequenceModel
from perencode.kinds.shapes import Shapes

# PyTorch's cell of each recurrent arch (also the cell of bench's bare reference loop).
CELLS = {"gru": nn.GRU, "lstm": nn.LSTM}


class RecurrentModel(SequenceModel):
    def __init__(self, arch: str, shapes: Shapes, embed_size: int, hidden_size: int,
                 encoding: EncodingConfig):
        super().__init__(shapes, embed_size, encoding)
        self.arch = arch
        self.rnn = CELLS[arch](self.in_features, hidden_size, batch_first=True)
        self.head = nn.Linear(hidden_size, shapes.num_classes)

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] -> hidden states [B, T, H] (apply `self.head` for logits)."""
        out, _ = self.rnn(self.cell_inputs(tokens))  # [B, T, H]
        return out

    # -- step mode: the same cell one step at a time, from an explicit state -----------------
    # The state is h [..., H] for the GRU and [h; c] [..., 2H] for the LSTM (as the authors'
    # JacobianAnalyzer concatenated them). Pure functions of their arguments and the weights,
    # so torch.func can differentiate a later output with respect to an earlier state.

    def initial_state(self, batch: int) -> Tensor:
        """Zero state [batch, H] (GRU) or [batch, 2H] (LSTM)."""
        width = self.rnn.hidden_size * (2 if self.arch == "lstm" else 1)
        return self.rnn.weight_hh_l0.new_zeros(batch, width)

    def step(self, x_t: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """One nn.GRU/nn.LSTM step: (x_t [..., D_in], state) -> (h_t [..., H], new state)."""
        r = self.rnn
        gates_x = F.linear(x_t, r.weight_ih_l0, r.bias_ih_l0)
        if self.arch == "gru":  # gate order r, z, n
            gates_h = F.linear(state, r.weight_hh_l0, r.bias_hh_l0)
            i_r, i_z, i_n = gates_x.chunk(3, dim=-1)
            h_r, h_z, h_n = gates_h.chunk(3, dim=-1)
            reset, update = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
            h = (1 - update) * torch.tanh(i_n + reset * h_n) + update * state
            return h, h
        h, c = state.chunk(2, dim=-1)  # gate order i, f, g, o
        i, f, g, o = (gates_x + F.linear(h, r.weight_hh_l0, r.bias_hh_l0)).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, torch.cat([h, c], dim=-1)


@torch.no_grad()  # torch.func transforms still differentiate; no graph on the parameters
def rnn_jacobians(model: RecurrentModel, tokens: Tensor, target_step: int = 0,
                  chunk_size: int = 128) -> tuple[Tensor, Tensor]:
    """tokens [B, T] -> (J [B, H, D_z], h_T [B, H]), J = d h_T / d z.

    z is the state right after the (0-based) `target_step` (`RecurrentModel.step`'s state:
    h for the GRU, D_z = H; [h; c] for the LSTM, D_z = 2H).
    """
    x = model.cell_inputs(tokens)  # [B, T, D_in]
    z = model.initial_state(x.shape[0])  # [B, D_z]
    for t in range(target_step + 1):
        _, z = model.step(x[:, t], z)

    def last_hidden(suffix: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """One sequence: suffix [T', D_in], state [D_z] -> h_T [H] (twice: J and aux)."""
        for x_t in suffix.unbind(0):
            h, state = model.step(x_t, state)
        return h, h

    jac = jacrev(last_hidden, argnums=1, has_aux=True, chunk_size=chunk_size)
    return vmap(jac)(x[:, target_step + 1:], z)


def build(cfg: ModelConfig, encoding: EncodingConfig, shapes: Shapes) -> RecurrentModel:
    """The model of a recipe's [model] and [encoding] tables, sized by the task."""
    return RecurrentModel(cfg.arch, shapes, cfg.embed_size, cfg.hidden_size, encoding)


def flops_per_step(cfg: ModelConfig, inputs: int, steps: int) -> float:
    """Multiply-adds per sample and step: each gate maps the input and the state."""
    H = cfg.hidden_size
    return GATES[cfg.arch] * (inputs * H + H * H)


GATES = {"gru": 3, "lstm": 4}
# saved_per_step (perencode.training.planning): a GRU keeps its input and hidden gate
# pre-activations (3H + 3H), the reset and update gates and the output; an LSTM its four
# gates from input and state, their activations, the cell state and its tanh.
register_model(ModelKind("gru", build, label="GRU", summary="single-layer nn.GRU",
                         flops_per_step=flops_per_step, jacobians=rnn_jacobians,
                         saved_per_step=10, tf32="cudnn"))
register_model(ModelKind("lstm", build, label="LSTM", summary="single-layer nn.LSTM",
                         flops_per_step=flops_per_step, jacobians=rnn_jacobians,
                         saved_per_step=15, tf32="cudnn"))
