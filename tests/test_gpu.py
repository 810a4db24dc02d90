"""CUDA smoke test: train, evaluate and analyse stability on a GPU at tiny size.

Marked `gpu`; skipped where no CUDA device is present (CI has none). Run it on a GPU
machine with `pytest -m gpu`.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import ROOT, assert_scores_consistent, run_cli, tiny_overrides

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("arch", ["gru", "lstm", "s4d"])
def test_train_eval_stability_on_cuda(arch, tmp_path):
    run = tmp_path / arch
    sets = tiny_overrides('task.name="dual_frequency"', "task.vocab_size=16",
                          "task.held_out_per_cell=1", f'model.arch="{arch}"',
                          "train.iterations=6", "train.checkpoint_every=3")
    code, text = run_cli("train", ROOT / "recipes/gru_dualfreq_vocab64.toml", *sets,
                         "--run-dir", run,
                         "--device", "cuda", "--no-progress")
    assert code == 0, text
    env = json.loads((run / "env.json").read_text())
    assert env["device"].startswith("cuda") and env["cuda"] is not None
    result = json.loads((run / "eval.json").read_text())
    assert result["n_sequences"] == 4 * 64  # 2 x 2 conditions x L target positions x 1
    assert_scores_consistent(result)
    code, text = run_cli("eval", run, "--device", "cuda")
    assert code == 0, text
    assert json.loads((run / "eval.json").read_text())["token_accuracy"] == \
        result["token_accuracy"]
    code, text = run_cli("stability", run, "--triplets", 4, "--device", "cuda",
                         "--no-progress")
    assert code == 0, text
    rows = (run / "stability.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 4 * 2  # header, 2 checkpoints x 4 triplets x 2 comparisons
