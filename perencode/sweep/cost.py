"""What a grid costs: disk (exact sizes of the checkpoints kept), compute (a FLOP count per
iteration) and device-hours, measured per shape by `sweep --estimate` and cached, so that
`sweep --dry-run` prints them at once without running a training step.

Device-hours of a shape not measured on this device are extrapolated from measured shapes
of the same architecture by their FLOP ratio, and marked `~`.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import cast

import torch
from rich.table import Table

from perencode import kinds
from perencode.console import console, print_table
from perencode.device import available_cores, resolve_device
from perencode.encoding import input_width
from perencode.io import atomic_write_json, atomic_write_text
from perencode.models import SequenceModel
from perencode.preflight import meta_model, parameter_count
from perencode.recipe import BOOKKEEPING, Recipe
from perencode.sweep.local import perencode_command, thread_env
from perencode.sweep.plan import FINISHED, PlannedRun, RunState
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


def _device(device: str, jobs: int) -> tuple[torch.device, int, str]:
    """The device runs use, their torch threads (the CPU cores shared by --jobs runs), and
    the label its measurements are cached under."""
    dev = resolve_device(device)
    threads = max(1, available_cores() // jobs) if dev.type == "cpu" else torch.get_num_threads()
    return dev, threads, device_label(dev, threads)


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


def measure(planned: list[PlannedRun], out: Path, device: str, jobs: int,
            handed: list[str] | None = None) -> None:
    """`--estimate`: time 3 iterations (after 1 warm-up) of every shape not yet cached, each
    by `perencode bench` in a child started as the sweep's workers are (their threads, the
    plugins `handed`): the sweep runs training only in children, never in its own process."""
    _, threads, label = _device(device, jobs)
    cache = Estimates(out)
    shapes = {shape_key(r.cell.recipe): r for r in planned}
    with tempfile.TemporaryDirectory(prefix="perencode-estimate-") as scratch:
        for i, run in enumerate(shapes.values()):
            if cache.get(label, run.cell.recipe) is not None:
                continue
            console.print(f"estimate {i + 1}/{len(shapes)}: {run.cell.name} on {label}",
                          highlight=False)
            recipe = Path(scratch) / f"shape-{i}.toml"
            atomic_write_text(recipe, run.cell.recipe.to_toml())
            done = subprocess.run([*perencode_command(), "bench", str(recipe), "--iterations",
                                   "3", "--warmup", "1", "--device", device],
                                  capture_output=True, text=True,
                                  env=thread_env(threads, handed=handed))
            lines = done.stdout.strip().splitlines()
            if done.returncode != 0 or not lines:
                last = (done.stdout.strip() or done.stderr.strip() or "failed").splitlines()[-1]
                console.print(f"  not measured: {last[:100]}", highlight=False)
                continue
            seconds = json.loads(lines[-1])["seconds_per_iteration"]  # bench's last line
            cache.put(label, run.cell.recipe, seconds)


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


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def _hours(hours: float) -> str:
    """Device time with its unit, to three significant figures (tiny grids take seconds)."""
    seconds = hours * 3600
    if seconds < 60:
        return f"{seconds:.2g} s"
    if seconds < 3600:
        return f"{seconds / 60:.3g} min"
    return f"{hours:,.0f} h" if hours >= 100 else f"{hours:.3g} h"


def _flop(n: float) -> str:
    """A FLOP count in the largest SI unit under it, three significant figures."""
    for unit, scale in (("EFLOP", 1e18), ("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9),
                        ("MFLOP", 1e6)):
        if n >= scale:
            return f"{n / scale:,.3g} {unit}" if n < 1000 * scale else f"{n / scale:,.0f} {unit}"
    return f"{n:,.0f} FLOP"


def _print_held_out(planned: list[PlannedRun], cache: Estimates, label: str, flop: float,
                    totals: dict) -> None:
    """The cost of the runs' periodic held-out scoring (train.eval_every), one line, added to
    the totals' device time."""
    scored = [r for r in planned if r.cell.recipe.train.eval_every is not None
              and r.state != RunState.REUSE]
    if not scored:
        return
    counted = [(r, held_out_iterations(r.cell.recipe)) for r in scored]
    known = [(r, i) for r, i in counted if i is not None]
    extra = sum(flops_per_iteration(r.cell.recipe) * i for r, i in known)
    hours = 0.0
    for run, iters in known:
        seconds, _ = cache.seconds(label, run.cell.recipe)
        hours += (seconds or 0.0) * iters / 3600
    totals["held_out_pflop"], totals["held_out_hours"] = extra / 1e15, hours
    totals["hours"] += hours
    every = ", ".join(sorted({str(r.cell.recipe.train.eval_every) for r in scored}))
    timed = f", {_hours(hours)} of device time (in the total below)" if hours else ""
    unknown = len(counted) - len(known)
    console.print(f"held-out scoring every {every} iterations (train.eval_every) in "
                  f"{len(scored)} run(s): {_flop(extra)} ({100 * extra / max(flop, 1):.2g}% "
                  f"of the training){timed}"
                  + (f"; {unknown} run(s) of a task without a held-out count not estimated"
                     if unknown else ""), highlight=False)


def print_plan(grid, planned: list[PlannedRun], out: Path, device: str, jobs: int) -> dict:
    """`sweep --dry-run`: the run table with each run's disk and device-hours, then the
    totals. Instant: sizes are counted on the meta device, times come from the cache."""
    dev, threads, label = _device(device, jobs)
    cache = Estimates(out)
    table = Table(title=f"{grid.path}: {len(planned)} runs -> {out / grid.name}")
    for col in ("run", "state", "to run", "disk", "device time"):
        table.add_column(col, justify="left" if col in ("run", "state") else "right",
                         no_wrap=col != "run", overflow="fold")
    totals = {"runs": len(planned), "to_train": 0, "disk_bytes": 0, "hours": 0.0,
              "remaining_hours": 0.0, "unknown": 0, "extrapolated": 0}
    sizes: dict[str, int] = {}
    for run in planned:
        recipe = run.cell.recipe
        key = shape_key(recipe)
        if key not in sizes:
            sizes[key] = checkpoint_bytes(recipe)
        linked = run.state == RunState.REUSE
        disk = 0 if linked else sizes[key] * checkpoints_on_disk(recipe)
        # never trained on (a conflict's directory holds another recipe's run)
        stopped = run.state in (*FINISHED, RunState.DIVERGED, RunState.CONFLICT)
        todo = 0 if stopped or linked else run.iterations - run.step
        totals["to_train"] += todo > 0
        totals["disk_bytes"] += disk
        seconds, measured = cache.seconds(label, recipe)
        if seconds is None:
            totals["unknown"] += 1
            hours_text = "?"
        else:
            hours = 0 if linked else run.iterations * seconds / 3600
            totals["hours"] += hours
            totals["remaining_hours"] += todo * seconds / 3600
            totals["extrapolated"] += not measured
            hours_text = ("" if measured else "~") + _hours(hours)
        table.add_row(run.cell.name, str(run.state), f"{todo}/{run.iterations}",
                      "linked" if linked else _gb(disk), hours_text)
    print_table(table)
    for run in planned:
        if run.message and run.state not in (RunState.REUSE,):
            console.print(f"{run.cell.name}: {run.message}", highlight=False, soft_wrap=True)
    states = ", ".join(f"{sum(r.state == s for r in planned)} {s}" for s in RunState
                       if any(r.state == s for r in planned))
    flop = sum(flops_per_iteration(r.cell.recipe) * r.iterations for r in planned
               if r.state != RunState.REUSE)
    totals["pflop"] = flop / 1e15
    console.print(f"{len(planned)} runs ({states}); {totals['to_train']} to train; "
                  f"{_flop(flop)} of training (forward and backward)", highlight=False)
    _print_held_out(planned, cache, label, flop, totals)
    console.print(f"disk: {_gb(totals['disk_bytes'])} of checkpoints once finished "
                  f"({len(sizes)} shape(s); checkpoints kept per run: train.keep_checkpoints)",
                  highlight=False)
    if totals["unknown"] == len(planned):
        rate = matmul_rate(dev, threads)
        floor = flop / rate / 3600
        totals["floor_hours"] = floor
        console.print(f"device time on {label}: not measured yet; at least {_hours(floor)} "
                      f"(the FLOPs at this device's matmul rate, {rate / 1e12:.3g} TFLOP/s: "
                      f"recurrent steps run well below it). `--estimate` times "
                      f"{len(sizes)} shape(s) (3 iterations each) and caches them in "
                      f"{cache.path}", highlight=False)
    else:
        notes = []
        if totals["extrapolated"]:
            notes.append(f"{totals['extrapolated']} run(s) extrapolated by FLOPs (~)")
        if totals["unknown"]:
            notes.append(f"{totals['unknown']} run(s) unknown (?): `--estimate` measures them")
        console.print(f"device time on {label}: {_hours(totals['hours'])} in all, "
                      f"{_hours(totals['remaining_hours'])} still to run (about "
                      f"{_hours(totals['remaining_hours'] / jobs)} wall-clock with --jobs "
                      f"{jobs}){'; ' + '; '.join(notes) if notes else ''}. Analyses "
                      f"({', '.join(grid.sweep.after) or 'none'}) are not included.",
                      highlight=False)
    return totals
