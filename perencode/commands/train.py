"""`perencode train`: which run directory a recipe trains in (a new one, or the run whose
recipe.toml was given), and the training loop (perencode.training.loop) run there."""

from __future__ import annotations

from pathlib import Path

import torch

from perencode.common import defaults
from perencode.common.console import console
from perencode.config.recipe import Recipe
from perencode.store import runs
from perencode.training.loop import train


def run_dir_of(recipe_path: Path, recipe: Recipe, run_dir: Path | None) -> Path:
    """The run directory `train RECIPE [--run-dir DIR]` trains: DIR; the run itself when
    RECIPE is a run's own recipe.toml (said in a note); else the default under the runs
    root, named after the recipe and its seed."""
    if run_dir is None and runs.holds_run(recipe_path):
        # `train RUN_DIR/recipe.toml`: that run, resumed or reported, not a new one
        run_dir = recipe_path.parent
        console.print(f"note: {recipe_path} is the recipe of the run {run_dir}: training that "
                      "run (--run-dir DIR trains a new one elsewhere)", highlight=False,
                      soft_wrap=True)
    return run_dir if run_dir is not None else runs.default_run_dir(recipe_path,
                                                                    recipe.train.seed)


def train_recipe(recipe_path: Path, recipe: Recipe, run_dir: Path | None,
                 device: str | torch.device = defaults.DEVICE, **options) -> \
        tuple[dict, Path, bool]:
    """Train `recipe` (read from `recipe_path`) in its run directory (`run_dir_of`);
    `options` are the loop's (perencode.training.loop.train). Returns the eval.json dict,
    the run directory, and whether the run was complete before (then nothing was trained).
    The loop's Interrupted and Diverged pass through, for the CLI's exit status."""
    run_dir = run_dir_of(recipe_path, recipe, run_dir)
    already = run_dir.is_dir() and runs.Run(run_dir).is_complete()
    return train(recipe, run_dir, device, **options), run_dir, already
