"""Grid files (perencode.config.grid): every grid of the package expands to valid recipes in
stable directories; mistakes are one line; `base` chains override key by key."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT
from test_sweep import AXES, TINY

from perencode.common.errors import UserError
from perencode.config import grid
from perencode.config.grid import load_grid, paper_folder, repository_root
from perencode.config.recipe import run_key

TIED = """
[grid]
"task.vocab_size+train.iterations" = [[16, 6], [8, 3]]
"train.seed" = [111, 222]
"""

GRIDS = sorted((ROOT / "recipes" / "paper").glob("*.toml")) + \
    sorted((ROOT / "recipes" / "quick").glob("*.toml"))


@pytest.mark.parametrize("path", GRIDS, ids=lambda p: p.stem)
def test_package_grids_expand_to_stable_valid_cells(path):
    first, again = load_grid(path), load_grid(path)
    names = [c.name for c in first.cells]
    assert names == [c.name for c in again.cells] and len(set(names)) == len(names)
    assert all("seed=" in n for n in names)
    assert {run_key(c.recipe) for c in first.cells} == \
        {run_key(c.recipe) for c in again.cells}
    if path.parent.name == "paper":
        assert first.description.startswith(("Fig. ", "Table "))
        assert {c.recipe.train.seed for c in first.cells} == {111, 222, 333, 444, 555}
        assert all(c.recipe.model.hidden_size == 512 for c in first.cells)


def test_paper_grids_share_identical_runs():
    def keys(name):
        return {run_key(c.recipe) for c in load_grid(ROOT / "recipes" / "paper" /
                                                         f"{name}.toml").cells}
    assert keys("fig05_lstm_stability") == keys("fig03_lstm_dual_frequency")
    assert len(keys("fig12_lstm_double_vanilla") & (keys("fig02_lstm_reverse")
                                                     | keys("fig08_lstm_sort"))) == 20
    assert load_grid(ROOT / "recipes" / "paper" / "fig05_s4d_stability.toml").sweep.after \
        == ["stability"]


@pytest.mark.parametrize("text, options, message", [
    (TINY + '[grid]\n"task.vocabsize" = [8]\n', {},
     "task.vocabsize: unknown key 'vocabsize' in [task]"),
    (TINY + '[grid]\n"tsk.vocab_size" = [8]\n', {}, "axes are section.key"),
    (TINY + '[grid]\n"task.vocab_size" = 8\n', {}, "must be a non-empty list"),
    (TINY + '[grid]\n"task.vocab_size" = [8, 8]\n', {}, "value 8 appears twice"),
    (TINY + '[grid]\n"task.vocab_size" = [1]\n', {}, "vocab_size=1: task.vocab_size"),
    (TINY, {}, "no [grid] table"),
    (TINY + AXES + '[slurm]\npartion = "gpu"\n', {}, "[slurm] partion: unknown key"),
    (TINY + AXES + '[slurm]\ntime_min = 1\n', {},
     "[slurm] signal_delay_s: 90 s before a 1-minute limit may signal the job before"),
    (TINY + AXES, {"overrides": ["task.vocab_size=4"]}, "is an axis of"),
    (TINY + TIED, {"overrides": ["train.iterations=4"]}, "train.iterations is an axis of"),
    (TINY + '[grid]\n"task.vocab_size+train.iterations" = [[8, 4], [16]]\n', {},
     "each value must be a list of 2 values, one for each of task.vocab_size, "
     "train.iterations; got [16]"),
    (TINY + '[grid]\n"task.vocab_size+train.seed" = [[8, 1]]\n"train.seed" = [2]\n', {},
     "'train.seed': train.seed is already an axis"),
    (TINY + '[grid]\n"task.vocab_size+trian.seed" = [[8, 1]]\n', {}, "axes are section.key"),
    (TINY + AXES, {"only": ["seed=999"]}, "999 is not a value of train.seed"),
    (TINY + AXES, {"only": ["colour=red"]}, "AXIS one of vocab_size, encoding, seed"),
    ('base = "grid.toml"\n' + AXES, {}, "(a loop)"),
])
def test_grid_mistakes_are_one_line(tmp_path, text, options, message):
    path = tmp_path / "grid.toml"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        load_grid(path, **options)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_tied_axis_sets_its_keys_together(tmp_path):
    """A tied axis "a+b" sets a and b from one value list: its cells are named by the first
    key, record both, and `--only` selects by either."""
    path = tmp_path / "grid.toml"
    path.write_text(TINY + TIED)
    grid = load_grid(path)
    assert [c.name for c in grid.cells] == [f"vocab_size={k}/seed={s}"
                                            for k in (16, 8) for s in (111, 222)]
    assert [(c.recipe.task.vocab_size, c.recipe.train.iterations) for c in grid.cells] == \
        [(16, 6), (16, 6), (8, 3), (8, 3)]
    assert grid.cells[0].coords == {"task.vocab_size": 16, "train.iterations": 6,
                                    "train.seed": 111}
    assert [c.name for c in load_grid(path, only=["iterations=3"]).cells] == \
        ["vocab_size=8/seed=111", "vocab_size=8/seed=222"]
    assert len(load_grid(path, only=["vocab_size=16", "seed=222"]).cells) == 1


def test_base_chain_overrides_key_by_key(tmp_path):
    (tmp_path / "base.toml").write_text(TINY + AXES)
    child = tmp_path / "child.toml"
    child.write_text('base = "base.toml"\n[model]\nhidden_size = 24\n'
                     '[grid]\n"train.seed" = [7]\n')
    grid = load_grid(child, only=["vocab_size=16"])
    assert [c.name for c in grid.cells] == ["vocab_size=16/encoding=none/seed=7",
                                            "vocab_size=16/encoding=sinusoidal/seed=7"]
    assert all(c.recipe.model.hidden_size == 24 and c.recipe.model.embed_size == 8
               for c in grid.cells)
    assert Path(grid.path) == child


def test_shared_settings_reach_the_cells_whose_kinds_have_them(tmp_path):
    """A grid over kinds with different options: the template's and --set's options go to
    the cells whose kinds have them; an axis value and a --set that no cell has are refused."""
    path = tmp_path / "grid.toml"
    path.write_text(TINY + '[grid]\n"model.arch" = ["gru", "s4d"]\n'
                    '"task.name+task.vocab_size" = [["reverse", 8], ["dual_frequency", 8]]\n')
    grid = load_grid(path, overrides=["model.d_state=4", "task.held_out_per_cell=1"])
    seen = {(c.recipe.model.arch, c.recipe.task.name): c.recipe.to_dict() for c in grid.cells}
    assert len(seen) == 4
    for (arch, task), data in seen.items():
        assert ("d_state" in data["model"]) == (arch == "s4d")
        assert data["model"].get("d_state", 4) == 4
        assert ("held_out" in data["task"]) == (task == "reverse")  # from the template
        assert data["task"].get("held_out_per_cell", 1) == 1
    path.write_text(TINY + '[grid]\n"model.arch" = ["gru", "s4d"]\n')
    with pytest.raises(UserError, match="--set task.rarity=0.25: no cell of .* has this "
                                        "option"):
        load_grid(path, overrides=["task.rarity=0.25"])
    path.write_text(TINY + '[grid]\n"task.rarity" = [0.25]\n')
    with pytest.raises(UserError, match="task.rarity: not an option of task.name = 'reverse' "
                                        "\\(only of 'dual_frequency'\\)"):
        load_grid(path)


def test_recipes_are_read_from_the_checkout_else_from_the_working_directory(tmp_path,
                                                                             monkeypatch):
    """One rule for where recipes/ lives (doctor, figures, quickstart, crosscheck)."""
    monkeypatch.chdir(ROOT)  # the checkout itself: paths stay relative
    assert repository_root() == Path() and paper_folder() == Path("recipes/paper")
    monkeypatch.chdir(tmp_path)  # elsewhere: the checkout's, wherever the command runs
    assert repository_root() == ROOT and paper_folder() == ROOT / "recipes" / "paper"
    monkeypatch.setattr(grid, "CHECKOUT", tmp_path / "site-packages")  # a wheel install
    assert repository_root() == Path() and paper_folder() is None
    (tmp_path / "recipes" / "paper").mkdir(parents=True)  # run in a clone, the container
    folder = paper_folder()
    assert folder == Path("recipes/paper") and folder.is_dir()
