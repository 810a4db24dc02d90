"""A run's records (perencode.store.runs.Run.status, status.json): completeness survives deleted
checkpoints (and `perencode prune`), a diverged run is stopped, recorded and shown as such,
of two run directories of one recipe the finished one is used, dangling links are named
and recreated, and symlink loops cannot hang the run search."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import forked
import pandas as pd
import pytest
from conftest import (
    RECIPE,
    ROOT,
    flat,
    run_cli,
    subprocess_env,
    tiny_toml,
    train_args,
)

import perencode.training.session as session_module
from perencode.store import runs
from perencode.store.records import StatusRecord

pytestmark = pytest.mark.forked_children  # the sweep's children as forks (tests/forked.py)

DUAL = ROOT / "recipes" / "gru_dualfreq_vocab64.toml"
GRID = tiny_toml(task={"vocab_size": 8}, train={"checkpoint_every": 5}, grid={"train.seed": [1]})


def _train_args(run_dir: Path, *extra: str, recipe: Path = RECIPE) -> list[str]:
    return train_args(run_dir, "train.iterations=10", "train.checkpoint_every=5",
                      "task.vocab_size=8", "task.length=6", "train.keep_checkpoints=\"all\"",
                      *extra, recipe=recipe)


def _perencode(*args, cwd: Path | None = None, timeout: float = 120) -> tuple[int, str]:
    """`perencode ARGS` in a process of its own (a fork of this one: tests/forked.py): (exit
    code, stdout and stderr)."""
    done = forked.run([*args], env={**subprocess_env(), "COLUMNS": "250"}, cwd=cwd,
                      timeout=timeout)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished tiny reverse run (copied by each test that changes it)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    assert run_cli(*_train_args(run))[0] == 0
    return run


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to, symlinks=True)
    return to


def _strict_json_lines(path: Path) -> list[dict]:
    def refuse(name):
        raise AssertionError(f"{path}: bare {name} is not JSON")
    return [json.loads(line, parse_constant=refuse)
            for line in path.read_text(encoding="utf-8").splitlines()]


# -- 1: completeness is a recorded fact ----------------------------------------------------

@pytest.mark.slow
@pytest.mark.compat
def test_a_finished_run_whose_checkpoints_were_deleted_stays_finished(trained, tmp_path):
    run = _copy(trained, tmp_path / "nock" / "run")
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    shutil.rmtree(run / "checkpoints")
    before = {name: (run / name).read_bytes() for name in ("eval.json", "metrics.jsonl")}

    code, text = run_cli("figures", tmp_path / "nock", "--out", tmp_path / "figs")
    assert code == 0 and "unfinished" not in text, text
    table = pd.read_csv(tmp_path / "figs" / "results.csv")
    assert table["complete"].tolist() == [True] and table["status"].tolist() == ["finished"]
    code, text = run_cli("verify", tmp_path / "nock", "--out", tmp_path / "figs",
                         "--claims", "quick", "--report-only")
    assert code == 0 and "1 finished run given" in flat(text), text

    code, text = run_cli(*_train_args(run))  # never retrained over its results
    assert code == 0 and "run is already complete" in flat(text), text
    code, text = run_cli("eval", run, "--device", "cpu")
    assert code == 2 and "the run is finished but its model was deleted" in flat(text), text
    assert {name: (run / name).read_bytes() for name in before} == before
    assert not (run / "checkpoints").exists()


def _swept(tmp_path: Path) -> tuple[list, Path]:
    """GRID swept into tmp_path/sw in a subprocess: (the sweep's arguments, its one run)."""
    grid = tmp_path / "tiny.toml"
    grid.write_text(GRID)
    sweep = ["sweep", grid, "--runs", tmp_path / "sw", "--device", "cpu", "--no-progress"]
    assert _perencode(*sweep)[0] == 0
    [run] = runs.find_runs([tmp_path / "sw"])
    return sweep, run


@pytest.mark.slow
def test_a_sweep_over_a_finished_grid_without_checkpoints_retrains_nothing(tmp_path):
    sweep, run = _swept(tmp_path)
    shutil.rmtree(run / "checkpoints")
    before = {name: (run / name).read_bytes() for name in ("eval.json", "metrics.jsonl")}
    code, text = _perencode(*sweep, "--dry-run")
    assert code == 0 and "done" in text and "partial" not in text, text
    code, text = _perencode(*sweep)
    assert code == 0, text
    assert {name: (run / name).read_bytes() for name in before} == before
    assert not (run / "checkpoints").exists()


@pytest.mark.slow
@pytest.mark.compat
def test_a_run_of_an_earlier_perencode_is_recognised_without_status_json(trained, tmp_path):
    run = _copy(trained, tmp_path / "old" / "run")
    (run / "status.json").unlink()
    shutil.rmtree(run / "checkpoints")  # eval.json of the final iteration is what is left
    assert runs.Run(run).status() == StatusRecord(
        state="finished", iteration=10, inferred="eval.json of the final iteration")
    code, text = run_cli("figures", tmp_path / "old", "--out", tmp_path / "figs")
    assert code == 0 and "unfinished" not in text, text
    assert pd.read_csv(tmp_path / "figs" / "results.csv")["complete"].tolist() == [True]
    code, text = run_cli(*_train_args(run))
    assert code == 0 and "run is already complete" in flat(text), text
    assert not (run / "checkpoints").exists()


def test_prune_frees_the_checkpoints_and_keeps_what_the_results_need(trained, tmp_path):
    done = _copy(trained, tmp_path / "runs" / "done")
    (done / "status.json").unlink()  # an earlier perencode's run: recorded before pruning
    partial = _copy(trained, tmp_path / "runs" / "partial")
    for name in ("status.json", "eval.json"):  # and no end time: an unfinished run
        (partial / name).unlink()
    env = json.loads((partial / "env.json").read_text())
    del env["end_time"]
    (partial / "env.json").write_text(json.dumps(env))
    dual = tmp_path / "runs" / "dual"
    assert run_cli(*_train_args(dual, recipe=DUAL))[0] == 0
    fresh = tmp_path / "runs" / "fresh"  # a cell a sweep claimed and never started
    runs.Run(fresh).claim(runs.read_recipe(trained))
    early = _copy(partial, tmp_path / "runs" / "early")  # stopped before its first checkpoint
    shutil.rmtree(early / "checkpoints")
    kept = {p: p.stat().st_size for p in (tmp_path / "runs").rglob("*") if p.is_file()}

    code, text = run_cli("prune", tmp_path / "runs", "--dry-run")
    assert code == 0, text
    text = flat(text)
    assert f"{done}: would delete 2 checkpoint(s)" in text
    assert ("would record status.json first (no record: finished inferred from eval.json of "
            "the final iteration)") in text
    assert f"{partial}: nothing deleted, unfinished: its checkpoints resume it" in text
    assert f"{fresh}: nothing deleted, not started: it trains from iteration 0" in text
    assert (f"{early}: nothing deleted, unfinished, stopped before its first checkpoint: it "
            "trains again from iteration 0") in text
    assert text.count("resume") == 1, text
    assert f"{dual}: nothing deleted, kept 2 checkpoint(s) stability.csv does not cover" in text
    assert "eval.json: its held-out metrics (figures, verify, report)" in text
    assert {p: p.stat().st_size for p in kept if p.exists()} == kept  # nothing deleted

    code, text = run_cli("prune", tmp_path / "runs")
    assert code == 0 and f"{done}: deleted 2 checkpoint(s)" in flat(text), text
    assert runs.Run(done).checkpoints() == [] and len(runs.Run(partial).checkpoints()) == 2
    status = json.loads((done / "status.json").read_text())
    assert status["state"] == "finished" and status["pruned"]["deleted"] == [
        "checkpoints/step-5.pt", "checkpoints/step-10.pt"]
    assert all((done / name).exists() for name in ("recipe.toml", "eval.json", "metrics.jsonl",
                                                   "env.json"))
    assert runs.Run(done).is_complete()

    assert run_cli("stability", dual, "--triplets", 4, "--device", "cpu",
                   "--no-progress")[0] == 0
    code, text = run_cli("prune", dual)  # now stability.csv covers them: they go too
    assert code == 0 and f"{dual}: deleted 2 checkpoint(s)" in flat(text), text
    code, text = run_cli("stability", dual, "--triplets", 4, "--device", "cpu")
    assert code == 0, text  # every checkpoint it analysed is in stability.csv already


# -- 4: numerical health ---------------------------------------------------------------------

@pytest.mark.slow
def test_a_nan_loss_stops_training_at_once_and_is_recorded(tmp_path):
    run = tmp_path / "nan"
    code, text = _perencode(*_train_args(run, "optim.weight_decay=3e38"))
    lines = [line for line in text.splitlines() if line.strip()]
    assert code == runs.DIVERGED_EXIT and len(lines) == 1, text
    assert lines[0].startswith(f"error: {run}: diverged at iteration 2: loss is nan"), text
    status = json.loads((run / "status.json").read_text())
    assert (status["state"], status["iteration"], status["reason"]) == (
        "diverged", 2, "loss is nan")
    assert not (run / "eval.json").exists()
    if (run / "metrics.jsonl").exists():
        _strict_json_lines(run / "metrics.jsonl")
    code, text = _perencode(*_train_args(run, "optim.weight_decay=3e38"))
    assert code == runs.DIVERGED_EXIT and "diverged at iteration 2" in text, text


def test_the_first_non_finite_loss_is_named_and_the_last_finite_checkpoint_kept(
        tmp_path, monkeypatch):
    real, calls = session_module.train_step, []

    def nan_at_seven(*args, **kwargs):  # iteration 7 reports a loss that is not a number
        loss, hits, norm = real(*args, **kwargs)
        calls.append(1)
        return (loss * float("nan") if len(calls) == 7 else loss), hits, norm

    monkeypatch.setattr(session_module, "train_step", nan_at_seven)
    run = tmp_path / "run"
    code, text = run_cli(*_train_args(run))
    assert code == runs.DIVERGED_EXIT and len(calls) == 10, text  # found at the log step 10
    assert (f"{run}: diverged at iteration 7: loss is nan; training stopped and the last "
            f"finite checkpoint is {run / 'checkpoints' / 'step-5.pt'}") in flat(text)
    assert [k for k, _ in runs.Run(run).checkpoints()] == [5]
    assert [row["step"] for row in _strict_json_lines(run / "metrics.jsonl")] == [5]

    code, text = run_cli("eval", run, "--device", "cpu")
    assert code == 2 and "its final model is not a result" in flat(text), text
    assert not (run / "eval.json").exists()
    code, text = run_cli("eval", run, "--device", "cpu", "--checkpoint",
                         run / "checkpoints" / "step-5.pt")
    assert code == 0 and (run / "eval-step-5.json").exists(), text


@pytest.mark.slow
@pytest.mark.compat
def test_diverged_runs_are_shown_as_such_never_as_numbers(trained, tmp_path):
    good = _copy(trained, tmp_path / "runs" / "good")
    old = _copy(trained, tmp_path / "runs" / "old")  # diverged under an earlier perencode:
    (old / "status.json").unlink()                   # a bare NaN loss, eval.json scored
    (old / "identity.json").unlink()                 # (an earlier perencode kept neither)
    (old / "recipe.toml").write_text((old / "recipe.toml").read_text().replace(
        "seed = ", "seed = 9", 1))
    rows = (old / "metrics.jsonl").read_text().splitlines()
    (old / "metrics.jsonl").write_text(rows[0] + "\n" + rows[1].replace(
        json.dumps(json.loads(rows[1])["loss"]), "NaN") + "\n")
    assert runs.Run(old).status().state == "diverged"

    code, text = run_cli("figures", tmp_path / "runs", "--out", tmp_path / "figs")
    assert code == 0 and f"1 diverged run(s) listed in results.csv (status = diverged, no " \
        f"metrics) and never plotted: {old} (iteration 10)" in flat(text), text
    table = pd.read_csv(tmp_path / "figs" / "results.csv").set_index("run")
    assert table.loc[str(old), "status"] == "diverged"
    assert pd.isna(table.loc[str(old), "token_accuracy"])
    assert table.loc[str(good), "token_accuracy"] >= 0
    code, text = run_cli("verify", tmp_path / "runs", "--out", tmp_path / "figs",
                         "--claims", "quick", "--report-only")
    assert code == 0 and "1 finished run given (1 diverged)" in flat(text), text


# -- 7: duplicates and links -----------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.compat
def test_of_two_runs_of_one_recipe_the_finished_one_is_used(trained, tmp_path):
    partial = _copy(trained, tmp_path / "runs" / "a_partial")
    for name in ("status.json", "eval.json"):  # and no end time: an unfinished run
        (partial / name).unlink()
    env = json.loads((partial / "env.json").read_text())
    del env["end_time"]
    (partial / "env.json").write_text(json.dumps(env))
    complete = _copy(trained, tmp_path / "runs" / "b_complete")
    code, text = run_cli("figures", tmp_path / "runs", "--out", tmp_path / "figs")
    assert code == 0 and (f"{partial}: ignored, unfinished (iteration 10); the same recipe's "
                          f"finished run {complete} is used") in flat(text), text
    table = pd.read_csv(tmp_path / "figs" / "results.csv")
    assert table["run"].tolist() == [str(complete)] and table["complete"].all()

    other = _copy(trained, tmp_path / "runs" / "c_other")
    result = json.loads((other / "eval.json").read_text())
    result["token_accuracy"] = 0.5
    (other / "eval.json").write_text(json.dumps(result))
    code, text = run_cli("verify", tmp_path / "runs", "--out", tmp_path / "figs",
                         "--claims", "quick", "--report-only")
    assert code == 0 and (f"{other} and {complete}: two finished runs of the same recipe with "
                          "different results (token_accuracy differ)") in flat(text), text


@pytest.mark.slow
def test_a_dangling_link_is_named_and_the_sweep_recreates_the_cell(tmp_path):
    sweep, cell = _swept(tmp_path)
    shutil.move(cell, tmp_path / "elsewhere")  # linked from a grid deleted since
    cell.symlink_to(tmp_path / "gone", target_is_directory=True)
    (tmp_path / "sw" / "keep").mkdir()
    assert run_cli(*_train_args(tmp_path / "sw" / "keep" / "run"))[0] == 0

    for command in ("figures", "verify"):
        code, text = run_cli(command, tmp_path / "sw", "--out", tmp_path / "figs",
                             *(["--report-only"] if command == "verify" else []))
        assert code == 0 and (f"{cell}: a link to {tmp_path / 'gone'}, which does not exist "
                              "(its run was moved or deleted); skipped") in flat(text), text
    code, text = _perencode(*sweep, "--dry-run")
    assert code == 0 and f"a link to {tmp_path / 'gone'}, which does not exist" in \
        flat(text), text
    code, text = _perencode(*sweep)
    assert code == 0 and "File exists" not in text, text
    assert not cell.is_symlink() and runs.Run(cell).is_complete()


@pytest.mark.slow
def test_symlink_loops_do_not_hang_the_run_search(trained, tmp_path):
    lp = tmp_path / "lp"
    _copy(trained, lp / "grid" / "run")
    for name in ("self", "self2"):
        (lp / name).symlink_to(".", target_is_directory=True)
    (lp / "grid" / "back").symlink_to("..", target_is_directory=True)
    code, text = _perencode("figures", lp, "--out", tmp_path / "figs", timeout=60)
    assert code == 0, text
    text = flat(text)
    for link in (lp / "self", lp / "self2", lp / "grid" / "back"):
        assert text.count(f"note: {link}: a link back to") == 1, text
    assert pd.read_csv(tmp_path / "figs" / "results.csv")["run"].tolist() == [
        str(lp / "grid" / "run")]
    assert runs.find_runs([lp, lp / "self"], notes=[]) == [lp / "grid" / "run"]
    assert os.path.realpath(lp / "self") == os.path.realpath(lp)


@pytest.mark.slow
def test_a_sweep_reports_a_diverged_cell_and_does_not_train_it_again(tmp_path):
    grid = tmp_path / "tiny.toml"
    grid.write_text(GRID.replace("[train]", "[optim]\nweight_decay = 3e38\n[train]"))
    sweep = ["sweep", grid, "--runs", tmp_path / "sw", "--device", "cpu", "--no-progress"]
    code, text = _perencode(*sweep)
    [cell] = runs.find_runs([tmp_path / "sw"])
    assert code == 1 and f"diverged: {cell}: a loss or weight was not finite" in flat(text), \
        text
    assert runs.Run(cell).status().state == "diverged"
    code, text = _perencode(*sweep, "--dry-run")
    assert code == 0 and "diverged at iteration 2 (loss is nan); not trained again" in \
        flat(text), text
    code, text = _perencode(*sweep)
    assert code == 1 and "diverged at iteration 2 (loss is nan); not trained again" in \
        flat(text) and not (cell / "train.log").read_text().count("resuming"), text
