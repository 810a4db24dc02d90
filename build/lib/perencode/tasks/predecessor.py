"""Predecessor query (Appendix A.3, Fig. 10; SPEC §4).

x = L distinct tokens of [0, K) (a random L-permutation, the code's `randperm`), then one
query step that re-reads x_q for a q uniform in 2..L (1-based); the single output, at that
last step, is the predecessor x_{q-1}. No command token: the embedding has K rows.

A row is [L + 1]: x, then the 0-based index of the queried element (1..L-1). The query is
part of the row, so the held-out set fixes its queries from the seed (the code re-drew
them at test time; SPEC §3) and the exclusion of held-out rows from training is of
(x, query) pairs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from perencode.tasks.base import Batch, SyntheticTask


class PredecessorTask(SyntheticTask):
    name = "predecessor"
    has_command_token = False

    @property
    def max_steps(self) -> int:
        return self.L + 1

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
