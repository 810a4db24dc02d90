"""What a run costs, whichever command asks (`sweep --dry-run`/`--estimate`, `doctor`):
disk (exact sizes of the checkpoints kept), compute (a FLOP count per iteration) and
seconds per iteration, measured per shape and cached in a folder's .estimates.json.

Seconds per iteration of a shape not measured on this device are extrapolated from measured
shapes of the same architecture by their FLOP ratio.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import time
from pathlib import Path
from typing import cast

import torch

from perencode import kinds
from perencode.encoding import input_width
from perencode.io import atomic_write_json
from perencode.models import SequenceModel
from perencode.preflight import meta_model, parameter_count
from perencode.recipe import BOOKKEEPING, Recipe
from perencode.tasks import shapes

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
    hook = kinds.get("model", m.arch).flops_per_step
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


def layer_parameters(recipe: Recipe) -> int:
    """Parameters of the model outside its embedding, encoding and head (SequenceModel)."""
    model = cast(SequenceModel, meta_model(recipe))  # every registered model is one
    front = {id(p) for part in (model.embedding, model.encoding, model.head)
             for p in part.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in front)


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

    def put(self, device: str, recipe: Recipe, seconds: float) -> None:
        self.data.setdefault(device, {})[shape_key(recipe)] = {
            "seconds_per_iteration": seconds, "arch": recipe.model.arch,
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


def matmul_rate(device: torch.device, threads: int, n: int = 1024, repeats: int = 4) -> float:
    """FLOP/s of this device on a fp32 [n, n] x [n, n] product (a tenth of a second; no
    training step): the most any training step can run at, so FLOPs / rate is a floor on its
    time. Recurrent steps are small products and run well below it."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(n, n, device=device)
        torch.mm(a, a)  # warm-up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            torch.mm(a, a)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return repeats * 2 * n ** 3 / (time.perf_counter() - t0)
    finally:
        torch.set_num_threads(previous)
