"""Predecessor query (Appendix A.3, Fig. 10; docs/paper-facts.md#tasks).

x = L distinct tokens of [0, K) (a random L-permutation, the code's `randperm`), then one
query step that re-reads x_q for a q uniform in 2..L (1-based); the single output, at that
last step, is the predecessor x_{q-1}. No command token: the embedding has K rows.

A row is [L + 1]: x, then the 0-based index of the queried element (1..L-1). The query is
part of the row, so the held-out set fixes its queries from the seed (the code re-drew
them at test time; docs/paper-facts.md#held-out-test-sets) and the exclusion of held-out rows from
training is of (x, query) pairs.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from perencode.config.registry import TaskKind, register_task
from perencode.kinds.tasks.base import Batch, HeldOutConfig, SyntheticTask


class PredecessorTask(SyntheticTask):
    has_command_token = False

    @property
    def steps(self) -> int:
        return self.L + 1

    @property
    def outputs(self) -> int:
        return 1

    def draw(self, n: int, generator: torch.Generator) -> Tensor:
        # The indices of the L largest of K i.i.d. keys are L distinct tokens in uniformly
        # random order: the first L of a random permutation, without a per-row randperm.
        # float64 keys make ties (which would bias the order) practically impossible.
        keys = torch.rand((n, self.K), generator=generator, device=generator.device,
                          dtype=torch.float64)  # [n, K]
        x = keys.topk(self.L, dim=1).indices  # [n, L]
        query = torch.randint(1, self.L, (n, 1), generator=generator,
                              device=generator.device)  # [n, 1], 0-based index
        return torch.cat([x, query], dim=1)  # [n, L + 1]

    def every_row(self) -> Tensor:
        """Every L-permutation of [0, K) with every query 1..L-1 [K!/(K-L)! (L-1), L + 1]."""
        x = torch.tensor(list(itertools.permutations(range(self.K), self.L)))  # [P, L]
        query = torch.arange(1, self.L).repeat(len(x))[:, None]  # [P (L-1), 1]
        return torch.cat([x.repeat_interleave(self.L - 1, 0), query], 1)

    def build(self, rows: Tensor) -> Batch:
        x, query = rows[:, :self.L], rows[:, self.L]  # [B, L], [B]
        inputs = torch.cat([x, x.gather(1, query[:, None])], dim=1)  # [B, L + 1]
        targets = x.gather(1, (query - 1)[:, None]).squeeze(1)  # [B]
        return Batch(sequences=x, inputs=inputs, targets=targets,
                     output_targets=targets[:, None], queries=query)

    def score(self, batches: list[Batch], predictions: list[Tensor]) -> dict:
        """Accuracy of the single output (`token_accuracy` is the same number)."""
        hits = torch.cat([(p == b.output_targets).squeeze(1).cpu()
                          for b, p in zip(batches, predictions)])
        accuracy = float(hits.double().mean())
        return {"accuracy": accuracy, "token_accuracy": accuracy, "n_sequences": len(hits)}


class PredecessorConfig(HeldOutConfig):
    def distinct_sequences(self) -> int:
        """Held-out rows are (sequence, query) pairs: K!/(K-L)! sequences x L-1 queries."""
        return math.perm(self.vocab_size, self.length) * (self.length - 1)

    def check(self) -> None:
        if self.vocab_size < self.length:
            raise ValueError(f"field 'vocab_size': predecessor query needs K >= L distinct "
                             f"tokens (K = {self.vocab_size}, L = {self.length})")
        if self.length < 2:
            raise ValueError("field 'length': predecessor query needs L >= 2")


register_task(TaskKind("predecessor", PredecessorTask, label="Predecessor query",
                       summary="predecessor query (Fig. 10)", config=PredecessorConfig))
