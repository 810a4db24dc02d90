"""Collecting finished runs into tables (perencode.analysis.results) on hand-made run
directories."""

from __future__ import annotations

import math

import pytest
from fake_runs import SEEDS

from perencode.analysis.results import collect, results_table


@pytest.mark.slow
@pytest.mark.compat
def test_collect_one_row_per_run(paper_like):
    results = collect([paper_like])
    per_seed = 4 + 2 + 4 + 5 + 2 + 3 * 2 * 2  # fig2, fig3, varlen, fig13, lm, three tasks
    assert len(results.runs) == per_seed * len(SEEDS) - 1 + 1  # a fig2 cell less, unfinished
    assert set(results.tables) >= {"by_band", "by_length", "stability", "curves"}
    # Stability: the mean over triplets of each checkpoint and condition.
    st = results.tables["stability"]
    assert len(st) == 2 * 2 * 2 * 2 * 2 * len(SEEDS)  # it x cmp x target x dist x (enc) x seed
    assert set(st["n"]) == {2}
    # Curves exist for language models only; their training perplexity is exp(loss).
    curves = results.table("curves")
    assert set(curves["task.name"]) == {"lm"}
    assert curves["train_perplexity"].iloc[0] == pytest.approx(math.exp(curves["loss"].iloc[0]))
    assert not results.runs.set_index("train.seed").loc[999, "complete"]


@pytest.mark.slow
@pytest.mark.compat
def test_results_table_names_the_grid_coordinates(paper_like):
    table = results_table(collect([paper_like]))
    identity = ["task", "vocab_size", "arch", "encoding", "seed"]
    assert table.columns[0] == "run"
    assert [c for c in table.columns if c in identity] == identity  # in the recipe's order
    assert {"length", "min_length", "token_accuracy", "train_seconds"} <= \
        set(table.columns)
    assert "hidden_size" not in table.columns  # the same in every run: no column
    assert table["train_seconds"].iloc[0] == pytest.approx(20.0)
