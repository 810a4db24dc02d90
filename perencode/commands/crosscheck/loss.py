"""The loss on its chunked path: perencode.training.session.loss_fn with a forced small
`chunk_logits` (the head and the cross-entropy a few rows at a time, recomputed in the backward
pass: the path a large vocabulary takes, WikiText-103's 32,767 classes) against the authors' loss on
the same weights and batch.

Their reverse script takes the mean cross-entropy over every output; their variable-length
script sums it over the real outputs and divides by their number. Loss, correct predictions
and every parameter's gradient are compared, chunked and unchunked. Their gradient is read
after their `train_per_iteration` (which clips at 1.0 and steps Adam at iteration 1, whose
learning rate is the warm-up's 0): at the package's initialisation the norm stays below the
clip, and the row says so.
"""

from __future__ import annotations

import math

import torch

from perencode.commands.crosscheck.authors import Authors
from perencode.commands.crosscheck.loop import SCRIPTS, recipe
from perencode.commands.crosscheck.models import DTYPES, K, their_learner, their_name
from perencode.commands.crosscheck.models import pair as model_pair
from perencode.commands.crosscheck.report import Comparison, numeric
from perencode.training import session

# Rows per chunk: 3 does not divide the batch's outputs, so the last, shorter chunk counts.
ROWS = 3
CASES = (("lstm", "reverse"), ("lstm", "variable_length"))


def _theirs(authors: Authors, arch: str, task_name: str, model, rows) -> tuple[float, float,
                                                                               dict, float]:
    """(their loss, their correct predictions, {their name: gradient}, their clip's norm)."""
    learner, _, _ = their_learner(authors, arch, model, 10, 2, 1e-3, SCRIPTS[task_name])
    out = learner.train_per_iteration(rows, {}, 1)
    tokens = out.get("total_tokens")
    if tokens is None:  # the reverse script: mean loss and mean accuracy over B x L
        n = sum(r.numel() for r in rows)
        loss, hits = out["loss"], out["accuracy"] * n
    else:
        loss, hits = out["loss"] / tokens, out["accuracy"]
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()])))
    return loss, hits, grads, norm


def compare(authors: Authors, arch: str, task_name: str) -> Comparison:
    rec = recipe(arch, task_name)
    errors, parts, norm = {}, {}, 0.0
    for name, dtype in DTYPES.items():
        training = session.Session(rec, torch.device("cpu"))
        batch = training.batch()
        rows = ([r[r >= 0] for r in batch.sequences] if task_name == "variable_length"
                else batch.sequences)
        mine, other = model_pair(authors, arch, "none", seed=5)
        mine, other = mine.to(dtype).train(), other.to(dtype).train()
        loss_t, hits_t, grads_t, norm = _theirs(authors, arch, task_name, other, rows)
        worst = 0.0
        outputs = int(batch.output_mask.sum()) if batch.output_mask is not None else \
            batch.output_targets.numel()
        for chunk in (session.CHUNK_LOGITS, ROWS * K):
            mine.zero_grad(set_to_none=True)
            loss, hits = session.loss_fn(mine, batch, count_hits=True, chunk_logits=chunk)
            loss.backward()
            grads = {their_name(n): p.grad for n, p in mine.named_parameters()
                     if p.grad is not None}
            grad_err = max(float((grads[n] - g).abs().max()) for n, g in grads_t.items()) \
                if set(grads) == set(grads_t) else math.inf
            worst = max(worst, abs(float(loss.detach()) - loss_t), abs(float(hits or 0) - hits_t),
                        grad_err)
        errors[name] = worst if norm < 1.0 else math.inf
        parts[name] = f"{outputs} scored outputs in chunks of {ROWS}"
    clipped = "" if norm < 1.0 else (f"their gradient norm {norm:.2f} exceeds their clip of "
                                     "1: their gradients are clipped, not comparable")
    return numeric(
        f"chunked loss: {arch} {task_name}", f"loss, correct predictions and every gradient "
        f"of perencode.training.session.loss_fn, unchunked and with chunk_logits = {ROWS} rows x K "
        f"({parts['fp32']}; K={K}); gradient norm {norm:.2f} (< clip 1)",
        f"{SCRIPTS[task_name][:-3]}.Learner.train_per_iteration (its loss "
        + ("mean over the outputs)" if task_name == "reverse" else
           "summed over the real outputs / their number)"),
        {"fp32": 1e-5, "fp64": 1e-12}, errors, reason=clipped,
        unit="max of |loss difference|, |correct predictions difference|, max |gradient "
        "difference|")


def check_chunked_loss(authors: Authors) -> list[Comparison]:
    return [compare(authors, arch, task) for arch, task in CASES]
