"""Resuming, on both sides: a run interrupted after BREAK of ITERATIONS iterations and
resumed from its checkpoint against the uninterrupted run.

Ours: perencode.training.session.Session's `state` written with torch.save and read back with
`weights_only=True` (as a checkpoint file is), `load`ed into a fresh Session that takes the
remaining steps with `step`. Theirs: their `Learner.train` saves its checkpoint at BREAK
(`save_model`: modules, optimizer, scheduler, seed, iteration); a fresh Learner's
`retrieve_model` restores the model, Adam and the timm scheduler from it and `train`
continues from `start_iter`. Each resumed run must equal its own uninterrupted run, and
ours theirs, parameter by parameter; so a resume that forgets Adam's moments, the schedule's
position or the batch stream disagrees.
"""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path
from typing import Any

import torch

from perencode.commands.crosscheck.authors import Authors
from perencode.commands.crosscheck.loop import SCALE, _scaled, recipe
from perencode.commands.crosscheck.models import DTYPES, E, K, L, their_learner, their_state_dict
from perencode.commands.crosscheck.models import theirs as their_model
from perencode.commands.crosscheck.report import Comparison, numeric
from perencode.commands.crosscheck.tasks import Log
from perencode.training import session

ITERATIONS, BREAK = 12, 7  # the break falls inside the warm-up's end (WARMUP 10)
ARCH = "gru"


def _ours(dtype: torch.dtype, folder: Path):
    """(initial model, parameters after the uninterrupted run, after the resumed run,
    the batches' rows)."""
    rec = recipe(ARCH).model_copy(update={"train": recipe(ARCH).train.model_copy(
        update={"iterations": ITERATIONS})})

    def started() -> session.Session:
        run = session.Session(rec, torch.device("cpu"))
        run.model.to(dtype)
        _scaled(run.model, ARCH)
        return run

    whole = started()
    initial = copy.deepcopy(whole.model)
    rows = [whole.step().batch.sequences for _ in range(ITERATIONS)]
    first = started()
    for _ in range(BREAK):
        first.step()
    path = folder / "ours.pt"
    torch.save(first.state(), path)
    resumed = session.Session(rec, torch.device("cpu"))
    resumed.model.to(dtype)
    resumed.load(path, torch.load(path, weights_only=True))
    again = [resumed.step().batch.sequences for _ in range(ITERATIONS - BREAK)]
    same_batches = all(torch.equal(a, b) for a, b in zip(again, rows[BREAK:]))
    return initial, whole.model.state_dict(), resumed.model.state_dict(), rows, same_batches


def _theirs(authors: Authors, dtype: torch.dtype, initial, rows, folder: Path):
    """Their parameters after the uninterrupted and the resumed run, under their names."""
    rec = recipe(ARCH)
    model = their_model(authors, ARCH, "none").to(dtype)
    model.load_state_dict(their_state_dict(initial, model), strict=True)
    learner, oc, sc = their_learner(authors, ARCH, model, ITERATIONS, rec.optim.warmup,
                                    rec.optim.lr)
    # What their retrieve_model rebuilds the model from (their script's model_configs).
    learner.checkpoint = {
        "modules": {"rnn": {"module_name": "RNN", "init_args": dict(
            vocab_size=K, hidden_size=rec.model.hidden_size, rnn_name=ARCH.upper(),
            embed_size=E, max_length=2 * L, learnable_padding_token=True)}},
        "optimizer": {"init_args": oc}, "scheduler": {"init_args": sc}}
    learner.seed, learner.logger, learner.save_dir = rec.train.seed, Log(), str(folder)
    learner.train(iter(rows), ITERATIONS, saving_interval=BREAK)
    whole = {n: v.detach().clone() for n, v in model.state_dict().items()}
    cls: Any = type(learner)  # their Learner, untyped
    resumed = cls.__new__(cls)
    resumed.logger, resumed.device = Log(), torch.device("cpu")
    resumed.save_dir = str(folder / "resumed")
    Path(resumed.save_dir).mkdir()
    # Their retrieve_model builds the model afresh: in fp64 where the run was fp64 (built in
    # fp32, the checkpoint's fp64 weights and Adam moments would be rounded).
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        resumed.retrieve_model(str(folder / f"checkpoint_after-{BREAK}-iters.pt"))
    finally:
        torch.set_default_dtype(default)
    # Their retrieve_model constructs the timm scheduler after loading Adam's state, and
    # timm's constructor sets the lr to warmup_lr_init (0): their first iteration after a
    # resume would run at 0. Their loop's own scheduler.step(BREAK), which set the lr of
    # iteration BREAK + 1 before the checkpoint, is applied again so the runs can be compared.
    retrieved_lr = resumed.optimizer.param_groups[0]["lr"]
    resumed.scheduler.step(BREAK)
    resumed.train(iter(rows[BREAK:]), ITERATIONS, saving_interval=ITERATIONS + 1,
                  start_iter=resumed.last_iteration + 1)
    after = {n: v.detach().clone() for n, v in resumed.rnn.module.state_dict().items()}
    return whole, after, retrieved_lr


def _diff(a: dict, b: dict) -> float:
    return max(float((a[n] - b[n]).abs().max()) for n in b)


def check_resume(authors: Authors) -> list[Comparison]:
    errors, parts = {}, {}
    target = their_model(authors, ARCH, "none")
    for name, dtype in DTYPES.items():
        with tempfile.TemporaryDirectory(prefix="perencode-crosscheck-") as folder:
            initial, whole, resumed, rows, same_batches = _ours(dtype, Path(folder))
            their_whole, their_resumed, retrieved_lr = _theirs(authors, dtype, initial, rows,
                                                               Path(folder))

        class Holder(torch.nn.Module):
            def __init__(self, state):
                super().__init__()
                self._state = state

            def state_dict(self, *args, **kwargs):
                return self._state

        ours_resumed = their_state_dict(Holder(resumed), target)
        ours_whole = their_state_dict(Holder(whole), target)
        own = _diff(ours_resumed, ours_whole)
        theirs_own = _diff(their_resumed, their_whole)
        across = _diff(ours_resumed, their_resumed)
        errors[name] = max(own, theirs_own, across) + (0.0 if same_batches else float("inf"))
        parts[name] = (f"ours resumed vs uninterrupted {own:.2g}, theirs {theirs_own:.2g}, "
                       f"ours vs theirs resumed {across:.2g}"
                       + ("" if same_batches else "; our resumed batches differ"))
    scheduled = session.learning_rate(BREAK, recipe(ARCH).optim, ITERATIONS)
    difference = (f"their retrieve_model leaves the lr of the first iteration after a resume "
                  f"at timm's warmup_lr_init ({retrieved_lr:g}, not {scheduled:g}); ours "
                  "resumes at the schedule's lr" if retrieved_lr != scheduled else "")
    return [numeric(
        f"resume: {ARCH}", f"parameters after {ITERATIONS} iterations interrupted after "
        f"{BREAK} and resumed from the checkpoint, against the uninterrupted run, on each side "
        f"and across (Session.state/load; warm-up {recipe(ARCH).optim.warmup}, weights "
        f"x{SCALE[ARCH]:g}); the resumed batches equal the uninterrupted run's",
        "utils.training_template.Learner.save_model, retrieve_model (model, Adam, timm "
        "scheduler; their loop's scheduler.step(k) re-applied), train(start_iter)",
        {"fp32": 1e-5, "fp64": 1e-12}, errors,
        reason="; ".join(f"{d}: {parts[d]}" for d in DTYPES), difference=difference)]
