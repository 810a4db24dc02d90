"""The Run object: a run directory and its checkpoint format (claim, start, resume, save, log,
finish, load) on a hand-made model, with the answers known beforehand."""

import json
from pathlib import Path

import pytest
import tomli_w
import torch
from conftest import tiny_recipe

from perencode.common.errors import UserError
from perencode.common.files import CorruptCheckpoint
from perencode.config.recipe import validate
from perencode.store import checkpoints, records, runs
from perencode.store.records import EvalRecord, MetricsRow
from perencode.store.runs import Run
from perencode.training.session import Session, training_generator

CPU = torch.device("cpu")


def _recipe(keep=None, vocab=8, seed=111):
    train = {"iterations": 30, "checkpoint_every": 10, "seed": seed}
    if keep is not None:
        train["keep_checkpoints"] = keep
    return validate(tiny_recipe(task={"vocab_size": vocab, "length": 6, "held_out": 32},
                                model={"arch": "gru", "embed_size": 16},
                                encoding={"kind": "none"}, train=train), "test")


def _session(seed=111):
    """A training session after one step: the run's (seed 111), or another seed's."""
    session = Session(_recipe(seed=seed), CPU)
    session.step()
    return session


def _at(session: Session, iteration: int) -> dict:
    """The session's checkpoint state, as if it were at `iteration`."""
    session.iteration = iteration
    return session.state()


def _resumed(run: Run) -> tuple[Path, dict]:
    """What `run` resumes from, which these tests know it has."""
    found = run.resume()
    assert found is not None
    return found


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_claim_writes_the_recipe_once_and_refuses_another(tmp_path):
    run = Run(tmp_path / "run")
    assert run.claim(_recipe()) is False
    assert runs.read_recipe(run.dir).to_toml() == _recipe().to_toml()
    assert Run(run.dir).claim(_recipe(keep=3)) is True  # retention is not identity
    with pytest.raises(UserError, match=r"task\.vocab_size: 8 there vs 16 now"):
        Run(run.dir).claim(_recipe(vocab=16))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not a perencode run directory"):
        Run(tmp_path / "other").claim(_recipe())


def test_save_then_resume_restores_everything_and_cuts_later_metrics(tmp_path):
    run = Run(tmp_path / "run")
    run.claim(_recipe(keep="all"))
    session = _session()
    for step in (5, 10, 15):
        run.log(MetricsRow(step=step, loss=1.0 / step, seconds=0.1 * step))
    assert run.save(_at(session, 10)) == run.dir / "checkpoints" / "step-10.pt"
    cpu_next = torch.rand(3)
    expected_next = session.batch().sequences

    fresh = _session(seed=222)
    assert not _same(fresh.model.state_dict(), session.model.state_dict())
    torch.rand(7)  # move the CPU RNG on: resume must set it back
    fresh.load(*_resumed(Run(run.dir)))
    assert fresh.iteration == 10
    assert _same(fresh.model.state_dict(), session.model.state_dict())
    assert fresh.optimizer.state_dict()["state"][0]["step"] == 1
    assert torch.equal(fresh.optimizer.state_dict()["state"][0]["exp_avg"],
                       session.optimizer.state_dict()["state"][0]["exp_avg"])
    assert torch.equal(torch.rand(3), cpu_next)
    assert torch.equal(fresh.batch().sequences, expected_next)
    assert [r.step for r in run.metrics()] == [5, 10]  # step 15 is redone


def test_resume_without_a_checkpoint_starts_over(tmp_path):
    run = Run(tmp_path / "run")
    run.claim(_recipe())
    run.log(MetricsRow(step=5, loss=1.0, seconds=0.5))
    assert run.resume() is None
    assert run.metrics() == []


def test_periodic_saves_prune_and_drop_resume_pt(tmp_path):
    run = Run(tmp_path / "run")
    run.claim(_recipe(keep=2))
    session = _session()
    assert run.save(_at(session, 12), interrupted=True) == run.resume_path
    assert run.checkpoints() == []  # resume.pt is not a periodic checkpoint
    for k in (10, 20, 30):
        run.save(_at(session, k))
    assert [k for k, _ in run.checkpoints()] == [20, 30]
    assert not run.resume_path.exists()
    assert run.prune(1) == [run.checkpoint_path(20)]
    assert run.prune(None) == []


def test_resume_pt_later_than_the_last_step_wins(tmp_path):
    run = Run(tmp_path / "run")
    run.claim(_recipe(keep="all"))
    session = _session()
    run.save(_at(session, 10))
    with torch.no_grad():
        session.model.head.weight.add_(1.0)
    run.save(_at(session, 13), interrupted=True)
    fresh = _session(seed=222)
    fresh.load(*_resumed(run))
    assert fresh.iteration == 13
    assert torch.equal(fresh.model.head.weight, session.model.head.weight)


def test_a_corrupt_newest_checkpoint_is_kept_aside_and_the_older_one_used(tmp_path, capsys):
    run = Run(tmp_path / "run")
    run.claim(_recipe(keep="all"))
    session = _session()
    run.save(_at(session, 10))
    run.save(_at(session, 20))
    run.checkpoint_path(20).write_bytes(b"cut short")
    assert _resumed(run)[1]["iteration"] == 10
    assert [k for k, _ in run.checkpoints()] == [10]
    assert (run.checkpoint_dir / "step-20.pt.corrupt").read_bytes() == b"cut short"
    said = capsys.readouterr()
    assert "kept aside as step-20.pt.corrupt, resuming from step-10.pt" in said.out + said.err


def test_checkpoint_format_and_a_version_1_checkpoint_with_a_scheduler_entry(tmp_path):
    run = Run(tmp_path / "run")
    recipe = _recipe()
    run.claim(recipe)
    path = run.save(_at(_session(), 30))
    state = runs.load_checkpoint(path)
    assert sorted(state) == ["device_model", "format", "iteration", "model", "optimizer",
                             "recipe", "rng", "version"]
    assert (state["format"], state["version"], state["iteration"]) == \
        ("perencode-checkpoint", 1, 30)
    assert state["recipe"] == recipe.to_dict()
    # Earlier versions wrote the same entries plus "scheduler": it still loads and resumes.
    torch.save({**state, "scheduler": {"step": 30}}, path)
    assert Run(run.dir).load()[1]["iteration"] == 30
    assert _resumed(Run(run.dir))[1]["iteration"] == 30
    torch.save({**state, "version": 2}, path)
    with pytest.raises(UserError, match="version 2 is not supported"):
        Run(run.dir).load()


def test_load_checks_the_checkpoint_is_this_runs(tmp_path):
    run = Run(tmp_path / "run")
    run.claim(_recipe())
    with pytest.raises(UserError, match="no checkpoints yet"):
        run.load()
    session = Session(run.recipe, CPU)
    path = run.save(_at(session, 30))
    found, state = Run(run.dir).load()
    assert found == path and _same(state["model"], session.model.state_dict())
    other = Run(tmp_path / "other")
    other.claim(_recipe(seed=222))
    (other.checkpoint_dir).mkdir()
    path.replace(other.checkpoint_path(30))
    with pytest.raises(UserError, match="another run.s checkpoint .train.seed: 111 in the "
                                        "checkpoint vs 222 in the run"):
        other.load()
    other.checkpoint_path(30).write_bytes(b"")
    with pytest.raises(CorruptCheckpoint,
                       match="--run-dir .* sets it aside and resumes from the newest readable"):
        other.load()


def test_log_start_finish_and_completeness(tmp_path):
    run = Run(tmp_path / "run")
    recipe = _recipe()
    run.claim(recipe)
    run.start(torch.device("cpu"))
    run.start(torch.device("cpu"))
    run.log(MetricsRow(step=5, loss=2.5, seconds=0.5))
    with open(run.dir / "metrics.jsonl", "a") as f:
        f.write('{"step": 10, "lo')  # a line cut by a kill, and what follows it
        f.write('\n{"step": 15, "loss": 1.0, "seconds": 1.5}\n')
    assert [r.as_dict() for r in run.metrics()] == [
        {"step": 5, "loss": 2.5, "seconds": 0.5, "version": 2},
        {"step": 15, "loss": 1.0, "seconds": 1.5, "version": 2}]  # the second of version 1
    run.save(_at(_session(), 30))
    assert not run.is_complete()
    result = EvalRecord(**records.eval_identity(recipe), token_accuracy=0.5)
    assert run.finish(result) == run.dir / "eval.json"
    assert run.is_complete() and Run(run.dir).is_complete()
    assert json.loads((run.dir / "eval.json").read_text()) == {
        "task": "reverse", "arch": "gru", "encoding": "none", "vocab_size": 8, "seed": 111,
        "token_accuracy": 0.5, "version": 2}
    env = json.loads((run.dir / "env.json").read_text())
    assert env["seed"] == 111 and len(env["starts"]) == 2
    assert env["start_time"] == env["starts"][0]["time"] <= env["end_time"]


def test_each_stream_is_seeded_with_its_own_offset():
    assert len({0, checkpoints.TRAINING_SEED_OFFSET, checkpoints.STABILITY_SEED_OFFSET}) == 3
    generator = training_generator(_recipe(seed=5), CPU)
    assert generator.initial_seed() == 5 + checkpoints.TRAINING_SEED_OFFSET


def test_a_run_written_with_every_kinds_options_is_the_same_run(tmp_path):
    """Before each kind had its own config class, recipe.toml and the checkpoints carried
    every kind's options (a reverse GRU's rarity, held_out_per_cell and d_state). Such a run
    still claims, loads and resumes as the recipe without them; other options do not."""
    run = Run(tmp_path / "run")
    recipe = _recipe()
    run.claim(recipe)
    path = run.save(_at(_session(), 30))
    old = recipe.to_dict()
    old["task"].update(rarity=0.125, held_out_per_cell=16)
    old["model"]["d_state"] = 64
    (run.dir / "recipe.toml").write_text(tomli_w.dumps(old))
    torch.save({**runs.load_checkpoint(path), "recipe": old}, path)
    assert runs.read_recipe(run.dir).to_dict() == recipe.to_dict()
    assert Run(run.dir).claim(_recipe()) is True
    assert Run(run.dir).load()[1]["recipe"] == old
    assert _resumed(Run(run.dir))[1]["iteration"] == 30
    # A user's recipe with another kind's option is a mistake, not a migration.
    with pytest.raises(UserError, match="task.rarity: not an option of task.name = 'reverse'"):
        validate(old, "mine.toml")
