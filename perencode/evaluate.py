"""Score a trained model on its task's held-out data and write eval.json."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from perencode import runs
from perencode.device import resolve_device
from perencode.experiment import build, output_logits
from perencode.io import remove_stale_temps
from perencode.lock import hold
from perencode.recipe import Recipe


@torch.no_grad()
def evaluate_model(model: nn.Module, task, recipe: Recipe, **options) -> dict:
    was_training = model.training
    model.eval()
    try:
        metrics = task.evaluate(lambda batch: output_logits(model, batch),
                                recipe.train.eval_batch_size, **options)
    finally:
        model.train(was_training)
    return {**runs.eval_identity(recipe), **metrics}


def load_run(run_dir: str | Path | runs.Run, device: torch.device,
             checkpoint: str | Path | None = None):
    """(recipe, task, model, iteration) of a run's newest (or the given) checkpoint."""
    run = run_dir if isinstance(run_dir, runs.Run) else runs.Run(run_dir)
    path, state = run.load(checkpoint, map_location=device)
    task, model = build(run.recipe, device)
    runs.restore_model(model, state, path)
    return run.recipe, task, model, state["iteration"]


def evaluate_run(run_dir: str | Path, device: str = "auto",
                 checkpoint: str | Path | None = None, **options) -> tuple[dict, Path]:
    """Evaluate a run; the final model goes to eval.json, another checkpoint to eval-step-K.json.

    The run directory is locked meanwhile (perencode.lock): not beside a `train` of it."""
    run = runs.Run(run_dir)
    dev = resolve_device(device)
    recipe = run.recipe  # not a run: say so before creating the lock file in it
    with hold(run.dir, "eval"):
        remove_stale_temps(run.dir)
        _, task, model, iteration = load_run(run, dev, checkpoint)
        result = evaluate_model(model, task, recipe, **options)
        result["iteration"] = iteration
        final = iteration == recipe.train.iterations
        name = "eval.json" if final else f"eval-step-{iteration}.json"
        path = run.write_eval(result, name)
    return result, path
