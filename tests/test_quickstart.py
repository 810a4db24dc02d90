"""The quick demo (perencode.quickstart): which demo runs where, and that both are valid."""

from __future__ import annotations

import pytest
import torch
from conftest import ROOT

from perencode.errors import UserError
from perencode.grid import load_grid
from perencode.quickstart import DEMOS, choose_demo
from perencode.verify import load_claims


def test_auto_picks_the_gpu_demo_only_where_cuda_is_present():
    assert choose_demo("auto", cuda_available=False).name == "cpu"
    assert choose_demo("auto", cuda_available=True).name == "cuda"
    assert choose_demo("cpu", cuda_available=True).name == "cpu"
    assert choose_demo("cuda", cuda_available=True).device == "cuda"
    with pytest.raises(UserError, match="--device cuda: no CUDA device is available"):
        choose_demo("cuda", cuda_available=False)
    with pytest.raises(UserError, match="expected auto, cpu or cuda"):
        choose_demo("tpu", cuda_available=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_the_cli_chooses_the_cpu_demo(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no recipes/ here: the chosen demo's grid is reported
    code, text = cli("quickstart", "--device", "auto")
    assert code == 2 and "recipes/quick/quickstart.toml: not found" in text
    code, text = cli("quickstart", "--device", "cuda")
    assert code == 2 and "no CUDA device is available" in text


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_demos_are_valid_grids_with_claims(name):
    demo = DEMOS[name]
    grid = load_grid(ROOT / demo.grid)
    assert len(grid.cells) == 12  # 2 K x 2 encodings x 3 seeds
    assert {c.recipe.train.seed for c in grid.cells} == {111, 222, 333}
    assert {c.recipe.encoding.kind for c in grid.cells} == {"none", "sinusoidal"}
    assert load_claims(ROOT / demo.claims)
    if name == "cuda":  # the paper's shapes (Fig. 2, GRU)
        r = grid.cells[0].recipe
        assert (r.model.embed_size, r.model.hidden_size, r.task.length,
                r.train.batch_size, r.optim.lr) == (512, 512, 64, 512, 1e-3)
