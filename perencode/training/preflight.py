"""Will this recipe fit? The memory a training run needs, estimated before any file is written.

`estimate(recipe)` counts, from the recipe and its task's sizes (perencode.kinds.tasks.shapes;
no data is read and the model is built on the meta device only):
- the parameters, exactly as perencode.kinds.models builds them, times 16 bytes: fp32 weights,
  their gradients and Adam's two moments;
- the activations one training step keeps for its backward pass: embedding and encoding
  [B, T, E + D_in], the sequence model's saved state [B, T, c * H] (c per architecture,
  `saved_per_step`), and the head at its backward's peak: the saved log-softmax, its
  gradient and the logits' gradient, three [B, T_out, K] (three chunks of
  session.CHUNK_LOGITS when session.loss_fn chunks them: the language model's head then
  holds 12 GiB, not the 8 GiB of the forward pass);
- or the held-out evaluation at train.eval_batch_size (the final one, or train.eval_every's),
  without gradients, where that is larger: its logits and their log-softmax, never chunked.
  It is the peak of the K = 16,384 LSTMs (eval batch 1,024: about 9.5 GiB a run).
Weights, gradients and Adam's moments are all alive at the final evaluation (the last
step's gradients are freed by the next step only).
`check_memory(recipe, device, runs_sharing=n)` refuses, with one line, a recipe whose estimate
times the runs that will share the device exceeds the memory free on it
(perencode.common.device.device_memory): on the CPU the tightest of this process's cgroup limit,
its SLURM allocation and the available RAM (what a new process can take without swapping);
on a CUDA device what cudaMemGetInfo says is free, so that memory other processes hold
(other runs sharing the GPU among them) is not counted as this run's. The estimate leaves
out allocator slack and the CUDA context, so a refusal means the run cannot fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from perencode.common.device import device_memory
from perencode.common.errors import UserError
from perencode.config import registry
from perencode.config.recipe import Recipe
from perencode.kinds.encoding import input_width
from perencode.kinds.models import build_model
from perencode.kinds.tasks import shapes

FLOAT = 4  # bytes: every parameter and activation is fp32
# Without gradients only a step's input and output of the sequence model are alive at once.
LIVE_PER_STEP_EVAL = 2
GIB = 1 << 30


def meta_model(recipe: Recipe) -> torch.nn.Module:
    """The model perencode.kinds.models.build_model makes for `recipe`, built on the meta device
    (no memory, no initialisation) at the task's sizes."""
    sizes = shapes(recipe.task)  # a task measured here is built on the CPU, not the meta device
    with torch.device("meta"):
        return build_model(recipe, sizes)


def parameter_count(recipe: Recipe) -> int:
    """Trainable parameters of the model of `recipe` (counted on `meta_model`)."""
    return sum(p.numel() for p in meta_model(recipe).parameters() if p.requires_grad)


def saved_per_step(arch: str) -> int:
    """Floats per sample and step, in units of H, that the model keeps for its backward pass
    (its registration, perencode.config.registry; else the largest of the registered models')."""
    saved = registry.get("model", arch).saved_per_step
    if saved is None:
        saved = max(k.saved_per_step or 0 for k in registry.registry("model").values())
    return saved


def buffer_bytes(recipe: Recipe) -> int:
    """Fixed encoding tables (sinusoidal, random), which are not trained."""
    encoding = registry.get("encoding", recipe.encoding.kind)
    if encoding.table is not None and not encoding.trained:
        return shapes(recipe.task).steps * recipe.model.embed_size * FLOAT
    return 0


# [rows, K] tensors alive at once at the head's peak. Training, in the backward pass: the
# log-softmax cross_entropy saved, the gradient reaching it and the gradient it passes to
# the logits (a chunk recomputed by session.loss_fn's checkpoint holds the same three).
# Evaluation: the logits and their log-softmax (argmax, or the language model's
# cross-entropy per token).
HEAD_TRAIN, HEAD_EVAL = 3, 2


def _head(rows: int, classes: int, chunk_logits: int | None, alive: int) -> int:
    """Floats of `alive` [rows, K] tensors for `rows` scored outputs, computed
    `chunk_logits` at a time above that many (None: all at once)."""
    if chunk_logits is not None and rows * classes > chunk_logits:
        return alive * chunk_logits
    return alive * rows * classes


@dataclass(frozen=True)
class Estimate:
    parameters: int
    state_bytes: int  # weights, gradients and Adam moments
    activation_bytes: int  # the larger of a training step's and an evaluation pass's
    buffer_bytes: int

    @property
    def total(self) -> int:
        return self.state_bytes + self.activation_bytes + self.buffer_bytes


def estimate(recipe: Recipe, chunk_logits: int) -> Estimate:
    """The memory a run of `recipe` needs; its loss computes the head `chunk_logits` logits
    at a time above that many (session.CHUNK_LOGITS)."""
    m, tc, s = recipe.model, recipe.train, shapes(recipe.task)
    E, H, D = m.embed_size, m.hidden_size, input_width(recipe.encoding, m.embed_size)
    per_step_in = E + (D if registry.get("encoding", recipe.encoding.kind).adds_input else 0)
    B, T, T_out, K = tc.batch_size, s.steps, s.outputs, s.num_classes
    train = B * T * (per_step_in + saved_per_step(m.arch) * H) + \
        _head(B * T_out, K, chunk_logits, HEAD_TRAIN)
    B_eval = min(tc.eval_batch_size, s.held_out_rows or tc.eval_batch_size)
    evaluation = B_eval * T * (per_step_in + LIVE_PER_STEP_EVAL * H) + \
        _head(B_eval * T_out, K, None, HEAD_EVAL)
    params = parameter_count(recipe)
    return Estimate(params, 4 * FLOAT * params, FLOAT * max(train, evaluation),
                    buffer_bytes(recipe))


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def check_memory(recipe: Recipe, device: torch.device, chunk_logits: int,
                 runs_sharing: int = 1) -> Estimate:
    """Raise UserError when `runs_sharing` runs of `recipe` (this one and those that will
    start beside it on the device) cannot fit in the memory free on `device`; return one
    run's estimate."""
    need = estimate(recipe, chunk_logits)
    memory = device_memory(device)
    if memory is not None and runs_sharing * need.total > memory[0]:
        have, what = memory
        m, tc = recipe.model, recipe.train
        shared = (f"{runs_sharing} runs sharing it (--runs-per-gpu) need about "
                  f"{_gib(runs_sharing * need.total)}; each " if runs_sharing > 1 else "")
        raise UserError(
            f"not enough memory for this recipe: {shared}it needs about {_gib(need.total)} "
            f"({need.parameters:,} parameters with gradients and Adam: "
            f"{_gib(need.state_bytes)}; activations at batch {tc.batch_size} or the "
            f"held-out evaluation at {tc.eval_batch_size}: {_gib(need.activation_bytes)}), "
            f"more than the {_gib(have)} of {what}; "
            + ("lower --runs-per-gpu, " if runs_sharing > 1 else "")
            + f"lower model.hidden_size ({m.hidden_size}), model.embed_size ({m.embed_size}), "
            f"train.batch_size ({tc.batch_size}) or train.eval_batch_size "
            f"({tc.eval_batch_size}), or pass --force to try anyway")
    return need
