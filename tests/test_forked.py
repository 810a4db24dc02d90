"""tests/forked.py: a `perencode` process forked from the test process sees what a new one
would (its own environment, folder, standard streams, plugins), not what the test process
holds, so that the tests using it test what a user's command does."""

from __future__ import annotations

import os
import subprocess

import forked
import pytest
from conftest import RECIPE, run_cli, subprocess_env
from test_plugins import LIN_RAMP

from perencode.config import registry
from perencode.config.registry import EncodingKind


def test_its_streams_exit_code_and_argv_are_its_own(tmp_path):
    done = forked.run(["--version"], env=subprocess_env())
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "perencode 0.1.0", "")
    assert done.args == ["perencode", "--version"]
    done = forked.run(["show", tmp_path / "missing.toml"], env=subprocess_env())
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("error:") and "missing.toml" in done.stderr


def test_the_console_width_is_read_from_its_own_environment():
    widths = {}
    for columns in ("60", "140"):
        done = forked.run(["show", "--help"], env={**subprocess_env(), "COLUMNS": columns})
        assert done.returncode == 0, done.stderr
        widths[columns] = max(len(line) for line in done.stdout.splitlines())
    assert widths == {"60": 60, "140": 140}


def test_a_plugin_named_by_its_environment_loads_there_and_not_here(tmp_path):
    (tmp_path / "my_pe.py").write_text(LIN_RAMP)
    show = ["show", RECIPE, "--set", "encoding.kind=lin_ramp", "--json"]
    done = forked.run(show, env={**subprocess_env(), "PERENCODE_PLUGINS": "my_pe.py"},
                      cwd=tmp_path)
    assert done.returncode == 0 and '"lin_ramp"' in done.stdout, done.stderr
    assert "lin_ramp" not in registry.names("encoding")
    done = forked.run(show, env=subprocess_env(), cwd=tmp_path)  # not named: not loaded
    assert done.returncode == 2 and "'lin_ramp'" in done.stderr


def test_a_kind_the_test_process_registered_is_not_in_the_fork(monkeypatch):
    kind = EncodingKind("only_here", label="Only here", table=lambda positions, dim: None)
    monkeypatch.setitem(registry.ENCODINGS, "only_here", kind)
    monkeypatch.setitem(registry.ORIGINS, ("encoding", "only_here"), ("test_forked", __file__))
    show = ["show", RECIPE, "--set", "encoding.kind=only_here"]
    assert run_cli(*show)[0] == 0  # registered here
    done = forked.run(show, env=subprocess_env())
    assert done.returncode == 2 and "'only_here'" in done.stderr, done.stderr


@pytest.mark.slow
@pytest.mark.compat
def test_input_folder_and_timeout(tmp_path):
    (tmp_path / "r.toml").write_text(RECIPE.read_text())
    done = forked.run(["show", "r.toml"], env=subprocess_env(), cwd=tmp_path, input="ignored")
    assert done.returncode == 0 and "[model]" in done.stdout, done.stderr
    assert os.getcwd() != str(tmp_path)
    run = ["train", RECIPE, "--run-dir", tmp_path / "run", "--set", "train.iterations=1000000",
           "--device", "cpu", "--no-progress"]
    with pytest.raises(subprocess.TimeoutExpired):
        forked.run(run, env=subprocess_env(), timeout=3)
