"""The small cases a reliability probe left (issue 57), one test each: a quoted number in a
recipe, `show` of an eval.json of an unsupported version, prune's list of kept files, and
`show | head -1`."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, finished_run, one_line, run_cli, subprocess_env

from perencode.commands.prune import KEPT
from perencode.common.console import GuardedStream
from perencode.config.recipe import load_recipe
from perencode.store import records

RECIPE = ROOT / "recipes" / "gru_vocab256.toml"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return finished_run(tmp_path_factory.mktemp("probe") / "run", "train.iterations=10",
                        "train.checkpoint_every=5")


def test_a_quoted_number_is_refused_and_an_int_for_a_float_is_read(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE.read_text().replace("hidden_size = ", "hidden_size = \"16\" #", 1))
    assert 'hidden_size = "16"' in recipe.read_text()
    code, text = run_cli("show", recipe)
    assert one_line(code, text) == (f"error: {recipe}: model.hidden_size: expected a number, "
                                    'got a string ("16"); write it without quotes')
    code, text = run_cli("show", RECIPE, "--set", "optim.betas=[\"0.9\", 0.98]")
    assert "optim.betas: expected a number, got a string" in one_line(code, text)
    # TOML integers where a float is meant stay floats: `lr = 1` is 1.0
    assert load_recipe(RECIPE, ["optim.lr=1", "optim.betas=[0, 0]"]).optim.lr == 1.0


def test_show_says_an_unsupported_eval_json_is_not_missing(run, tmp_path):
    copy = shutil.copytree(run, tmp_path / "run")
    data = json.loads((copy / "eval.json").read_text())
    (copy / "eval.json").write_text(json.dumps({**data, "version": records.EVAL_VERSION + 1}))
    code, text = run_cli("show", copy)
    assert code == 0, text
    assert "no eval.json" not in text
    assert (f"results: {copy / 'eval.json'}: eval.json format version "
            f"{records.EVAL_VERSION + 1} is not supported") in " ".join(text.split())


def test_prune_keeps_every_file_of_a_finished_run_but_its_checkpoints(run, tmp_path):
    copy = shutil.copytree(run, tmp_path / "run")
    code, text = run_cli("prune", copy)
    assert code == 0, text
    left = {p.name for p in copy.iterdir()} - {"checkpoints", ".lock"}
    assert "identity.json" in left
    assert left <= set(KEPT), sorted(left - set(KEPT))
    assert "identity.json" in " ".join(text.split())  # the kept list it prints names it


def test_a_closed_pipe_on_stdout_ends_the_output_quietly():
    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    err = io.StringIO()
    stream = GuardedStream(Closed(), "stdout", note_closed_pipe=False)
    saved, sys.stderr = sys.stderr, err
    try:
        stream.write("line\n")
        stream.write("more\n")
    finally:
        sys.stderr = saved
    assert isinstance(stream.failed, BrokenPipeError) and err.getvalue() == ""


@pytest.mark.slow
def test_show_piped_into_a_reader_that_stops_exits_0():
    """`perencode show RECIPE | head -1` with the pipe closed before show writes."""
    proc = subprocess.Popen([sys.executable, "-m", "perencode", "show", str(RECIPE)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=subprocess_env())
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert err == ""


def test_tensorboard_remakes_curves_of_a_metrics_jsonl_replaced_by_an_older_copy(run, tmp_path):
    from perencode.training import tensorboard as tracking

    copy = shutil.copytree(run, tmp_path / "run")
    metrics = copy / "metrics.jsonl"
    assert len(metrics.read_text().splitlines()) == 2  # steps 5 and 10
    folder = tracking.events_from_metrics(copy)
    assert folder is not None
    before = (folder / tracking.CONVERTED).read_bytes()
    assert tracking.events_from_metrics(copy) == folder  # unchanged: not rewritten
    assert (folder / tracking.CONVERTED).read_bytes() == before
    older = tmp_path / "older.jsonl"
    older.write_text(metrics.read_text().splitlines()[0] + "\n")
    os.utime(older, (1_000_000, 1_000_000))  # dated long before the events
    os.replace(older, metrics)
    tracking.events_from_metrics(copy)
    after = (folder / tracking.CONVERTED).read_bytes()
    assert after != before and len(after) < len(before)


def test_tensorboard_says_a_run_it_cannot_write_to_is_not_writable(run, tmp_path, monkeypatch):
    from perencode.common.errors import UserError
    from perencode.training import tensorboard as tracking

    copy = shutil.copytree(run, tmp_path / "run")

    def read_only(path, data, temp_name=None):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tracking, "atomic_write_bytes", read_only)
    with pytest.raises(UserError) as refused:
        tracking.tensorboard_command([copy])
    assert "not writable" in str(refused.value) and "Permission denied" in str(refused.value)
    assert "has logged a training step" not in str(refused.value)


def test_figures_does_not_call_a_run_of_other_code_the_same(run, tmp_path):
    from perencode.analysis.results import choose
    from perencode.store import runs

    first, second = (shutil.copytree(run, tmp_path / name) for name in ("a", "b"))
    found = [(d, runs.read_recipe(d), runs.Run(d).status()) for d in (first, second)]
    _, lines = choose(found)
    assert lines == [f"{second}: ignored, the same recipe and results as {first}"]
    record = json.loads((second / "identity.json").read_text())
    record["code"] = {**record["code"], "perencode": {"commit": "0" * 40}}
    (second / "identity.json").write_text(json.dumps(record))
    kept, lines = choose(found)
    assert [d for d, _, _ in kept.values()] == [first]
    assert lines == [f"{second} and {first}: two finished runs of the same recipe and results, "
                     "trained by other code (their identity.json differ in code); "
                     f"{first} is used, move it away to use the other"]
