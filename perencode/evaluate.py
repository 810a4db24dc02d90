"""Score a trained model on its task's held-out data and write eval.json."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from perencode import runs
from perencode.device import resolve_device
from perencode.errors import UserError
from perencode.experiment import build, output_logits
from perencode.io import CorruptCheckpoint, atomic_write_json, remove_stale_temps
from perencode.lock import hold
from perencode.recipe import Recipe, identity


@torch.no_grad()
def evaluate_model(model: nn.Module, task, recipe: Recipe, **options) -> dict:
    was_training = model.training
    model.eval()
    try:
        metrics = task.evaluate(lambda batch: output_logits(model, batch),
                                recipe.train.eval_batch_size, **options)
    finally:
        model.train(was_training)
    return {"task": recipe.task.name, "arch": recipe.model.arch,
            "encoding": recipe.encoding.kind, "vocab_size": recipe.task.vocab_size,
            "seed": recipe.train.seed, **metrics}


def write_eval(run_dir: Path, result: dict, name: str = "eval.json") -> Path:
    path = Path(run_dir) / name
    atomic_write_json(path, result)
    return path


def load_run(run_dir: str | Path, device: torch.device, checkpoint: str | Path | None = None):
    """(recipe, task, model, iteration) of a run's newest (or the given) checkpoint."""
    run_dir = Path(run_dir)
    recipe = runs.read_recipe(run_dir)
    newest = checkpoint is None
    if newest:
        steps = runs.list_checkpoints(run_dir)
        if not steps:
            raise UserError(f"{run_dir}: no checkpoints yet (train it first)")
        checkpoint = steps[-1][1]
    try:
        state = runs.load_checkpoint(checkpoint, map_location=device)
    except CorruptCheckpoint as exc:
        if not newest:
            raise
        raise CorruptCheckpoint(f"{exc}; score an older one with --checkpoint, or run "
                                f"`perencode train` on the run again: it resumes from the "
                                f"newest readable checkpoint") from None
    if identity(state["recipe"]) != recipe.identity():
        raise UserError(f"{checkpoint}: checkpoint belongs to another recipe than "
                        f"{run_dir / 'recipe.toml'}")
    task, model = build(recipe, device)
    runs.restore_model(model, state, checkpoint)
    return recipe, task, model, state["iteration"]


def evaluate_run(run_dir: str | Path, device: str = "auto",
                 checkpoint: str | Path | None = None, **options) -> tuple[dict, Path]:
    """Evaluate a run; the final model goes to eval.json, another checkpoint to eval-step-K.json.

    The run directory is locked meanwhile (perencode.lock): not beside a `train` of it."""
    run_dir = Path(run_dir)
    dev = resolve_device(device)
    runs.read_recipe(run_dir)  # not a run: say so before creating the lock file in it
    with hold(run_dir, "eval"):
        remove_stale_temps(run_dir)
        recipe, task, model, iteration = load_run(run_dir, dev, checkpoint)
        result = evaluate_model(model, task, recipe, **options)
        result["iteration"] = iteration
        final = iteration == recipe.train.iterations
        name = "eval.json" if final else f"eval-step-{iteration}.json"
        path = write_eval(run_dir, result, name)
    return result, path
