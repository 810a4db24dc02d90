"""Planning: what a run will cost, before it exists. Memory (and the check `train` runs
before writing anything), disk, compute, device-hours and wall time, whichever command asks
(`train`, `sweep --dry-run`/`--estimate`, `doctor`, `plan`). One module, on the training
floor because the training loop calls its memory check; it imports `kinds/`, `config/` and
`common/` only. Its estimates change no number a run records, so a run's code
(perencode.store.identity) leaves it out: an edit to the GPU table or the memory model does
not make a finished run's code "changed".

Memory. Will this recipe fit? The memory a training run needs, estimated before any file is written.

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

Cost. What a run costs, whichever command asks (`sweep --dry-run`/`--estimate`, `doctor`,
`plan`): disk (exact sizes of the checkpoints kept), compute (a FLOP count per iteration,
split into the recurrent layer's and the head's), seconds per iteration measured per shape
and cached in a folder's .estimates.json, or modelled for a GPU of a table from its
published rates (`plan`), and the wall time of an executor's jobs (the seeds a claim
needs are statistics: perencode.analysis.stats).

Seconds per iteration of a shape not measured on this device are extrapolated from measured
shapes of the same architecture by their FLOP ratio.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from perencode.common.device import device_memory
from perencode.common.errors import UserError
from perencode.common.files import atomic_write_json
from perencode.config import registry
from perencode.config.grid import SlurmConfig
from perencode.config.recipe import BOOKKEEPING, Recipe
from perencode.kinds.encoding import input_width
from perencode.kinds.models import SequenceModel, build_model
from perencode.kinds.tasks import shapes

# --------------------------------------------------------------------------------------
# Memory: will this recipe fit?
# --------------------------------------------------------------------------------------

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


# --------------------------------------------------------------------------------------
# Cost: disk, compute, device-hours and wall time
# --------------------------------------------------------------------------------------

# Training fields that do not change what one iteration costs: the bookkeeping (recipe.py),
# and the number of iterations, which changes a run's results but not the price of each.
COSTLESS_TRAIN_FIELDS = {"iterations", *(field.removeprefix("train.") for field in BOOKKEEPING
                                         if field.startswith("train."))}
ESTIMATES = ".estimates.json"  # in the sweep's OUT: seconds per iteration by device and shape
# A checkpoint holds the weights and Adam's two moments, all fp32, plus a few kB of recipe,
# RNG states and bookkeeping.
CHECKPOINT_OVERHEAD = 64 * 1024


def shape_key(recipe: Recipe) -> str:
    """What sets the cost of an iteration: the recipe less seed, length of training, logging."""
    data = recipe.identity()
    data["train"] = {k: v for k, v in data["train"].items() if k not in COSTLESS_TRAIN_FIELDS}
    return json.dumps(data, sort_keys=True)


def checkpoint_bytes(recipe: Recipe) -> int:
    return 12 * parameter_count(recipe) + CHECKPOINT_OVERHEAD


def checkpoints_on_disk(recipe: Recipe) -> int:
    """How many periodic checkpoints a finished run keeps (train.keep_checkpoints)."""
    every, n = recipe.train.checkpoint_every, recipe.train.iterations
    written = n // every + (n % every != 0)
    kept = recipe.checkpoints_kept()
    return written if kept is None else min(kept, written)


def flops_per_iteration(recipe: Recipe) -> float:
    """Multiply-adds x 2 of one training iteration, forward and backward (x 3): the
    sequence layer over T steps (its registration's `flops_per_step`, else one multiply-add
    per parameter of that layer) and the head at the scored outputs."""
    s, m = shapes(recipe.task), recipe.model
    B, T, H, K = recipe.train.batch_size, s.steps, m.hidden_size, s.num_classes
    hook = registry.get("model", m.arch).flops_per_step
    D = input_width(recipe.encoding, m.embed_size)
    per_step = hook(m, D, T) if hook is not None else layer_parameters(recipe)
    return 3 * 2 * B * (T * per_step + s.outputs * H * K)


def held_out_iterations(recipe: Recipe) -> float | None:
    """The periodic held-out scoring of a run (train.eval_every) in training iterations: a
    forward pass (a third of an iteration's FLOPs) over the held-out sequences each time,
    the last step's scoring left out (every run scores the end). 0 without eval_every;
    None for a task with no held-out count (a language model's splits)."""
    every, n = recipe.train.eval_every, recipe.train.iterations
    if every is None:
        return 0.0
    held_out = getattr(recipe.task, "held_out", None)
    if not isinstance(held_out, int):
        return None
    times = n // every - (n % every == 0)
    return times * held_out / recipe.train.batch_size / 3


# layer_parameters by the recipe's model, encoding and task (what builds the model): a plan
# prices hundreds of runs at three efficiencies, seeds and budgets apart, from far fewer shapes.
_LAYER_PARAMETERS: dict[str, int] = {}


def layer_parameters(recipe: Recipe) -> int:
    """Parameters of the model outside its embedding, encoding and head (SequenceModel)."""
    key = recipe.model_dump_json(include={"model", "encoding", "task"})
    if key not in _LAYER_PARAMETERS:
        model = cast(SequenceModel, meta_model(recipe))  # every registered model is one
        front = {id(p) for part in (model.embedding, model.encoding, model.head)
                 for p in part.parameters()}
        _LAYER_PARAMETERS[key] = sum(p.numel() for p in model.parameters()
                                     if id(p) not in front)
    return _LAYER_PARAMETERS[key]


def device_label(device: torch.device, threads: int) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu {platform.machine()} x{threads}"


class Estimates:
    """Measured seconds per iteration by device and shape, cached in OUT/.estimates.json."""

    def __init__(self, out: Path):
        self.path = Path(out) / ESTIMATES
        try:
            self.data = json.loads(self.path.read_text()) if self.path.exists() else {}
        except (json.JSONDecodeError, UnicodeDecodeError):
            self.data = {}  # a cache: measured again

    def get(self, device: str, recipe: Recipe) -> float | None:
        entry = self.data.get(device, {}).get(shape_key(recipe))
        return entry["seconds_per_iteration"] if entry else None

    def put(self, device: str, recipe: Recipe, seconds: float,
            spread: tuple[float, float] | None = None) -> None:
        """A measurement of `recipe`'s shape on `device`: seconds per iteration (a median of
        repeats, their lowest and highest in `spread`)."""
        self.data.setdefault(device, {})[shape_key(recipe)] = {
            "seconds_per_iteration": seconds, "arch": recipe.model.arch,
            **({"spread": list(spread)} if spread is not None else {}),
            "flops_per_iteration": flops_per_iteration(recipe),
            "measured": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        atomic_write_json(self.path, self.data)

    def seconds(self, device: str, recipe: Recipe) -> tuple[float | None, bool]:
        """(seconds per iteration, measured?): measured, else extrapolated by FLOPs from the
        measured shapes of the same architecture on this device (their median rate)."""
        measured = self.get(device, recipe)
        if measured is not None:
            return measured, True
        rates = sorted(e["seconds_per_iteration"] / e["flops_per_iteration"]
                       for e in self.data.get(device, {}).values()
                       if e["arch"] == recipe.model.arch)
        if not rates:
            return None, False
        return rates[len(rates) // 2] * flops_per_iteration(recipe), False


# --------------------------------------------------------------------------------------
# Modelled device time on a GPU (`perencode plan`): the FLOPs of a run split by where they
# run, at a GPU's published rates
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GPU:
    """A GPU's published dense peak rates (TFLOP/s, no structured sparsity), memory (GB) and
    memory bandwidth (GB/s). `tf32` is 0 where the chip has no TF32 (its cuDNN and matmul
    products then run in fp32)."""

    name: str
    fp32: float
    tf32: float
    half: float  # fp16/bf16 tensor-core products
    memory_gb: float
    bandwidth_gbs: float
    measured: bool = False  # its rates come from a measurement on it, not the table


# The vendors' datasheets, dense figures (the datasheets print TF32 and fp16/bf16 "with
# sparsity", twice these): NVIDIA A100 Tensor Core GPU datasheet (SXM: fp32 19.5, TF32 156,
# bf16 312; 40GB at 1,555 GB/s, 80GB at 2,039 GB/s); H100 datasheet (SXM: fp32 67, TF32
# 494.5, bf16 989.5; 80GB at 3,350 GB/s); L40S datasheet (fp32 91.6, TF32 183, bf16 362.05;
# 48GB at 864 GB/s); V100 datasheet (SXM2: fp32 15.7, fp16 tensor 125, no TF32; 32GB at 900
# GB/s); Ada Lovelace architecture whitepaper, Appendix A (RTX 4090: fp32 82.6, TF32 82.6,
# fp16/bf16 with fp32 accumulate 165.2; 24GB at 1,008 GB/s).
GPUS = {
    "a100": GPU("NVIDIA A100 80GB SXM", 19.5, 156.0, 312.0, 80, 2039),
    "a100-40gb": GPU("NVIDIA A100 40GB SXM", 19.5, 156.0, 312.0, 40, 1555),
    "h100": GPU("NVIDIA H100 80GB SXM", 67.0, 494.5, 989.5, 80, 3350),
    "l40s": GPU("NVIDIA L40S", 91.6, 183.0, 362.05, 48, 864),
    "v100": GPU("NVIDIA V100 32GB SXM2", 15.7, 0.0, 125.0, 32, 900),
    "rtx4090": GPU("NVIDIA GeForce RTX 4090", 82.6, 82.6, 165.2, 24, 1008),
}
GPU_ALIASES = {"a100-80gb": "a100", "4090": "rtx4090", "h100-80gb": "h100"}

# Fractions of those peaks a training step is modelled to reach, by where its products run
# (until `bench` on the GPU measures it): a matmul (a head, [scored outputs, H] x [H, K] with
# thousands of rows; an S4D layer's maps over B x T rows) is one large product, which cuBLAS
# runs near its peak; cuDNN's recurrent layer is a chain of T small products ([B, H] x
# [H, gates x H] a step, each waiting for the last) plus the pointwise gate arithmetic, far
# below its peak. These two numbers are the model's assumptions, not measurements;
# REPRODUCE.md's cost section gives the floor at the peak rates beside them.
EFFICIENCY = {"cudnn": 0.25, "matmul": 0.8}


def gpu(name: str) -> GPU:
    """A GPU of the table by its short name (a100, a100-40gb, h100, l40s, v100, rtx4090)."""
    key = name.strip().lower().replace(" ", "").replace("_", "-")
    key = GPU_ALIASES.get(key, key)
    if key not in GPUS:
        raise UserError(f"--gpu '{name}': expected one of {', '.join(GPUS)}")
    return GPUS[key]


# WikiText-103 (Merity et al., 2017, "Pointer Sentinel Mixture Models", Table 1): word-level
# tokens of each split and the articles of the training split; `lines`: rows of the `datasets`
# library's wikitext-103-raw-v1 training split (its dataset card), empty and heading lines
# included. docs/paper-facts.md#wikitext-103 records them and what follows from them.
WIKITEXT103 = {"train_tokens": 103_227_021, "valid_tokens": 217_646, "test_tokens": 245_569,
               "train_articles": 28_475, "train_lines": 1_801_350}
# Paragraphs of the training split (lines that are neither empty nor a heading): every
# paragraph and heading line is followed by an empty one, so at most half the lines; headings
# are a sixth to a third of the rest (an assumption: not published). (low, modelled, high).
TRAIN_PARAGRAPHS = (0.45e6, 0.6e6, 0.75e6)
# SentencePiece pieces a WikiText token (32,768-piece unigram model): an assumption, (low,
# modelled, high); the prepared manifest replaces the whole estimate.
PIECES_PER_TOKEN = (1.05, 1.2, 1.4)


def expected_lm_scored(max_length: int, which: int = 1) -> float:
    """Scored positions of one WikiText-103 paragraph on average, before the corpus is
    prepared: its pieces (tokens a paragraph x pieces a token), less the first (never
    predicted), at most the input length. `which`: 0 the fewest, 1 modelled, 2 the most
    (the fewest paragraphs, the most pieces a token)."""
    paragraphs = TRAIN_PARAGRAPHS[2 - which]
    pieces = WIKITEXT103["train_tokens"] / paragraphs * PIECES_PER_TOKEN[which]
    return min(float(max_length), pieces - 1)


def scored_outputs(recipe: Recipe) -> tuple[float, str]:
    """Scored outputs of one training sequence on average, and where the figure comes from:
    the prepared data's manifest where the task reads a corpus (paragraphs shorter than the
    input length are padded, and padding is dropped before the head), else the task's
    output positions (every position of a synthetic sequence is scored; for an unprepared
    corpus, an upper bound)."""
    s = shapes(recipe.task)
    data = getattr(recipe.task, "data", None)
    if not isinstance(data, str):
        return float(s.outputs), "task"
    try:
        train = json.loads((Path(data) / "manifest.json").read_text())["splits"]["train"]
        return train["scored_tokens"] / train["sequences"], f"{data}/manifest.json"
    except (OSError, KeyError, TypeError, ZeroDivisionError, json.JSONDecodeError):
        return (expected_lm_scored(s.outputs),
                f"expected from WikiText-103's published size: {data} not prepared (at most "
                f"{s.outputs}, at least {expected_lm_scored(s.outputs, 0):.0f})")


@dataclass(frozen=True)
class Work:
    """FLOPs of one training iteration (forward and backward) by where they run: the
    sequence layer (cuDNN's kernels for a model whose TF32 switch is cuDNN's, else matmuls)
    and the head at the scored outputs."""

    layer: float
    head: float
    layer_switch: str  # the model's TF32 switch (perencode.config.registry.TF32_SWITCHES)
    scored: float      # scored outputs a sequence
    scored_source: str

    @property
    def total(self) -> float:
        return self.layer + self.head


def work(recipe: Recipe) -> Work:
    """The FLOPs of `flops_per_iteration`, split, with the head over the scored outputs."""
    s, m = shapes(recipe.task), recipe.model
    B, T, H, K = recipe.train.batch_size, s.steps, m.hidden_size, s.num_classes
    hook = registry.get("model", m.arch).flops_per_step
    D = input_width(recipe.encoding, m.embed_size)
    per_step = hook(m, D, T) if hook is not None else layer_parameters(recipe)
    scored, source = scored_outputs(recipe)
    return Work(3 * 2 * B * T * per_step, 3 * 2 * B * scored * H * K,
                registry.get("model", m.arch).tf32, scored, source)


def rates(w: Work, device: GPU, precision: str = "authors") -> tuple[float, float]:
    """(layer, head) peak FLOP/s on `device`. The authors' numerics (torch's defaults):
    cuDNN's recurrent kernels in TF32 (torch.backends.cudnn.allow_tf32 is on by default),
    matmuls in fp32 (torch.backends.cuda.matmul.allow_tf32 off since torch 1.12);
    `precision = "tf32"` runs the matmuls in TF32 as well. No TF32 on the chip: fp32."""
    tf32 = device.tf32 or device.fp32
    matmul = tf32 if precision == "tf32" else device.fp32
    layer = tf32 if w.layer_switch == "cudnn" else matmul
    return layer * 1e12, matmul * 1e12


def modelled_seconds(w: Work, device: GPU, precision: str = "authors",
                     efficiency: dict[str, float] | None = None) -> float:
    """Seconds per iteration: each part's FLOPs at its rate times the modelled efficiency
    of where it runs (`efficiency` None: EFFICIENCY; PEAK: the peak rates, a floor)."""
    eff = EFFICIENCY if efficiency is None else efficiency
    layer_rate, head_rate = rates(w, device, precision)
    return w.layer / (layer_rate * eff[w.layer_switch]) + w.head / (head_rate * eff["matmul"])


PEAK = {"cudnn": 1.0, "matmul": 1.0}


# --------------------------------------------------------------------------------------
# The work beside training that a plan prices (`perencode plan --budget`)
# --------------------------------------------------------------------------------------

# The model's efficiencies are assumptions (EFFICIENCY): the range a plan states runs from
# the first of each pair (slow) to the second (fast).
EFFICIENCY_RANGE = {"cudnn": (0.15, 0.40), "matmul": (0.5, 0.9)}
# A run's start on the GPU (python and torch imported, CUDA initialised, the task's data drawn,
# the first iteration's cuDNN plans): minutes, (low, modelled, high). An assumption, not a
# measurement; a requeued SLURM job starts again.
STARTUP_MINUTES = (1.0, 2.0, 5.0)
# `perencode sweep --estimate` on one cell of the GPU the jobs get, before the request (a few
# hundred timed iterations and the preflight): minutes, once a plan.
GPU_CHECK_MINUTES = (5.0, 10.0, 20.0)
# `perencode stability` a checkpoint (docs/stability.md, "Cost"): FLOP of the batched products
# of a recurrent model (cuDNN's kind): 3e14 for the paper's GRU (1,575,936 layer parameters)
# and 4e14 for its LSTM (2,101,248), both 1.9e8 a layer parameter (1,024 triplets); a model of
# matmuls (the S4D) is memory-bound: 3,072 Jacobians of 67 MB written and read.
STABILITY_FLOP_PER_PARAMETER = 3e14 / 1_575_936
STABILITY_MATMUL_BYTES = 2 * 3072 * 67e6


def stability_hours(recipe: Recipe, device: GPU,
                    efficiency: dict[str, float] | None = None) -> float:
    """GPU-hours of `perencode stability` over every checkpoint a run keeps: the recurrent
    models' products in fp32 at the matmul efficiency, the S4D at the memory bandwidth."""
    eff = (EFFICIENCY if efficiency is None else efficiency)["matmul"]
    n = recipe.train.iterations // recipe.train.checkpoint_every
    if registry.get("model", recipe.model.arch).tf32 == "cudnn":
        flop = STABILITY_FLOP_PER_PARAMETER * layer_parameters(recipe)
        seconds = flop / (device.fp32 * 1e12 * eff)
    else:
        seconds = STABILITY_MATMUL_BYTES / (device.bandwidth_gbs * 1e9 * eff)
    return n * seconds / 3600


def evaluation_iterations(recipe: Recipe) -> float:
    """A run's held-out scoring in training iterations (a forward pass is a third of one):
    the periodic scoring (held_out_iterations) and the final one over the held-out
    sequences; a language model's: its validation and test splits (WikiText-103's published
    sizes) at each scoring, in batches of the training's sequences."""
    periodic = held_out_iterations(recipe)
    held_out = getattr(recipe.task, "held_out", None)
    if periodic is not None and isinstance(held_out, int):
        return periodic + held_out / recipe.train.batch_size / 3
    every, n = recipe.train.eval_every, recipe.train.iterations
    times = 1 + (0 if every is None else n // every - (n % every == 0))
    scored, _ = scored_outputs(recipe)
    tokens = WIKITEXT103["valid_tokens"] + WIKITEXT103["test_tokens"]
    return times * tokens * PIECES_PER_TOKEN[1] / max(scored, 1.0) / recipe.train.batch_size / 3


# --------------------------------------------------------------------------------------
# Executors: wall time and SLURM jobs of runs of known hours (`plan`, `sweep --dry-run`)
# --------------------------------------------------------------------------------------

def local_wall_hours(hours: list[float], gpus: int, runs_per_gpu: int) -> float:
    """Hours until the last run ends on `gpus` GPUs with `runs_per_gpu` runs sharing each:
    runs sharing a GPU share its throughput (each takes that many times as long), so the
    wall time is the device-hours over the GPUs, never below the longest run's time when
    it shares its GPU."""
    if not hours:
        return 0.0
    sharing = min(runs_per_gpu, math.ceil(len(hours) / gpus))
    return max(sum(hours) / gpus, max(hours) * sharing)


def slurm_jobs(hours: list[float], cfg: SlurmConfig) -> dict[str, Any]:
    """One job per run (the sweep's job array): its size, GPUs and time limit, the runs
    longer than the limit (requeued from their last checkpoint) and the requeues expected,
    the GPU-hours charged, and the wall time with `array_parallelism` jobs at once."""
    usable = cfg.time_min / 60 - cfg.signal_delay_s / 3600  # hours a job trains
    requeues = [max(0, math.ceil(h / usable) - 1) for h in hours]
    parallel = max(1, min(cfg.array_parallelism, len(hours)))
    total = sum(hours)
    return {"jobs": len(hours), "array_size": len(hours), "gpus_per_job": cfg.gpus_per_job,
            "time_limit_min": cfg.time_min, "over_limit": sum(q > 0 for q in requeues),
            "requeues": sum(requeues), "most_requeues": max(requeues, default=0),
            "max_requeues": cfg.max_requeues, "gpu_hours_charged": total * cfg.gpus_per_job,
            "wall_hours": max([total / parallel, *hours]) if hours else 0.0}
