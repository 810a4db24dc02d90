"""GRU/LSTM sequence model (SPEC §1): embedding (row K = learnable command token) ->
positional encoding -> single-layer nn.GRU/nn.LSTM (cuDNN on GPU) -> Linear head."""

from __future__ import annotations

from torch import Tensor, nn

from perencode.encoding import PositionalEncoding
from perencode.recipe import EncodingConfig


class RecurrentModel(nn.Module):
    def __init__(self, arch: str, num_embeddings: int, num_classes: int, embed_size: int,
                 hidden_size: int, encoding: EncodingConfig, max_positions: int):
        super().__init__()
        self.arch = arch
        self.embedding = nn.Embedding(num_embeddings, embed_size)
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
