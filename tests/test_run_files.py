"""plugins.json and sweep.json through their typed records (issue 57): written and read only by
the store (perencode.store.records, perencode.store.runs), each with a format version and one
migration; `load_recipe` reads a recipe and nothing beside it."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_toml

from perencode.common.errors import UserError
from perencode.config.recipe import load_recipe
from perencode.store import records, runs

ENTRY = {"module": "my_pe", "file": "/plugins/my_pe.py", "package": None, "version": None,
         "entry_point": None, "provides": ["encoding.kind = 'lin_ramp'"],
         "labels": {"encoding": {"lin_ramp": "Linear ramp"}}}


def test_plugins_json_round_trips_and_a_version_1_file_is_migrated(tmp_path):
    path = tmp_path / "plugins.json"
    record = records.PluginsRecord.model_validate({"plugins": [ENTRY]})
    path.write_text(json.dumps(record.as_dict()))
    assert json.loads(path.read_text()) == {"plugins": [ENTRY], "version": 2}
    assert records.read_plugins(path) == record
    # Version 1: no version key; the earliest had no labels either.
    path.write_text(json.dumps({"plugins": [{k: v for k, v in ENTRY.items() if k != "labels"}]}))
    old = records.read_plugins(path)
    assert old.version == 2 and old.plugins[0].labels == {}
    assert old.plugins[0].origin() == {"module": "my_pe", "file": "/plugins/my_pe.py",
                                       "package": None, "version": None, "entry_point": None}
    assert runs.recorded_labels(tmp_path) == {}  # no labels recorded: none
    path.write_text(json.dumps(record.as_dict()))
    assert runs.recorded_labels(tmp_path) == {("encoding", "lin_ramp"): "Linear ramp"}


@pytest.mark.parametrize("text, says", [
    ('{"plugins": [], "version": 3}', "plugins.json format version 3 is not supported"),
    ('{"plugins": [{"file": "x.py"}]}', "damaged (not a plugins.json: plugins.0.module: "),
    ("[]", "damaged (not a JSON object)")])
def test_a_plugins_json_this_perencode_cannot_read_names_the_file(tmp_path, text, says):
    path = tmp_path / "plugins.json"
    path.write_text(text)
    with pytest.raises(UserError) as caught:
        records.read_plugins(path)
    assert str(caught.value).startswith(f"{path}: ") and says in str(caught.value)
    assert runs.recorded_labels(tmp_path) == {}  # only read: a damaged file labels nothing


def test_load_recipe_reads_no_plugins_json_beside_the_recipe(tmp_path):
    """A run's recipe.toml naming a plugin's kind: the store names the plugin (through the
    check the caller hands to load_recipe); load_recipe alone only validates the file."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.toml").write_text(tiny_toml(encoding={"kind": "lin_ramp"}))
    (run / "status.json").write_text('{"state": "unfinished"}')  # a run directory
    (run / "plugins.json").write_text(json.dumps({"plugins": [ENTRY], "version": 2}))
    with pytest.raises(UserError) as alone:
        load_recipe(run / "recipe.toml")
    assert "needs the plugin" not in str(alone.value) and "lin_ramp" in str(alone.value)
    with pytest.raises(UserError) as checked:
        load_recipe(run / "recipe.toml", check=runs.recipe_check(run / "recipe.toml"))
    assert str(checked.value).startswith(f"{run}: the run needs the plugin my_pe "
                                         "(/plugins/my_pe.py) for encoding.kind = 'lin_ramp'")
    assert runs.recipe_check(tmp_path / "elsewhere.toml") is None  # no run's recipe


def test_sweep_json_round_trips_and_a_version_1_file_is_migrated(tmp_path):
    cell = {"grid": "recipes/paper/fig02.toml", "name": "fig02@mine", "tag": "mine",
            "cell": "vocab_size=8/seed=1", "axes": {"task.vocab_size": "8", "train.seed": "1"}}
    runs.record_sweep(tmp_path, cell)
    assert json.loads((tmp_path / "sweep.json").read_text()) == {**cell, "version": 2}
    assert runs.sweep_record(tmp_path) == records.SweepRecord(**cell)
    (tmp_path / "sweep.json").write_text(json.dumps(cell))  # version 1: no version key
    assert runs.sweep_record(tmp_path) == records.SweepRecord(**cell)
    (tmp_path / "sweep.json").write_text(json.dumps({**cell, "version": 3}))
    with pytest.raises(UserError, match="sweep.json format version 3 is not supported"):
        records.read_sweep(tmp_path / "sweep.json")
    assert runs.sweep_record(tmp_path) is None  # a reader of results: names nothing
    assert runs.sweep_record(tmp_path / "by_hand") is None


def test_env_json_round_trips_and_a_version_1_file_is_migrated(tmp_path):
    report = {"perencode_version": "0.1", "device": "cpu", "device_name": None,
              "git_commit": "abc", "git_dirty": False, "cuda": None}
    start = {"time": "2026-01-01 00:00:00", "device": "cpu", "git_commit": "abc",
             "git_dirty": False}
    record = records.EnvRecord(**report, seed=1, start_time=start["time"], starts=[start])
    runs.write_env(tmp_path, record)
    written = json.loads((tmp_path / "env.json").read_text())
    assert written == {**report, "seed": 1, "start_time": start["time"], "starts": [start],
                       "version": 2}  # a report field that is null stays, as it was
    assert runs.env_record(tmp_path) == record and record.get("device") == "cpu"
    del written["version"]  # version 1: no version key
    (tmp_path / "env.json").write_text(json.dumps(written))
    old = runs.env_record(tmp_path)
    assert old is not None and old.as_dict() == record.as_dict() and old.end_time is None
    ended = old.model_copy(update={"end_time": "2026-01-01 01:00:00"})
    runs.write_env(tmp_path, ended)
    assert json.loads((tmp_path / "env.json").read_text())["end_time"] == "2026-01-01 01:00:00"
    (tmp_path / "env.json").write_text(json.dumps({**written, "starts": [{"device": "cpu"}]}))
    with pytest.raises(UserError, match=r"env.json: not an env.json \(starts.0.time: "):
        runs.env_record(tmp_path)
    assert runs.env_record(tmp_path / "never_started") is None
