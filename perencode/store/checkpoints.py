"""The checkpoint format (version 1), known here alone: what a checkpoint file holds, how it
is read back and how a training session continues from it. perencode.store.runs decides where
checkpoints live in a run directory and which one is read; perencode.training.session packs and
restores its own state through this module.

A checkpoint is one dict: format, version, iteration, the resolved recipe, and the
training session's model, optimizer and random streams (the batch generator's and the CPU
RNG's state) with the device model it was written on. Those of earlier perencode versions
also hold "scheduler" ({"step": iteration}, the iteration again: the learning rate is a
function of it); it is ignored. Loaded with weights_only (`safe_torch_load`).
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from perencode.common.console import console
from perencode.common.device import CPU_MODEL, device_model
from perencode.common.errors import UserError
from perencode.common.files import CorruptCheckpoint, atomic_write_bytes, plain
from perencode.config.recipe import Recipe, differences, migrate_stored, validate

FORMAT = "perencode-checkpoint"
VERSION = 1

# A run's random streams are seeded from train.seed, each with its own offset so that no two
# draw the same numbers: the initial weights and the held-out set take the plain seed
# (perencode.training.session.build, perencode.kinds.tasks.base), the training batches and the
# gradient stability triplets these.
TRAINING_SEED_OFFSET = 1_000_003
STABILITY_SEED_OFFSET = 2_000_003


def atomic_torch_save(path: str | Path, obj: Any) -> None:
    """`obj` saved by torch into `path`, atomically (perencode.common.files)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    atomic_write_bytes(path, buf.getvalue())


def _reason(exc: Exception) -> str:
    """The sentence of torch's load error that says what is wrong with the file (its
    weights-only errors open with advice on loading unsafely, in bold)."""
    text = plain(str(exc))
    _, found, after = text.partition("WeightsUnpickler error:")
    lines = [line.strip() for line in (after if found else text).splitlines() if line.strip()]
    return lines[0].split(". ")[0].rstrip(".") if lines else type(exc).__name__


def safe_torch_load(path: str | Path, kind: str, map_location: str | torch.device = "cpu") -> dict:
    """Load a checkpoint without unpickling arbitrary objects.

    `kind` is the expected `format` tag of the dict (e.g. "perencode-checkpoint"); a file
    that is truncated, corrupted, not a dict or of another kind raises UserError.
    """
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: checkpoint file not found")
    try:
        with warnings.catch_warnings():  # e.g. a foreign pickle protocol: the error says it
            warnings.simplefilter("ignore")
            obj = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to parse means a bad file
        first = _reason(exc)
        raise CorruptCheckpoint(
            f"{path}: not a readable perencode checkpoint (corrupted, truncated or foreign: "
            f"{first[:160]})"
        ) from None
    if not isinstance(obj, dict) or obj.get("format") != kind:
        raise UserError(f"{path}: foreign checkpoint (expected format '{kind}')")
    return obj


def session_state(iteration: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  generator: torch.Generator, device: torch.device) -> dict[str, Any]:
    """What a checkpoint holds of a training session (`whole` adds the format, version and
    recipe): iteration, model, optimizer and the random streams."""
    return {"iteration": iteration, "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            # Batches come from the generator alone (no dropout): its state and the CPU
            # RNG are all a resumed run needs to continue bit-identically.
            "rng": {"generator": generator.get_state(), "torch": torch.get_rng_state()},
            # CUDA's generator spreads a large draw over the GPU's multiprocessors: the
            # same state draws other numbers on another GPU model (`restore` says so).
            "device_model": device_model(device)}


def whole(state: dict[str, Any], recipe: Recipe) -> dict[str, Any]:
    """The checkpoint file's dict of a session's `state` in the run of `recipe`."""
    return {"format": FORMAT, "version": VERSION, "iteration": state["iteration"],
            "recipe": recipe.to_dict(), **state}


def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """A checkpoint's state, its format and version checked (perencode.store.runs.Run.load also
    checks that it is the run's: `foreign_reason`)."""
    state = safe_torch_load(path, FORMAT, map_location)
    if state.get("version") != VERSION:
        raise UserError(f"{path}: checkpoint format version {state.get('version')} is not "
                        f"supported (this perencode reads version {VERSION})")
    for key in ("iteration", "model", "recipe"):
        if key not in state:
            raise CorruptCheckpoint(f"{path}: checkpoint lacks '{key}' (corrupted or foreign)")
    return state


def foreign_reason(state: dict, recipe: Recipe, path: str | Path) -> str | None:
    """Why checkpoint `state` (read from `path`) is not a checkpoint of `recipe`'s run, or
    None when it is: the one test resume, eval and stability apply. Its recipe's identity
    (every field that defines the run, the seed included) must equal the run's."""
    try:
        theirs = validate(migrate_stored(state["recipe"]), str(path), any_kind=True).identity()
    except UserError:
        return "its recipe is unreadable"
    diff = differences(theirs, recipe.identity(), names=("in the checkpoint", "in the run"))
    if not diff:
        return None
    return f"it is another run's checkpoint ({diff[0]}{'; ...' if len(diff) > 1 else ''})"


def restore_model(model: torch.nn.Module, state: dict, path: str | Path) -> None:
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise UserError(f"{path}: checkpoint does not fit this run's model ({first[:160]})") \
            from None


def restore(state: dict, path: str | Path, model: torch.nn.Module,
            optimizer: torch.optim.Optimizer, generator: torch.Generator,
            device: torch.device) -> int:
    """Continue a session from checkpoint `state` (read from `path`), wherever its tensors
    were mapped to: the model's weights and Adam's moments go to the model's device, Adam's
    `step` counters to the CPU (`cpu_step_counters`); the random streams as they were.
    Returns the checkpoint's iteration."""
    restore_model(model, state, path)
    optimizer.load_state_dict(cpu_step_counters(state["optimizer"]))
    iteration = state["iteration"]
    restore_generator(generator, state["rng"]["generator"], iteration, path)
    torch.set_rng_state(state["rng"]["torch"].cpu())
    saved, here = state.get("device_model"), device_model(device)
    # From the CPU the stream starts anew: restore_generator has said so.
    if device.type == "cuda" and saved not in (None, here, CPU_MODEL):
        console.print(f"[yellow]note:[/] {path}: written on {saved}, resumed on {here}: "
                      "CUDA draws a batch's random numbers by the GPU's multiprocessor "
                      f"count, so the batches after iteration {iteration} differ "
                      "from an uninterrupted run's there", highlight=False, soft_wrap=True)
    return iteration


def restore_generator(generator: torch.Generator, saved: Tensor, iteration: int,
                      path: str | Path) -> None:
    """The batch stream as the checkpoint left it; or, for a checkpoint written on another
    device type (the CPU's generator is a Mersenne Twister, CUDA's a Philox counter: their
    states do not fit each other), a new stream from the run's seed and the iteration,
    reproducible but not the batches an uninterrupted run would have drawn (one line says
    so)."""
    saved = saved.cpu()
    if saved.numel() == generator.get_state().numel():
        generator.set_state(saved)
        return
    generator.manual_seed(generator.initial_seed() + iteration)
    console.print(f"[yellow]note:[/] {path}: written on another device type; the training "
                  f"batches after iteration {iteration} come from a new stream seeded from "
                  "the run's seed and that iteration", highlight=False, soft_wrap=True)


def cpu_step_counters(saved: dict) -> dict:
    """An optimizer state dict with its `step` counters on the CPU, as a fresh Adam keeps
    them, whatever device the checkpoint was mapped to. torch's load_state_dict leaves a
    non-capturable, non-fused optimizer's `step` where it finds it (and moves a capturable
    or fused one's to its parameter itself): a CUDA `step` is then read back by the host
    for every parameter at every step, a host-device sync each."""
    state = {}
    for key, value in saved["state"].items():
        step = value.get("step")
        if isinstance(step, Tensor) and step.device.type != "cpu":
            value = {**value, "step": step.to("cpu")}
        state[key] = value
    return {**saved, "state": state}
