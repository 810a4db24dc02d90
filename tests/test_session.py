"""perencode.session: the one owner of the training step (the schedule it applies, its
checkpoint state round trip, the scoring `eval` and `train` share), and no other module
assembling a step of its own."""

from __future__ import annotations

import ast

import torch
from conftest import ROOT, TINY, fitting

from perencode import runs
from perencode.recipe import load_recipe
from perencode.session import Session, learning_rate
from perencode.train import train

CPU = torch.device("cpu")


def tiny_recipe(*extra: str):
    return load_recipe(ROOT / "recipes/gru_vocab256.toml", fitting([
        *TINY, "task.vocab_size=8", "task.length=4", "train.iterations=6",
        "train.checkpoint_every=3", "optim.warmup=2", *extra]))


def test_each_step_runs_at_the_schedules_rate_and_counts_itself():
    recipe = tiny_recipe()
    session = Session(recipe, CPU)
    rates = []
    for k in range(1, 5):
        step = session.step(count_hits=k % 2 == 0)
        rates.append(step.lr)
        assert session.iteration == k
        assert step.lr == learning_rate(k - 1, recipe.optim, recipe.train.iterations)
        assert session.optimizer.param_groups[0]["lr"] == step.lr
        assert (step.hits is not None) == (k % 2 == 0)
        assert step.norm is not None and bool(torch.isfinite(step.loss))
    # Warm-up 2: iteration 1 at 0, the peak first at iteration 3, then the cosine's descent.
    assert rates[0] == 0.0 and rates[2] == recipe.optim.lr and 0 < rates[3] < rates[2]


def test_a_session_loaded_from_its_state_goes_on_bit_identically(tmp_path):
    """state() survives a weights_only load; a new session of the recipe that loads it
    takes the same next steps (batches, losses, weights) as the one that wrote it."""
    recipe = tiny_recipe()
    first = Session(recipe, CPU)
    for _ in range(3):
        first.step()
    path = tmp_path / "state.pt"
    torch.save(first.state(), path)
    state = torch.load(path, weights_only=True)
    second = Session(recipe, CPU)  # at iteration 0: other weights, an earlier stream
    assert not torch.equal(second.model.head.weight, first.model.head.weight)
    second.load(path, state)
    assert second.iteration == 3
    for _ in range(2):
        a, b = first.step(), second.step()
        assert a.lr == b.lr and torch.equal(a.batch.sequences, b.batch.sequences)
        assert torch.equal(a.loss, b.loss)
    for (name, p), q in zip(first.model.named_parameters(), second.model.parameters()):
        assert torch.equal(p, q), name


def test_a_run_scored_from_its_checkpoint_is_what_train_wrote(tmp_path):
    recipe = tiny_recipe()
    written = train(recipe, tmp_path / "run", device="cpu", progress=False)
    session = Session.of_run(runs.Run(tmp_path / "run"), CPU)
    assert session.iteration == recipe.train.iterations
    assert {**session.evaluate(), "iteration": session.iteration} == written


def test_no_module_but_the_session_assembles_a_step():
    """Models, optimizers and steps come from a Session everywhere else: nothing outside
    perencode/session.py calls the step or the (task, model) builder itself."""
    own = {"train_step", "build"}
    offenders = []
    for path in sorted((ROOT / "perencode").rglob("*.py")):
        if path.name == "session.py" and path.parent.name == "perencode":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "perencode.session":
                offenders += [f"{path.name}: {a.name}" for a in node.names if a.name in own]
            if isinstance(node, ast.Attribute) and node.attr in own and \
                    isinstance(node.value, ast.Name) and node.value.id == "session":
                offenders.append(f"{path.name}: session.{node.attr}")
    assert offenders == []
