"""perencode.store.records: each run record written and read back unchanged, each record of an
earlier perencode read as the current one (its one migration), the gradient norm in a real
training's metrics.jsonl, and `Run.open` the one way a writing command opens a run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import one_line, run_cli, tiny_recipe

from perencode.common.errors import UserError
from perencode.config.recipe import validate
from perencode.store import identity, records, runs
from perencode.store.lock import hold
from perencode.store.records import EvalRecord, MetricsRow, StatusRecord
from perencode.training.loop import train
from perencode.training.session import Session

CPU = torch.device("cpu")


def _recipe(**tables: dict):
    return validate(tiny_recipe(**tables), "test")


def _claimed(tmp_path: Path, **tables: dict) -> runs.Run:
    run = runs.Run(tmp_path / "run")
    run.claim(_recipe(**tables))
    return run


def _old_json(path: Path, data: dict) -> None:
    """A record as earlier perencode versions wrote it
    (perencode.common.files.atomic_write_json)."""
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


# -- Round trips --------------------------------------------------------------------------

def test_a_metrics_row_is_read_back_as_written(tmp_path):
    run = _claimed(tmp_path)
    row = MetricsRow(step=5, loss=2.25, accuracy=0.5, lr=1e-3, grad_norm=0.75, seconds=1.5,
                     held_out_token_accuracy=0.25)
    run.log(row)
    assert run.metrics() == [row]
    assert row.held_out() == {"held_out_token_accuracy": 0.25}
    assert json.loads((run.dir / "metrics.jsonl").read_text()) == {
        "step": 5, "loss": 2.25, "accuracy": 0.5, "lr": 1e-3, "grad_norm": 0.75,
        "seconds": 1.5, "held_out_token_accuracy": 0.25, "version": 2}


def test_eval_json_is_read_back_as_written_in_the_tasks_order(tmp_path):
    run = _claimed(tmp_path)
    scores = {"token_accuracy": 0.5, "by_length": [{"length": 4, "accuracy": 0.5}],
              "n_tokens": 64}
    record = EvalRecord.of(run.recipe, scores, 10, ["the code of x changed"])
    path = run.write_eval(record)
    assert records.read_eval(path) == record
    written = json.loads(path.read_text())
    assert list(written) == ["task", "arch", "encoding", "vocab_size", "seed", "token_accuracy",
                             "by_length", "n_tokens", "iteration", "code_changes_accepted",
                             "version"]
    assert record.result() == {k: v for k, v in written.items() if k != "version"}
    assert record.scores() == scores


def test_status_json_is_read_back_as_written(tmp_path):
    run = _claimed(tmp_path)
    run.record_status("diverged", iteration=3, reason="loss is nan", checkpoint=None)
    status = run.status()
    assert status == records.read_status(run.status_path)
    assert (status.state, status.iteration, status.reason, status.version) == \
        ("diverged", 3, "loss is nan", 2)
    assert set(json.loads(run.status_path.read_text())) == {"version", "state", "iteration",
                                                             "reason", "time"}


def test_identity_json_is_read_back_as_written(tmp_path):
    run = _claimed(tmp_path)  # claim writes identity.json
    entry = identity.read(run.dir)
    assert entry is not None and entry.version == 2 and entry.modules
    assert json.loads((run.dir / "identity.json").read_text()) == entry.as_dict()
    assert identity.record(tmp_path / "again", run.recipe).recipe == entry.recipe


# -- Migrations: files as earlier perencode versions wrote them ------------------------------

def test_an_earlier_eval_json_is_read_as_the_current_record(tmp_path):
    run = _claimed(tmp_path)
    earlier = {**records.eval_identity(run.recipe), "token_accuracy": 0.5, "iteration": 10}
    _old_json(run.dir / "eval.json", earlier)  # no version: before records carried one
    record = records.read_eval(run.dir / "eval.json")
    assert record.version == 2 and record.iteration == 10 and record.result() == earlier
    # the earliest perencode wrote no iteration: read as None, and judged by its checkpoint
    _old_json(run.dir / "eval.json", {k: v for k, v in earlier.items() if k != "iteration"})
    assert records.read_eval(run.dir / "eval.json").iteration is None
    run.checkpoint_dir.mkdir()
    run.checkpoint_path(10).write_bytes(b"")
    assert run.status().state == "finished" and run.status().inferred


def test_an_eval_json_of_a_newer_or_damaged_format_is_one_line(tmp_path):
    path = tmp_path / "eval.json"
    _old_json(path, {"token_accuracy": 0.5, "iteration": 10, "version": 99})
    with pytest.raises(UserError, match=r"eval.json format version 99 is not supported"):
        records.read_eval(path)
    _old_json(path, {"token_accuracy": "high", "iteration": 10})
    with pytest.raises(UserError, match=r"'token_accuracy' is 'high', not a number"):
        records.read_eval(path)


def test_an_earlier_status_json_is_read_as_the_current_record(tmp_path):
    run = _claimed(tmp_path)
    _old_json(run.dir / "eval.json", {**records.eval_identity(run.recipe), "iteration": 10})
    earlier = {"state": "finished", "iteration": 10, "eval_sha256": "ab" * 32,
               "time": "2026-01-01T00:00:00+00:00"}
    _old_json(run.status_path, earlier)
    status = run.status()
    assert status == StatusRecord(**earlier)  # version 2, nothing else changed
    assert status.as_dict() == {"version": 2, **earlier}


def test_an_earlier_identity_json_without_modules_is_read_as_the_current_record(tmp_path):
    run = _claimed(tmp_path)
    current = json.loads((run.dir / "identity.json").read_text())
    earlier = {k: v for k, v in current.items() if k != "modules"} | {"version": 1}
    _old_json(run.dir / "identity.json", earlier)
    entry = identity.read(run.dir)
    assert entry is not None and entry.version == 2 and entry.modules is None
    assert entry.fingerprint == current["fingerprint"]
    # only its kinds' code is compared (version 1 recorded no modules): none changed
    assert identity.code_changes(entry, run.recipe) == []
    assert identity.check(run.dir, run.recipe, "eval") == []
    _old_json(run.dir / "identity.json", {**earlier, "format": "something-else"})
    with pytest.raises(UserError, match="not a perencode run identity"):
        identity.read(run.dir)


def test_an_earlier_metrics_row_is_read_as_the_current_record_and_rewritten(tmp_path):
    run = _claimed(tmp_path)
    earlier = [{"step": 5, "loss": 2.0, "accuracy": 0.25, "lr": 1e-3, "seconds": 0.5},
               {"step": 10, "loss": 1.0, "accuracy": 0.5, "lr": 1e-3, "seconds": 1.0}]
    (run.dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in earlier))
    rows = run.metrics()
    assert [r.as_dict() for r in rows] == [{**r, "version": 2} for r in earlier]
    assert all(r.grad_norm is None for r in rows)
    run.truncate_metrics(5)  # a resume rewrites what it keeps in the current format
    assert [json.loads(line) for line in (run.dir / "metrics.jsonl").read_text().splitlines()] \
        == [{**earlier[0], "version": 2}]
    assert records.metrics_row('{"step": 5, "loss": 1, "seconds": 1, "version": 7}') == \
        "format version 7 (this perencode reads 1 to 2)"


# -- The gradient norm a training step computes, in metrics.jsonl ----------------------------

def test_metrics_jsonl_holds_each_log_steps_gradient_norm(tmp_path):
    recipe = _recipe()
    assert recipe.optim.clip_norm > 0
    train(recipe, tmp_path / "run", CPU, progress=False)
    rows = runs.Run(tmp_path / "run").metrics()
    assert [r.step for r in rows] == [5, 10]
    # The same steps taken again by hand: the norm logged is that of the logged step,
    # before clipping (clip_grad_norm_'s return).
    session, norms = Session(recipe, CPU), {}
    for k in range(1, 11):
        norm = session.step().norm
        assert norm is not None  # computed where the step clips
        norms[k] = float(norm)
    assert [r.grad_norm for r in rows] == [norms[5], norms[10]]
    assert all(n > 0 for n in norms.values()) and len(set(norms.values())) == 10

    unclipped = _recipe(optim={"clip_norm": 0.0})
    train(unclipped, tmp_path / "plain", CPU, progress=False)
    lines = (tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()
    assert lines and all("grad_norm" not in json.loads(line) for line in lines)


# -- Run.open: the lock, stale temporary files and the identity check of every writer -------

def _trained(run_dir: Path) -> Path:
    train(_recipe(), run_dir, CPU, progress=False)
    return run_dir


@pytest.mark.parametrize("command", ["eval", "train"])
def test_a_run_in_use_is_refused_by_every_writer_in_one_line(tmp_path, command):
    run_dir = _trained(tmp_path / "run")
    args = ["eval", run_dir] if command == "eval" else \
        ["train", run_dir / "recipe.toml", "--run-dir", run_dir, "--device", "cpu"]
    with hold(run_dir, "another"):
        code, text = run_cli(*args)
    assert code == 2
    assert "already in use" in one_line(code, text)


def test_opening_a_run_clears_what_killed_writers_left(tmp_path):
    run_dir = _trained(tmp_path / "run")
    stale = [run_dir / ".eval.json.abcd1234.tmp",
             run_dir / "checkpoints" / ".step-9.pt.x1y2z3w4.tmp"]
    for path in stale:
        path.write_text("cut")
    with runs.Run.open(run_dir, "eval") as run:
        assert run.recipe == runs.read_recipe(run_dir) and run.accepted == []
    assert not any(path.exists() for path in stale)
