"""The training loop end to end: the iterations `perencode train` runs
(perencode.training.session.Session.step: the schedule applied to the optimizer, the batch drawn
from the task's training stream, the masked loss, clipping and Adam) against the authors' loop
(their `Learner.train`, reseeding every iteration, calling their `train_per_iteration`,
which clips and steps their timm scheduler), from the same initial weights on the same
batches.

Learning rates, losses and parameters are compared after every step, across the warm-up
and past it. The initial weights are scaled up (both sides get the same scaled weights) so
that the gradient norm exceeds the clip on some steps: at the package's initialisation it
stays below 1, and a loop that clips by value, or by the largest element, would agree.
"""

from __future__ import annotations

import copy
import tempfile

import torch
from torch import Tensor

from perencode.commands.crosscheck.authors import Authors
from perencode.commands.crosscheck.models import (
    BATCH,
    D_STATE,
    DTYPES,
    E,
    H,
    K,
    L,
    their_learner,
    their_state_dict,
)
from perencode.commands.crosscheck.models import theirs as their_model
from perencode.commands.crosscheck.report import Comparison, numeric
from perencode.commands.crosscheck.tasks import Log
from perencode.config.recipe import Recipe
from perencode.kinds.models import SequenceModel
from perencode.training import session

# (architecture, task): the variable-length reverse task has padded outputs the loss must
# not count (their script sums the loss over the real outputs only).
CASES = (("gru", "reverse"), ("lstm", "reverse"), ("lstm", "variable_length"),
         ("s4d", "reverse"))
SCRIPTS = {"reverse": "train_palindrome.py",
           "variable_length": "train_palindrome_variable-length.py"}
MIN_LENGTH = 4
# Long enough to cover the warm-up and twice as much past it; logging every LOG_EVERY
# steps, so that a schedule set only on the logging steps is seen.
ITERATIONS, WARMUP, LOG_EVERY = 30, 10, 7
# Initial weights times this on both sides, per architecture: gradient norms of about 0.5-2,
# above the clip of 1 on some steps and below it on others.
SCALE = {"gru": 2.0, "lstm": 8.0, "s4d": 2.0}
# What is scaled: every weight of the RNNs; of the S4D only its linear layers (its kernel's
# log-step, poles and C set the dynamics, which a scale would push out of their range).
SCALED = {"s4d": ("in_proj.", "s4d.out_proj.", "head.")}
# A peak learning rate that moves the scaled model far enough for clipping to matter on
# later steps too (the package's default is 1e-3).
LR = 1e-2
# The S4D's sides sum in different orders (their FFT convolution is not ours), so its fp32
# tolerance grows with fp32's own drift on this machine: our fp32 run's largest distance
# from our fp64 run (the rounding 30 steps compound, which depends on the threads: the two
# sides 4e-5 apart on one thread, 1.6e-4 on two, our drift 1.8e-4 there). Two fp32 runs
# each that far from exact are at most twice that apart; DRIFT leaves room for theirs
# drifting more than ours. The RNNs' sides run the same kernels in the same order, so
# their fp32 tolerance stays 1e-5 (their drift from fp64 is no measure of that: Adam turns
# the rounding of gradients near 0 into steps of the learning rate's size, 1e-2 for the
# LSTM). fp64 (1e-12) is the check that shows a learning rate or a clip applied otherwise.
DRIFT = 4.0


def script(arch: str, task: str) -> str:
    """Their training script for the architecture and task."""
    return "train_palindrome_ssm.py" if arch == "s4d" else SCRIPTS[task]


def recipe(arch: str, task: str = "reverse") -> Recipe:
    """The run the loop check trains: the package's defaults at the check's small sizes."""
    lengths = {"min_length": MIN_LENGTH} if task == "variable_length" else {}
    return Recipe.model_validate({
        "task": {"name": task, "vocab_size": K, "length": L, "held_out": 16, **lengths},
        "model": {"arch": arch, "hidden_size": H, "embed_size": E,
                  **({"d_state": D_STATE} if arch == "s4d" else {})},
        # No encoding: the sinusoidal tables differ by fp32 rounding (the forward check's),
        # which would hide the loop's fp64 agreement.
        "encoding": {"kind": "none"},
        "optim": {"warmup": WARMUP, "lr": LR},
        "train": {"iterations": ITERATIONS, "batch_size": 2 * BATCH, "log_every": LOG_EVERY}})


def _scaled(model: torch.nn.Module, arch: str) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if arch not in SCALED or name.startswith(SCALED[arch]):
                p.mul_(SCALE[arch])


def _grad_norm(model: SequenceModel, batch) -> float:
    """The L2 norm of the whole gradient before clipping, on a copy of `model`."""
    probe = copy.deepcopy(model)
    loss, _ = session.loss_fn(probe, batch)
    loss.backward()
    grads = [p.grad for p in probe.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))


def ours(arch: str, dtype: torch.dtype, task_name: str = "reverse"):
    """Our run: (initial model, per-step trace [(lr, loss, gradient norm, rows)], parameters
    after each step)."""
    rec = recipe(arch, task_name)
    training = session.Session(rec, torch.device("cpu"))
    model = training.model
    # In place: the optimizer holds these parameters and has no state before its first step.
    model.to(dtype)
    _scaled(model, arch)
    initial = copy.deepcopy(model)
    model.train()
    trace, states = [], []
    for k in range(1, rec.train.iterations + 1):
        before = copy.deepcopy(model)
        log = k % rec.train.log_every == 0 or k == rec.train.iterations
        step = training.step(count_hits=log)
        trace.append((step.lr, float(step.loss.detach()), _grad_norm(before, step.batch),
                      step.batch.sequences))
        states.append({n: v.detach().clone() for n, v in model.state_dict().items()})
    return initial, trace, states


def theirs(authors: Authors, arch: str, dtype: torch.dtype, initial, rows: list,
           task_name: str = "reverse"):
    """Their loop over the same batches from the same weights: per-step (lr, loss) and
    parameters under their names."""
    rec = recipe(arch, task_name)
    model = their_model(authors, arch, "none").to(dtype)
    model.load_state_dict(their_state_dict(initial, model), strict=True)
    learner, _, _ = their_learner(authors, arch, model, rec.train.iterations, rec.optim.warmup,
                                  rec.optim.lr, script(arch, task_name))
    learner.seed, learner.logger = rec.train.seed, Log()
    learner.checkpoint |= {"optimizer": {}, "scheduler": {}}
    trace, states = [], []
    step = learner.train_per_iteration

    def recorded(batch, records, iteration):
        lr = learner.optimizer.param_groups[0]["lr"]
        out = step(batch, {}, iteration)
        # Their variable-length step records the loss summed over the batch's tokens.
        trace.append((lr, out["loss"] / out.get("total_tokens", 1)))
        states.append({n: v.detach().clone() for n, v in model.state_dict().items()})
        return records

    learner.train_per_iteration = recorded
    with tempfile.TemporaryDirectory(prefix="perencode-crosscheck-") as folder:
        learner.save_dir = folder  # their loop saves a checkpoint at its end
        learner.train(iter(rows), rec.train.iterations, saving_interval=rec.train.iterations + 1)
    return trace, states


def _their_rows(rows: Tensor, task_name: str):
    """Our batch's sequences as their loader gives them: variable-length rows as a list of
    their tokens (ours are -1 beyond each length)."""
    if task_name == "variable_length":
        return [row[row >= 0] for row in rows]
    return rows


def fp32_drift(fp32: list[dict[str, Tensor]], fp64: list[dict[str, Tensor]]) -> float:
    """The largest |parameter| distance, over steps, between our fp32 and fp64 runs of the
    same batches: the rounding fp32 compounds here, on this machine's threads."""
    return max((float((a[n].double() - b[n]).abs().max()) for a, b in zip(fp32, fp64)
                for n in b if b[n].is_floating_point()), default=0.0)


def compare(authors: Authors, arch: str, task_name: str = "reverse") -> Comparison:
    rec = recipe(arch, task_name)
    errors: dict[str, float] = {}
    parts: dict[str, str] = {}
    fired: list[int] = []
    largest = 0.0
    own: dict[str, list[dict[str, Tensor]]] = {}
    for name, dtype in DTYPES.items():
        initial, mine, my_states = ours(arch, dtype, task_name)
        own[name] = my_states
        other, their_states = theirs(authors, arch, dtype, initial,
                                     [_their_rows(r[3], task_name) for r in mine], task_name)
        target = their_model(authors, arch, "none")
        lr = max(abs(a[0] - b[0]) / rec.optim.lr for a, b in zip(mine, other))
        loss = max(abs(a[1] - b[1]) for a, b in zip(mine, other))
        params = 0.0
        for a, b in zip(my_states, their_states):
            mapped = their_state_dict(_Holder(a), target)
            params = max(params, max(float((mapped[n] - v).abs().max()) for n, v in b.items()
                                     if not n.endswith("time_encoder.frequencies")))
        steps = len(mine) == len(other) == rec.train.iterations
        errors[name] = max(lr, loss, params) if steps else float("inf")
        parts[name] = f"lr {lr:.2g}, loss {loss:.2g}, parameters {params:.2g}"
        fired = [k for k, r in enumerate(mine, start=1) if r[2] > rec.optim.clip_norm]
        largest = max(r[2] for r in mine)
    clipping = (f"clipping fired on {len(fired)} of {rec.train.iterations} steps (gradient "
                f"norm up to {largest:.2f} > clip {rec.optim.clip_norm})" if fired else
                "clipping never fired: a clipping fault would not be seen")
    label = arch if task_name == "reverse" else f"{arch} {task_name}"
    drift = fp32_drift(own["fp32"], own["fp64"]) if arch == "s4d" else 0.0
    base = 1e-4 if arch == "s4d" else 1e-5
    check = numeric(
        f"training loop: {label}",
        f"lr, loss and parameters after each of {rec.train.iterations} iterations of "
        f"perencode.training.session.Session.step (warm-up {rec.optim.warmup}, "
        f"peak lr {rec.optim.lr}, "
        f"batch {rec.train.batch_size}, {task_name} K={K} L={L}, weights x{SCALE[arch]:g}); "
        f"{clipping}",
        f"{script(arch, task_name)[:-3]}.Learner.train (utils.training_template) over the same "
        "batches",
        # fp32: summation orders differ and 30 steps compound them; fp64 shows a
        # learning rate or a clip applied otherwise (they move parameters by > 1e-6).
        # The S4D's FFT convolution sums in another order than theirs: fp32 1e-4 at least,
        # DRIFT x its drift on this machine.
        {"fp32": max(base, DRIFT * drift), "fp64": 1e-12}, errors,
        reason="; ".join(f"{d}: {parts[d]}" for d in DTYPES) + (
            f"; fp32 tolerance max({base:g}, {DRIFT:g} x our fp32 run's drift from fp64, "
            f"{drift:.2g})" if arch == "s4d" else ""), unit="max over steps of "
        "|lr ours - theirs| / peak, |loss difference|, max |parameter difference|")
    if not fired:
        check.verdict, check.reason = "disagree", f"{clipping}; {check.reason}"
    return check


class _Holder(torch.nn.Module):
    """A state dict standing in for our model, for `their_state_dict`."""

    def __init__(self, state: dict):
        super().__init__()
        self._state = state

    def state_dict(self, *args, **kwargs):
        return self._state


def check_loop(authors: Authors) -> list[Comparison]:
    return [compare(authors, arch, task) for arch, task in CASES]
