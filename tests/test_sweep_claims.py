"""Two local sweeps of overlapping grids started together train each shared cell once (issue
57): a cell is claimed as it starts, under the runs root's lock, and a cell whose recipe
another sweep claimed after this one planned is linked to that run and waits for it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import PYTHON, subprocess_env, tiny_toml

from perencode.commands.sweep.cells import RunState, claim_at_start, plan, prepare, twin_busy
from perencode.config.grid import load_grid

HOLD = ("import sys; from pathlib import Path; from perencode.store.lock import hold\n"
        "with hold(Path(sys.argv[1]), 'perencode sweep a.toml'):\n"
        "    print('held', flush=True); sys.stdin.read()\n")


def _grid(tmp_path: Path, name: str, seeds: list[int]) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(tiny_toml(grid={"train.seed": seeds}))
    return path


def test_a_cell_another_sweep_claimed_since_the_plan_is_linked_and_waits(tmp_path):
    out = tmp_path / "runs"
    # Both sweeps plan before either starts a cell: seed 2 is new in both plans.
    planned_a = plan(load_grid(_grid(tmp_path, "a", [1, 2])), out)
    planned_b = plan(load_grid(_grid(tmp_path, "b", [2, 3])), out)
    for planned in (planned_a, planned_b):
        assert [r.state for r in planned] == [RunState.NEW, RunState.NEW]
        prepare(planned, claim_now=False)  # a local sweep claims each cell as it starts it
    shared_a = next(r for r in planned_a if r.cell.name.endswith("seed=2"))
    shared_b, own_b = sorted(planned_b, key=lambda r: r.cell.name)

    assert claim_at_start(shared_a, out)  # sweep a starts its cell first: its own run
    assert (shared_a.dir / "recipe.toml").is_file() and not shared_a.dir.is_symlink()
    assert twin_busy(shared_a, out) is None

    sweep_a = subprocess.Popen([PYTHON, "-c", HOLD, str(out / "a")], env=subprocess_env(),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert sweep_a.stdout is not None and sweep_a.stdout.readline() == "held\n"
        assert claim_at_start(shared_b, out)  # sweep b starts the same recipe: linked
        assert shared_b.dir.is_symlink() and shared_b.dir.resolve() == shared_a.dir.resolve()
        assert shared_b.state == RunState.REUSE and shared_b.twin == shared_a.dir.resolve()
        assert f"same recipe as {shared_a.dir.resolve()}" in shared_b.message
        # Sweep a is alive and has not started that run yet: b waits for it, naming it.
        busy = twin_busy(shared_b, out)
        assert busy is not None and "`perencode sweep a.toml` (pid " \
            f"{sweep_a.pid}" in busy
    finally:
        sweep_a.communicate("", timeout=30)
    # Sweep a is gone without starting it: b trains it, through the link, once.
    assert twin_busy(shared_b, out) is None
    assert claim_at_start(own_b, out)  # a cell no other sweep claimed is b's own
    assert (own_b.dir / "recipe.toml").is_file() and not own_b.dir.is_symlink()
