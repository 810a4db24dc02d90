"""A researcher's own study (issue 38): installed plugins that stay out of the way
(PERENCODE_DISABLE_PLUGIN_AUTOLOAD, a clean checkout after the example's install)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import PYTHON, ROOT, subprocess_env
from test_plugins import autoloading, error_line
from test_sweep import TINY

from perencode import kinds, plugins
from perencode.grid import load_grid

RECIPE = ROOT / "recipes" / "gru_vocab256.toml"

FAKE_PE = '''
import torch
from perencode.kinds import EncodingKind, register_encoding

register_encoding(EncodingKind("fake_ramp", label="Fake ramp",
                               table=lambda positions, dim: torch.zeros(positions, dim)))
'''


def installed_fake(folder) -> dict:
    """A distribution 'fake-pe' with a perencode.kinds entry point, installed by being on
    PYTHONPATH (a .dist-info beside its module, as pip leaves one); the env that sees it."""
    (folder / "fake_pe.py").write_text(FAKE_PE)
    info = folder / "fake_pe-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-pe\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[perencode.kinds]\nfake = fake_pe\n")
    env = subprocess_env()
    env["PYTHONPATH"] = f"{folder}:{env['PYTHONPATH']}"
    return env


def show(env: dict, *args) -> tuple[int, str]:
    proc = subprocess.run([PYTHON, "-m", "perencode", *args, "show", str(RECIPE), "--set",
                           "encoding.kind=fake_ramp"], capture_output=True, text=True,
                          env=env, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_suite_runs_with_entry_point_loading_off():
    assert not kinds.autoload()
    assert plugins.load_entry_points() == []  # the example may be installed beside it


def test_the_autoload_switch_turns_entry_points_off_and_leaves_explicit_plugins_on(tmp_path):
    env = installed_fake(tmp_path)
    code, text = show(autoloading(env))
    assert code == 0 and "fake_ramp" in text, text
    for off in ("1", "true"):
        code, text = show({**env, kinds.AUTOLOAD_OFF: off})
        assert code == 2 and "encoding.kind: Input should be " in error_line(text) \
            and "(got 'fake_ramp')" in text, text
    code, text = show({**env, kinds.AUTOLOAD_OFF: "0"})  # "0" is off-switch off: loads
    assert code == 0, text
    code, text = show({**env, kinds.AUTOLOAD_OFF: "1"}, "--plugin", "fake_pe")
    assert code == 0 and "fake_ramp" in text, text


def test_the_example_packages_build_leftovers_are_ignored():
    paths = ["examples/perencode-minrnn/build/lib/perencode_minrnn/plugin.py",
             "examples/perencode-minrnn/perencode_minrnn.egg-info/PKG-INFO", "build/x"]
    proc = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.stdout.split() == paths, proc.stderr


# -- grid inheritance: a file's value holds over its base's axis -------------------------------

BASE_GRID = TINY + ('\n[grid]\n"task.vocab_size+train.iterations" = [[64, 20], [8, 10]]\n'
                    '"encoding.kind" = ["none", "sinusoidal"]\n')


def grid_pair(tmp_path, child: str) -> Path:
    (tmp_path / "base.toml").write_text(BASE_GRID)
    path = tmp_path / "child.toml"
    path.write_text('base = "base.toml"\n' + child)
    return path


def test_a_files_value_holds_over_the_axis_its_base_varies_with_a_note(tmp_path):
    grid = load_grid(grid_pair(tmp_path, "[task]\nvocab_size = 32\n[train]\niterations = 5\n"))
    assert [(c.name, c.recipe.task.vocab_size, c.recipe.train.iterations) for c in grid.cells] \
        == [("encoding=none", 32, 5), ("encoding=sinusoidal", 32, 5)]
    base, child = tmp_path / "base.toml", tmp_path / "child.toml"
    assert grid.notes == [
        f"{child} sets task.vocab_size = 32 and train.iterations = 5, which its base {base} "
        f"varies in the axis 'task.vocab_size+train.iterations': {child}'s values hold in "
        "every cell"]


def test_a_tied_axis_keeps_the_keys_the_file_does_not_set(tmp_path):
    grid = load_grid(grid_pair(tmp_path, "[train]\niterations = 5\n"))
    assert [(c.name, c.recipe.task.vocab_size, c.recipe.train.iterations) for c in grid.cells] \
        == [("vocab_size=64/encoding=none", 64, 5), ("vocab_size=64/encoding=sinusoidal", 64, 5),
            ("vocab_size=8/encoding=none", 8, 5), ("vocab_size=8/encoding=sinusoidal", 8, 5)]
    assert grid.notes[0].endswith("values hold in every cell (task.vocab_size still varies)")
    # An axis of the file's own replaces that key of the base's tied axis; the same axis
    # spelt as the base spells it is replaced in place, with no note.
    grid = load_grid(grid_pair(tmp_path, '[grid]\n"task.vocab_size" = [16]\n'))
    assert {(c.recipe.task.vocab_size, c.recipe.train.iterations) for c in grid.cells} == \
        {(16, 20), (16, 10)}
    assert "varies task.vocab_size in its own [grid]" in grid.notes[0]
    grid = load_grid(grid_pair(tmp_path, '[grid]\n"encoding.kind" = ["none"]\n'))
    assert grid.notes == [] and [c.name for c in grid.cells] == [
        "vocab_size=64/encoding=none", "vocab_size=8/encoding=none"]


def test_the_dry_run_explains_where_each_value_came_from(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)  # files are shown relative to the working directory
    grid_pair(tmp_path, "[train]\niterations = 5\n")
    code, text = cli("sweep", "child.toml", "--runs", "runs", "--explain", "--device", "cpu",
                     "--set", "optim.lr=0.003")
    assert code == 0, text
    assert "note: " in text and not (tmp_path / "runs" / "child").exists()  # nothing ran
    rows = {cells[0]: cells[1:] for line in text.splitlines()
            if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) == 3}
    assert rows["train.iterations"] == ["5", "child.toml"]
    assert rows["task.vocab_size"] == ["64, 8", "base.toml [grid]"]
    assert rows["encoding.kind"] == ["none, sinusoidal", "base.toml [grid]"]
    assert rows["optim.lr"] == ["0.003", "--set"]
    assert rows["task.length"] == ["4", "base.toml"]
    assert rows["optim.clip_norm"] == ["1.0", "default"]
