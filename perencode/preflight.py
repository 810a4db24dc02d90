"""Will this recipe fit? The memory a training run needs, estimated before any file is written.

`estimate(recipe)` counts, from the recipe and its task's sizes (perencode.tasks.shapes;
no data is read and the model is built on the meta device only):
- the parameters, exactly as perencode.models builds them, times 16 bytes: fp32 weights,
  their gradients and Adam's two moments;
- the activations one training step keeps for its backward pass: embedding and encoding
  [B, T, E + D_in], the sequence model's saved state [B, T, c * H] (c per architecture,
  `saved_per_step`), and the head's logits and their log-softmax [B, T_out, K] (at most two chunks
  of session.CHUNK_LOGITS each when session.loss_fn chunks them);
- or the held-out evaluation at train.eval_batch_size, without gradients, where that is
  larger (its logits are never chunked).
`check_memory(recipe, device)` refuses, with one line, a recipe whose estimate exceeds the memory
of the device (perencode.device.device_memory): on the CPU the tightest of this process's
cgroup limit, its SLURM allocation and the available RAM (what a new process can take
without swapping), the total memory of a CUDA device. The estimate leaves out allocator
slack and the CUDA context, so a refusal means the run cannot fit; a run that passes may
still fail on a device shared with other work.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from perencode import kinds
from perencode.device import device_memory
from perencode.encoding import input_width
from perencode.errors import UserError
from perencode.models import build_model
from perencode.recipe import Recipe
from perencode.tasks import shapes

FLOAT = 4  # bytes: every parameter and activation is fp32
# Without gradients only a step's input and output of the sequence model are alive at once.
LIVE_PER_STEP_EVAL = 2
GIB = 1 << 30


def meta_model(recipe: Recipe) -> torch.nn.Module:
    """The model perencode.models.build_model makes for `recipe`, built on the meta device
    (no memory, no initialisation) at the task's sizes."""
    sizes = shapes(recipe.task)  # a task measured here is built on the CPU, not the meta device
    with torch.device("meta"):
        return build_model(recipe, sizes)


def parameter_count(recipe: Recipe) -> int:
    """Trainable parameters of the model of `recipe` (counted on `meta_model`)."""
    return sum(p.numel() for p in meta_model(recipe).parameters() if p.requires_grad)


def saved_per_step(arch: str) -> int:
    """Floats per sample and step, in units of H, that the model keeps for its backward pass
    (its registration, perencode.kinds; else the largest of the registered models')."""
    saved = kinds.get("model", arch).saved_per_step
    if saved is None:
        saved = max(k.saved_per_step or 0 for k in kinds.registry("model").values())
    return saved


def buffer_bytes(recipe: Recipe) -> int:
    """Fixed encoding tables (sinusoidal, random), which are not trained."""
    encoding = kinds.get("encoding", recipe.encoding.kind)
    if encoding.table is not None and not encoding.trained:
        return shapes(recipe.task).steps * recipe.model.embed_size * FLOAT
    return 0


def _head(rows: int, classes: int, chunk_logits: int | None) -> int:
    """Floats of the logits and their log-softmax for `rows` scored outputs, computed
    `chunk_logits` at a time above that many (None: all at once)."""
    if chunk_logits is not None and rows * classes > chunk_logits:
        return 2 * chunk_logits
    return 2 * rows * classes


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
    per_step_in = E + (D if kinds.get("encoding", recipe.encoding.kind).adds_input else 0)
    B, T, T_out, K = tc.batch_size, s.steps, s.outputs, s.num_classes
    train = B * T * (per_step_in + saved_per_step(m.arch) * H) + \
        _head(B * T_out, K, chunk_logits)
    B_eval = min(tc.eval_batch_size, s.held_out_rows or tc.eval_batch_size)
    evaluation = B_eval * T * (per_step_in + LIVE_PER_STEP_EVAL * H) + \
        _head(B_eval * T_out, K, None)
    params = parameter_count(recipe)
    return Estimate(params, 4 * FLOAT * params, FLOAT * max(train, evaluation),
                    buffer_bytes(recipe))


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def check_memory(recipe: Recipe, device: torch.device, chunk_logits: int) -> Estimate:
    """Raise UserError when `recipe` cannot fit on `device`; return the estimate."""
    need = estimate(recipe, chunk_logits)
    memory = device_memory(device)
    if memory is not None and need.total > memory[0]:
        have, what = memory
        m, tc = recipe.model, recipe.train
        raise UserError(
            f"not enough memory for this recipe: it needs about {_gib(need.total)} "
            f"({need.parameters:,} parameters with gradients and Adam: "
            f"{_gib(need.state_bytes)}; activations at batch {tc.batch_size}: "
            f"{_gib(need.activation_bytes)}), more than the {_gib(have)} of {what}; lower "
            f"model.hidden_size ({m.hidden_size}), model.embed_size ({m.embed_size}) or "
            f"train.batch_size ({tc.batch_size}), or pass --force to try anyway")
    return need
