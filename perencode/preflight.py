"""Will this recipe fit? The memory a training run needs, estimated before any file is written.

`estimate(recipe)` counts, from the recipe alone (no model is built, no data read):
- the parameters, exactly as perencode.models builds them, times 16 bytes: fp32 weights,
  their gradients and Adam's two moments;
- the activations one training step keeps for its backward pass: embedding and encoding
  [B, T, E + D_in], the sequence model's saved state [B, T, c * H] (c per architecture,
  `saved_per_step`), and the head's logits and their log-softmax [B, T_out, K] (at most two chunks
  of train.CHUNK_LOGITS each when train.loss_fn chunks them);
- or the held-out evaluation at train.eval_batch_size, without gradients, where that is
  larger (its logits are never chunked).
`check(recipe, device)` refuses, with one line, a recipe whose estimate exceeds the memory
of the device: the available RAM on the CPU (what a new process can take without
swapping), the total memory of a CUDA device. The estimate leaves out allocator slack and
the CUDA context, so a refusal means the run cannot fit; a run that passes may still fail
on a device shared with other work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from perencode import kinds
from perencode.errors import UserError
from perencode.models import ModelSizes
from perencode.recipe import Recipe

FLOAT = 4  # bytes: every parameter and activation is fp32
# Without gradients only a step's input and output of the sequence model are alive at once.
LIVE_PER_STEP_EVAL = 2
GIB = 1 << 30


@dataclass(frozen=True)
class Shapes:
    """What the recipe's task feeds the model (perencode.tasks)."""

    num_embeddings: int  # embedding rows
    num_classes: int  # head outputs K
    steps: int  # T, input steps of a training batch
    outputs: int  # T_out, scored output steps
    positions: int  # rows of a learnable or random encoding table
    held_out_rows: int  # rows an evaluation pass batches (lm: paragraphs of L tokens)


def task_shapes(recipe: Recipe) -> Shapes:
    t = recipe.task
    K, L = t.vocab_size, t.length
    if t.name == "lm":  # <unk>/padding is embedding row K; inputs are tokens[:-1]
        return Shapes(K, K - 1, L, L, L, recipe.train.eval_batch_size)
    if t.name == "predecessor":  # L tokens and the query, one output
        return Shapes(K, K, L + 1, 1, L + 1, t.held_out)
    command = t.name != "reverse_add"  # the other tasks end with L command tokens
    rows = t.held_out
    if t.name == "variable_length":
        rows = t.held_out * (L - t.min_length + 1)
    elif t.name == "dual_frequency":  # 2 target types x 2 disturbant types x L positions
        rows = 4 * L * t.held_out_per_cell
    return Shapes(K + int(command), K, 2 * L, L, 2 * L, rows)


def cell_inputs(recipe: Recipe) -> int:
    """D_in: embedding joined with the encoding (perencode.encoding.PositionalEncoding)."""
    e = recipe.encoding
    E = recipe.model.embed_size
    return 2 * E if kinds.get("encoding", e.kind).adds_input and e.mode == "concat" else E


def parameter_count(recipe: Recipe) -> int:
    """Trainable parameters of the model perencode.models.build_model makes for `recipe`."""
    m, shapes = recipe.model, task_shapes(recipe)
    E, H, D = m.embed_size, m.hidden_size, cell_inputs(recipe)
    count = shapes.num_embeddings * E + H * shapes.num_classes + shapes.num_classes
    if kinds.get("encoding", recipe.encoding.kind).trained:
        count += shapes.positions * E
    if m.arch not in FORMULAS:
        return _built_parameter_count(recipe, shapes)
    if m.arch == "s4d":
        modes = m.d_state // 2
        count += D * H + H  # in_proj
        count += 2 * H + 4 * H * modes  # D, log_dt; C (complex), log_A_real, A_imag
        count += H * 2 * H + 2 * H  # out_proj
    else:
        gates = 3 if m.arch == "gru" else 4
        count += gates * H * (D + H) + 2 * gates * H  # weight_ih, weight_hh, two biases
    return count


# The models whose parameters `parameter_count` counts by formula (a check on the models:
# tests compare it with the built model); any other registered model is built to count.
FORMULAS = ("gru", "lstm", "s4d")


def _built_parameter_count(recipe: Recipe, shapes: Shapes) -> int:
    """Trainable parameters of the registered model, built on the meta device (no memory)."""
    sizes = ModelSizes(shapes.num_embeddings, shapes.num_classes, shapes.positions)
    with torch.device("meta"):
        model = kinds.get("model", recipe.model.arch).build(recipe.model, recipe.encoding,
                                                            sizes)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


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
        return task_shapes(recipe).positions * recipe.model.embed_size * FLOAT
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
    at a time above that many (train.CHUNK_LOGITS)."""
    m, tc, shapes = recipe.model, recipe.train, task_shapes(recipe)
    E, H, D = m.embed_size, m.hidden_size, cell_inputs(recipe)
    per_step_in = E + (D if kinds.get("encoding", recipe.encoding.kind).adds_input else 0)
    B, T, T_out, K = tc.batch_size, shapes.steps, shapes.outputs, shapes.num_classes
    train = B * T * (per_step_in + saved_per_step(m.arch) * H) + \
        _head(B * T_out, K, chunk_logits)
    B_eval = min(tc.eval_batch_size, shapes.held_out_rows)
    evaluation = B_eval * T * (per_step_in + LIVE_PER_STEP_EVAL * H) + \
        _head(B_eval * T_out, K, None)
    params = parameter_count(recipe)
    return Estimate(params, 4 * FLOAT * params, FLOAT * max(train, evaluation),
                    buffer_bytes(recipe))


def device_memory(device: torch.device) -> tuple[int, str] | None:
    """(bytes the run can use on `device`, a phrase with {} where they go); None where it
    cannot be told."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return props.total_memory, f"{device} ({props.name}) has {{}}"
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "the CPU has {} available"
    except (OSError, ValueError, IndexError):
        pass
    try:
        return (os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
                "the CPU has {} free")
    except (AttributeError, ValueError, OSError):
        return None


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def check(recipe: Recipe, device: torch.device, chunk_logits: int) -> Estimate:
    """Raise UserError when `recipe` cannot fit on `device`; return the estimate."""
    need = estimate(recipe, chunk_logits)
    memory = device_memory(device)
    if memory is not None and need.total > memory[0]:
        have, where = memory
        m, tc = recipe.model, recipe.train
        raise UserError(
            f"not enough memory for this recipe: it needs about {_gib(need.total)} "
            f"({need.parameters:,} parameters with gradients and Adam: "
            f"{_gib(need.state_bytes)}; activations at batch {tc.batch_size}: "
            f"{_gib(need.activation_bytes)}), {where.format(_gib(have))}; lower "
            f"model.hidden_size ({m.hidden_size}), model.embed_size ({m.embed_size}) or "
            f"train.batch_size ({tc.batch_size}), or pass --force to try anyway")
    return need
