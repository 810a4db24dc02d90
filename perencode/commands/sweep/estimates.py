"""What a grid costs: disk, compute and device-hours of each of its runs
(perencode.training.planning), measured per shape by `sweep --estimate` and cached, so that
`sweep --dry-run` prints them at once without running a training step.

Device-hours of a shape not measured on this device are extrapolated from measured shapes
of the same architecture by their FLOP ratio, and marked `~`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
from pathlib import Path

import torch
from rich.table import Table

from perencode.commands.sweep.cells import FINISHED, PlannedRun, RunState
from perencode.commands.sweep.child import thread_env
from perencode.commands.sweep.options import Executor
from perencode.common.console import console, print_table
from perencode.common.device import resolve_device
from perencode.common.files import atomic_write_text
from perencode.common.host import available_cores
from perencode.common.processes import perencode_command
from perencode.training.planning import (
    GPUS,
    Estimates,
    Work,
    checkpoint_bytes,
    checkpoints_on_disk,
    device_label,
    flops_per_iteration,
    held_out_iterations,
    modelled_seconds,
    shape_key,
    work,
)

ESTIMATE_REPEATS = 3  # bench children a shape is timed in, the median cached


def _device(device: str, jobs: int) -> tuple[torch.device, int, str]:
    """The device runs use, their torch threads (the CPU cores shared by --jobs runs), and
    the label its measurements are cached under."""
    dev = resolve_device(device)
    threads = max(1, available_cores() // jobs) if dev.type == "cpu" else torch.get_num_threads()
    return dev, threads, device_label(dev, threads)


def measure(planned: list[PlannedRun], out: Path, device: str, jobs: int,
            handed: list[str] | None = None) -> None:
    """`--estimate`: time 3 iterations (after 1 warm-up) of every shape not yet cached,
    ESTIMATE_REPEATS times, each by `perencode bench` in a child started as the sweep's
    workers are (their threads, the plugins `handed`): the sweep runs training only in
    children, never in its own process."""
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
            times = []
            for _ in range(ESTIMATE_REPEATS):
                done = subprocess.run([*perencode_command(), "bench", str(recipe),
                                       "--iterations", "3", "--warmup", "1", "--device", device],
                                      capture_output=True, text=True,
                                      env=thread_env(threads, handed=handed))
                lines = done.stdout.strip().splitlines()
                if done.returncode != 0 or not lines:
                    last = (done.stdout.strip() or done.stderr.strip() or "failed"
                            ).splitlines()[-1]
                    console.print(f"  not measured: {last[:100]}", highlight=False)
                    break
                times.append(json.loads(lines[-1])["seconds_per_iteration"])  # its last line
            else:
                # The median of the repeats, with their spread: one timing on a shared
                # machine varied 20-fold, and a cached figure is reused by every dry run.
                cache.put(label, run.cell.recipe, statistics.median(times),
                          spread=(min(times), max(times)))


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


def print_plan(grid, planned: list[PlannedRun], out: Path, device: str, jobs: int,
               executor: Executor) -> dict:
    """`sweep --dry-run`: the run table with each run's disk and device-hours, then the
    totals and how `executor` would run them. Instant: sizes are counted on the meta device,
    times come from the cache (else modelled for the paper's GPU)."""
    _, _, label = _device(device, jobs)
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
        # Modelled for the paper's GPU, not timed here: a login node's CPU says nothing of
        # the GPUs the jobs get, and a rate measured on a shared machine is noise.
        paper_gpu = GPUS["a100"]
        works: dict[str, Work] = {}
        modelled = 0.0
        for run in planned:
            if run.state != RunState.REUSE:
                key = shape_key(run.cell.recipe)
                works.setdefault(key, work(run.cell.recipe))
                modelled += modelled_seconds(works[key], paper_gpu,
                                             run.cell.recipe.train.precision
                                             ) * run.iterations / 3600
        totals["modelled_a100_hours"] = modelled
        per_run = [modelled_seconds(works[shape_key(r.cell.recipe)], paper_gpu,
                                    r.cell.recipe.train.precision) * r.iterations / 3600
                   for r in planned if r.state != RunState.REUSE]
        model = (f"on {paper_gpu.name}, the paper's GPU: {_hours(modelled)} modelled from "
                 f"the FLOPs (`perencode plan {grid.path} --gpu NAME`: another GPU, the SLURM "
                 "jobs, the claims)")
        if executor.name == "slurm":  # this machine's CPU says nothing of the jobs' GPUs
            said = (f"device time: {model}; measured on the cluster's GPUs by `sweep "
                    f"--estimate` (or `perencode doctor`) on a GPU node with --runs {out}")
        else:
            said = (f"device time on {label}: not measured yet (`--estimate` times "
                    f"{len(sizes)} shape(s), {ESTIMATE_REPEATS} x 3 iterations each, and "
                    f"caches the median in {cache.path}); {model}")
        console.print(said,
                      highlight=False)
    else:
        per_run = []
        for run in planned:
            seconds, _ = cache.seconds(label, run.cell.recipe)
            if run.state != RunState.REUSE and seconds is not None:
                per_run.append(run.iterations * seconds / 3600)
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
    console.print(executor.timing(per_run), highlight=False, soft_wrap=True)
    for line in executor.submission(planned):
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    return totals
