"""GRU/LSTM sequence model (SPEC §1): embedding (row K = learnable command token) ->
positional encoding -> single-layer nn.GRU/nn.LSTM (cuDNN on GPU) -> Linear head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from perencode.encoding import PositionalEncoding
from perencode.recipe import EncodingConfig


class RecurrentModel(nn.Module):
    def __init__(self, arch: str, num_embeddings: int, num_classes: int, embed_size: int,
                 hidden_size: int, encoding: EncodingConfig, max_positions: int,
                 padding_idx: int | None = None):
        super().__init__()
        self.arch = arch
        # padding_idx: a zero row that is never trained (the authors' LM embedding, SPEC §7).
        self.embedding = nn.Embedding(num_embeddings, embed_size, padding_idx=padding_idx)
        self.encoding = PositionalEncoding(encoding, embed_size, max_positions)
        cell = {"gru": nn.GRU, "lstm": nn.LSTM}[arch]
        self.rnn = cell(self.encoding.out_features, hidden_size, batch_first=True)
        self.head = nn.Linear(hidden_size, num_classes)

    def cell_inputs(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] -> recurrent-cell inputs [B, T, D_in] (embedding + encoding)."""
        return self.encoding(self.embedding(tokens))

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
