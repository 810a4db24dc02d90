"""Sequence metrics (docs/paper-facts.md#metrics): Damerau-Levenshtein distance and the held-out
scores of the sequence tasks (token accuracy, sequence accuracy, mean DL distance)."""

from __future__ import annotations

import numpy as np
import torch
from rapidfuzz.distance import DamerauLevenshtein
from torch import Tensor


def dl_distance(prediction, target) -> int:
    """Unrestricted Damerau-Levenshtein distance between two token sequences."""
    return DamerauLevenshtein.distance(prediction, target)


def dl_distances(predictions: np.ndarray, targets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Row-wise DL distance of [N, T] arrays, each row cut to its own length."""
    return np.array([
        dl_distance(p[:n].tolist(), t[:n].tolist())
        for p, t, n in zip(predictions, targets, lengths)
    ], dtype=np.int64)


def row_scores(batches: list, predictions: list[Tensor]) -> dict[str, Tensor]:
    """Per held-out row (CPU tensors [N]) of task Batches and their argmax predictions
    [B, T_out]: correct and scored outputs, exact match, DL distance."""
    correct, tokens, exact, dl = [], [], [], []
    for batch, pred in zip(batches, predictions):
        target = batch.output_targets
        mask = batch.output_mask if batch.output_mask is not None else torch.ones_like(
            target, dtype=torch.bool)
        hits = (pred == target) & mask
        correct.append(hits.sum(1).cpu())
        tokens.append(mask.sum(1).cpu())
        exact.append((hits | ~mask).all(dim=1).cpu())
        # The mask of a row is a prefix of its outputs, so its sum is the row's length.
        dl.append(torch.from_numpy(dl_distances(pred.cpu().numpy(), target.cpu().numpy(),
                                                tokens[-1].numpy())))
    return {"correct": torch.cat(correct), "tokens": torch.cat(tokens),
            "exact": torch.cat(exact), "dl": torch.cat(dl)}


def summarise(rows: dict[str, Tensor], select: Tensor | None = None) -> dict:
    """Token accuracy, sequence accuracy and mean Damerau-Levenshtein distance
    (docs/paper-facts.md#metrics) of the rows of `row_scores` (all, or those where `select` [N] is
    True)."""
    if select is not None:
        rows = {k: v[select] for k, v in rows.items()}
    n, tokens = len(rows["exact"]), int(rows["tokens"].sum())
    return {
        "token_accuracy": int(rows["correct"].sum()) / max(tokens, 1),
        "sequence_accuracy": int(rows["exact"].sum()) / max(n, 1),
        "dl_distance": float(rows["dl"].double().sum()) / max(n, 1),
        "n_sequences": n,
        "n_tokens": tokens,
    }


def sequence_scores(batches: list, predictions: list[Tensor]) -> dict:
    """eval.json metrics of a sequence-output task over its whole held-out set."""
    return summarise(row_scores(batches, predictions))
