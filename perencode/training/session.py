"""A training session: the one owner of the training step.

A recipe on a device becomes a task and its model (`build`: models, perencode.kinds.models, and
tasks, perencode.kinds.tasks, do not know each other; this module is where they meet), an Adam
optimizer, the learning-rate schedule and the training batches' stream; `Session.step` is
one iteration as `perencode train` runs it. `train`, `bench`, `doctor`, `stability` and
`crosscheck` all drive this object, so that the step one of them times or checks is the
step training runs.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from perencode.common.errors import UserError
from perencode.config.recipe import OptimConfig, Recipe
from perencode.kinds.models import SequenceModel, build_model
from perencode.kinds.tasks import Batch, make
from perencode.store import checkpoints, records


def output_features(model: SequenceModel, batch: Batch) -> Tensor:
    """Model features at the output steps only [B, T_out, H]."""
    h = model(batch.inputs)  # [B, T, H]
    T_out = batch.output_targets.shape[1]
    if batch.output_steps is None:
        return h[:, -T_out:]  # [B, T_out, H]
    return h.gather(1, batch.output_steps[..., None].expand(-1, -1, h.shape[-1]))


def output_logits(model: SequenceModel, batch: Batch) -> Tensor:
    """Logits at the output steps [B, T_out, K]: the head never runs on input steps."""
    return model.head(output_features(model, batch))


def learning_rate(step: int, optim: OptimConfig, iterations: int) -> float:
    """Learning rate of the iteration that follows `step` completed optimizer steps.

    timm (default, docs/paper-facts.md#learning-rate-schedule): the authors'
    CosineLRScheduler(t_initial=iterations, warmup_t=warmup, warmup_prefix=True, lr_min=0,
    warmup_lr_init=0), stepped with the 1-based step count after each optimizer step, so iteration 1
    runs at 0, the peak is first used at iteration warmup+1, and the last iteration runs just above
    0. cosine: the same warm-up, then a cosine that reaches 0 exactly at the last iteration.
    """
    peak, warm = optim.lr, optim.warmup
    if step < warm:
        return peak * step / warm
    if optim.schedule == "timm":
        return 0.5 * peak * (1.0 + math.cos(math.pi * (step - warm) / iterations))
    span = max(iterations - 1 - warm, 1)
    return 0.5 * peak * (1.0 + math.cos(math.pi * min(step - warm, span) / span))


# Above this many logits (scored outputs x classes; 4 GiB in fp32) the head and the loss run
# a chunk of rows at a time and are recomputed in the backward pass, so the full [N, K]
# logits never exist at once (WikiText-103: 512 paragraphs x up to 1,024 steps x 32,767
# classes, docs/paper-facts.md#language-modelling).
CHUNK_LOGITS = 1 << 30


def loss_fn(model: SequenceModel, batch: Batch, count_hits: bool = False,
            chunk_logits: int = CHUNK_LOGITS) -> tuple[Tensor, Tensor | None]:
    """Mean cross-entropy over the scored outputs (docs/paper-facts.md#common-model: output phase
    only; padding and other masked outputs never count), and the number of correct argmax
    predictions when `count_hits`. Returns (loss, hits)."""
    h = output_features(model, batch)  # [B, T_out, H]
    target, mask = batch.output_targets, batch.output_mask
    K = model.head.out_features
    if h.shape[0] * h.shape[1] * K <= chunk_logits:
        logits = model.head(h)  # [B, T_out, K]
        # ignore_index rather than boolean indexing: no device sync in the hot path.
        scored = target if mask is None else target.masked_fill(~mask, -100)
        loss = F.cross_entropy(logits.reshape(-1, K), scored.reshape(-1), ignore_index=-100)
        hits = (logits.argmax(-1) == scored).sum() if count_hits else None
        return loss, hits
    if mask is not None:  # drop padding before the head: it dominates LM batches
        h, target = h[mask], target[mask]  # [N, H], [N]
    else:
        h, target = h.reshape(-1, h.shape[-1]), target.reshape(-1)
    n, rows = target.shape[0], max(1, chunk_logits // K)

    def ce_sum(h_chunk: Tensor, t_chunk: Tensor) -> Tensor:
        return F.cross_entropy(model.head(h_chunk), t_chunk, reduction="sum")

    total = h.new_zeros(())
    hits = torch.zeros((), dtype=torch.long, device=h.device) if count_hits else None
    for start in range(0, n, rows):
        h_chunk, t_chunk = h[start:start + rows], target[start:start + rows]
        total = total + checkpoint(ce_sum, h_chunk, t_chunk, use_reentrant=False)
        if count_hits:
            with torch.no_grad():
                hits += (model.head(h_chunk).argmax(-1) == t_chunk).sum()
    return total / n, hits


def make_optimizer(model: nn.Module, optim: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=optim.lr, betas=optim.betas,
                            eps=optim.eps, weight_decay=optim.weight_decay)


def train_step(model: SequenceModel, optimizer: torch.optim.Optimizer, batch: Batch,
               clip_norm: float, count_hits: bool = False
               ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """One optimizer step; returns (loss, correct predictions or None, the gradient norm
    before clipping or None without clipping), not synchronised."""
    loss, hits = loss_fn(model, batch, count_hits)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = nn.utils.clip_grad_norm_(model.parameters(), clip_norm) if clip_norm > 0 else None
    optimizer.step()
    return loss, hits, norm


def training_generator(recipe: Recipe, device: torch.device) -> torch.Generator:
    """The training batches' stream (seeded apart from the others:
    checkpoints.TRAINING_SEED_OFFSET)."""
    seed = recipe.train.seed + checkpoints.TRAINING_SEED_OFFSET
    return torch.Generator(device=device).manual_seed(seed)


def build(recipe: Recipe, device: torch.device) -> tuple:
    """(task, model): the task with its held-out set drawn from the seed, and the model
    initialised from the seed, on `device`."""
    task = make(recipe.task, recipe.train.seed, device)
    torch.manual_seed(recipe.train.seed)
    return task, build_model(recipe, task.shapes).to(device)


class NotFinite(UserError):
    """An evaluation of the model after `iteration` met `what` (logits or a metric that is
    not finite): a divergence at evaluation, nothing scored."""

    def __init__(self, iteration: int, what: str):
        super().__init__(f"diverged at evaluation after iteration {iteration}: {what}; "
                         "nothing is scored")
        self.iteration, self.what = iteration, what


def set_precision(recipe: Recipe) -> None:
    """torch's TF32 switches as train.precision says: cuDNN's on (torch's default, the
    authors' recurrent kernels), cuBLAS's matmuls on only for "tf32" (off by default since
    torch 1.12: the authors' heads ran in fp32). Set for every session, so that a step
    `bench` times runs at the precision `train` runs."""
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = recipe.train.precision == "tf32"


class Step(NamedTuple):
    """One iteration: its learning rate, its batch, the loss, the correct predictions (when
    counted) and the gradient norm before clipping (None without clipping); the tensors
    not synchronised."""

    lr: float
    batch: Batch
    loss: Tensor
    hits: Tensor | None
    norm: Tensor | None


class Session:
    """The training of `recipe` on `device`: task, model, optimizer, schedule, batch stream.

    Built as `perencode train` builds a run (`build`: the task, then the model from the
    seed), or around a given `model` (the recipe's task built beside it). `iteration`
    counts the optimizer steps taken; `step` takes the next one.
    """

    def __init__(self, recipe: Recipe, device: torch.device,
                 model: SequenceModel | None = None):
        self.recipe, self.device = recipe, device
        set_precision(recipe)
        if model is None:
            task, model = build(recipe, device)
        else:
            task = make(recipe.task, recipe.train.seed, device)
        self.task, self.model = task, model
        # Global, as the authors' training template sets it; a switch of cuDNN's kernels (the
        # RNNs'), so a no-op on the CPU. Set here so that bench and doctor time and check
        # the step training runs.
        torch.backends.cudnn.deterministic = recipe.train.deterministic
        self.generator = training_generator(recipe, device)
        self.iteration = 0

    @functools.cached_property
    def optimizer(self) -> torch.optim.Optimizer:
        """Adam over the model's parameters, made at its first use: a session that only
        scores its model (`of_checkpoint`: eval, stability) never makes one, nor pays for
        the torch._dynamo import that torch.optim's first parameter group costs (about 2 s
        a process)."""
        return make_optimizer(self.model, self.recipe.optim)

    @classmethod
    def of_checkpoint(cls, recipe: Recipe, device: torch.device, path: str | Path,
                      state: dict) -> Session:
        """The session of a run's checkpoint `state` (read from `path`: perencode.store.runs.Run.
        load): its model's weights and iteration (to score or analyse it; the optimizer and
        the streams are not restored)."""
        session = cls(recipe, device)
        checkpoints.restore_model(session.model, state, path)
        session.iteration = state["iteration"]
        return session

    def batch(self) -> Batch:
        """The next batch of the task's training stream."""
        return self.task.sample(self.recipe.train.batch_size, self.generator)

    def step(self, batch: Batch | None = None, count_hits: bool = False) -> Step:
        """The next iteration as `train` runs it: the schedule's learning rate for it, the
        next training batch (or `batch`), one optimizer step."""
        recipe = self.recipe
        lr = learning_rate(self.iteration, recipe.optim, recipe.train.iterations)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        batch = self.batch() if batch is None else batch
        loss, hits, norm = train_step(self.model, self.optimizer, batch, recipe.optim.clip_norm,
                                      count_hits)
        self.iteration += 1
        return Step(lr, batch, loss, hits, norm)

    @torch.no_grad()
    def evaluate(self, **options) -> dict:
        """The model's scores on the task's held-out data (eval.json's dict, without its
        iteration): `perencode eval` and the end of `perencode train` alike. Logits or a
        metric that are not finite raise NotFinite: the argmax of NaN is class 0, a score no
        model earned, so nothing is scored."""
        model = self.model
        was_training = model.training
        finite: list[Tensor] = []  # one flag per batch, read once at the end (no sync)

        def logits(batch: Batch) -> Tensor:
            out = output_logits(model, batch)
            finite.append(torch.isfinite(out).all())
            return out

        model.eval()
        try:
            metrics = self.task.evaluate(logits, self.recipe.train.eval_batch_size, **options)
        finally:
            model.train(was_training)
        if finite and not bool(torch.stack(finite).all()):
            raise NotFinite(self.iteration, "logits are not finite")
        for key, value in metrics.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise NotFinite(self.iteration, f"{key} is {value}")
        return {**records.eval_identity(self.recipe), **metrics}

    def state(self) -> dict:
        """What a checkpoint holds of the session (perencode.store.checkpoints.session_state):
        iteration, model, optimizer and the random streams."""
        return checkpoints.session_state(self.iteration, self.model, self.optimizer,
                                         self.generator, self.device)

    def load(self, path: str | Path, state: dict) -> None:
        """Continue from the checkpoint `state` read from `path` (perencode.store.runs.Run.resume's
        pair), wherever its tensors were mapped to (perencode.store.checkpoints.restore)."""
        self.iteration = checkpoints.restore(state, path, self.model, self.optimizer,
                                             self.generator, self.device)
