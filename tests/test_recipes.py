"""Every recipe in recipes/: paper settings (docs/paper-facts.md#training-settings), a vanilla twin,
and a tiny 5-iteration training run through the CLI followed by `perencode eval`
(docs/paper-facts.md#metrics)."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, TINY, assert_scores_consistent, fitting
from typer.testing import CliRunner

from perencode.cli import app
from perencode.config.recipe import load_recipe
from perencode.kinds.models.s4d import S4DConfig
from perencode.kinds.tasks.base import HeldOutConfig
from perencode.kinds.tasks.dual_frequency import DualFrequencyConfig

RECIPES = sorted((ROOT / "recipes").glob("*.toml"))
PE_VARIANTS = ("_random_pe", "_learnable_pe", "_double_vanilla")

# Tiny sizes: the recipe's task, model kind and encoding are kept, its width and vocabulary
# shrunk so each run takes well under a second on one CPU core.
TINY_RUN = [*TINY, "train.iterations=5", "train.checkpoint_every=5", "task.vocab_size=16"]


def metrics_of(recipe) -> set[str]:
    task = recipe.task
    if task.name == "predecessor":
        return {"accuracy", "token_accuracy"}
    keys = {"token_accuracy", "sequence_accuracy", "dl_distance"}
    if task.name == "dual_frequency":
        keys |= {"target_accuracy", "by_condition", "by_band"}
    if task.name == "variable_length":
        keys |= {"by_length"}
    return keys


def test_recipes_exist():
    assert len(RECIPES) >= 28


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_has_paper_settings(path):
    r = load_recipe(path)
    assert "Fig. " in r.description and "\n" not in r.description
    assert r.train.iterations == (600_000 if r.task.name == "reverse_add" else 300_000)
    assert (r.train.batch_size, r.model.hidden_size, r.model.embed_size) == (512, 512, 512)
    assert (r.optim.lr, r.optim.warmup, r.optim.clip_norm) == (1e-3, 1000, 1.0)
    assert r.train.checkpoint_every == 5000
    if r.task.name == "lm":  # its own naming and settings: tests/test_lm.py
        return
    assert r.task.length == (16 if r.task.name in ("reverse_add", "predecessor") else 64)
    if r.task.name == "dual_frequency":
        assert isinstance(r.task, DualFrequencyConfig)
        assert (r.task.held_out_per_cell, r.task.rarity) == (16, 0.125)
    else:
        assert isinstance(r.task, HeldOutConfig) and r.task.held_out == 1024
    if r.model.arch == "s4d":
        assert isinstance(r.model, S4DConfig) and r.model.d_state == 64
    if path.stem.endswith("_vanilla") and not path.stem.endswith("_double_vanilla"):
        assert r.encoding.kind == "none"
        twin = load_recipe(path.with_name(path.stem.removesuffix("_vanilla") + ".toml"))
        assert twin.encoding.kind == "sinusoidal"
        assert twin.task == r.task and twin.model == r.model and twin.train == r.train
    elif not path.stem.endswith(PE_VARIANTS):
        assert r.encoding.kind == "sinusoidal"
        assert path.with_name(path.stem + "_vanilla.toml").is_file()


# Language-model recipes need `perencode lm-prepare` data: tests/test_lm.py trains them on
# a toy corpus.
SYNTHETIC = [p for p in RECIPES if load_recipe(p).task.name != "lm"]


@pytest.mark.parametrize("path", SYNTHETIC, ids=lambda p: p.stem)
def test_recipe_trains_and_evaluates(path, tmp_path):
    r = load_recipe(path)
    run_dir = tmp_path / path.stem
    own = ["task.held_out=4"] if "held_out" in type(r.task).model_fields else \
        ["task.held_out_per_cell=1"] if r.task.name == "dual_frequency" else []
    options = [arg for item in fitting([*TINY_RUN, *own], path) for arg in ("--set", item)]
    runner = CliRunner()
    trained = runner.invoke(app, ["train", str(path), *options, "--out", str(run_dir),
                                  "--device", "cpu", "--no-progress"])
    assert trained.exit_code == 0, trained.output
    (run_dir / "eval.json").unlink()
    evaluated = runner.invoke(app, ["eval", str(run_dir), "--device", "cpu"])
    assert evaluated.exit_code == 0, evaluated.output
    result = json.loads((run_dir / "eval.json").read_text())
    assert metrics_of(r) <= set(result)
    assert result["iteration"] == 5 and result["task"] == r.task.name
    assert_scores_consistent(result)
