"""Results table and figures (perencode.figures) on hand-made run directories: every figure
kind is drawn from runs whose numbers are known, without training anything. The sweep ->
figures -> verify path on real tiny runs is in test_sweep.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.image import imread

from perencode.figures import collect, make_figures, results_table
from perencode.recipe import validate

SEEDS = (111, 222, 333)


def fake_run(root: Path, name: str, *, task: str = "reverse", arch: str = "gru",
             encoding: str = "none", vocab: int = 32, seed: int = 111, hidden: int = 512,
             task_extra: dict | None = None, metrics: dict | None = None,
             stability: pd.DataFrame | None = None, curve: list[float] | None = None,
             finished: bool = True) -> Path:
    """A run directory as `perencode train` leaves it: recipe.toml, metrics.jsonl, the
    final checkpoint (its name is what makes a run complete) and eval.json."""
    task_cfg = {"name": task, "vocab_size": vocab, "length": 16 if task in (
        "reverse_add", "predecessor") else 64, **(task_extra or {})}
    if task == "lm":
        task_cfg["data"] = "data/none"
    recipe = validate({"task": task_cfg, "model": {"arch": arch, "hidden_size": hidden},
                       "encoding": {"kind": encoding},
                       "train": {"iterations": 200, "seed": seed, "log_every": 100}}, name)
    run = root / name
    (run / "checkpoints").mkdir(parents=True)
    (run / "recipe.toml").write_text(recipe.to_toml())
    losses = curve or [2.0, 1.0]
    rows = [{"step": 100 * (i + 1), "loss": loss, "accuracy": 0.5, "lr": 1e-3,
             "seconds": 10.0 * (i + 1)} for i, loss in enumerate(losses)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        (run / "checkpoints" / "step-200.pt").write_bytes(b"")
        (run / "eval.json").write_text(json.dumps(
            {"task": task, "arch": arch, "encoding": encoding, "vocab_size": vocab,
             "seed": seed, **(metrics or {})}))
    if stability is not None:
        stability.to_csv(run / "stability.csv", index=False)
    return run


def by_band(good: float, bad: float) -> list[dict]:
    """Dual-frequency rows (types spelt as perencode.tasks.dual_frequency writes them): `bad`
    accuracy for frequent targets among rare disturbants at t = 1..16, `good` elsewhere."""
    rows = []
    for target in ("frequent", "rare"):
        for dist in ("frequent", "rare"):
            for first in (1, 17, 33, 49):
                acc = bad if (target, dist, first) == ("frequent", "rare", 1) else good
                rows.append({"target": target, "disturbants": dist, "band": f"{first}-"
                             f"{first + 15}", "first": first, "last": first + 15,
                             "accuracy": acc, "n": 256})
    return rows


def stability_rows(start: float, end: float) -> pd.DataFrame:
    """Two checkpoints, two triplets per condition; RARE disturbants go from start to end."""
    rows = []
    for iteration, rare in ((100, start), (200, end)):
        for target in ("frequent", "rare"):
            for dist in ("frequent", "rare"):
                for triplet in range(2):
                    for comparison in ("target", "suffix"):
                        rows.append({"iteration": iteration, "comparison": comparison,
                                     "target": target, "disturbants": dist,
                                     "triplet": triplet,
                                     "stability": rare if dist == "rare" else 0.95})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def paper_like(tmp_path_factory) -> Path:
    """A small stand-in for the paper's grids: Fig. 2 (GRU, two K), Fig. 3 and 5 (GRU
    dual frequency), Fig. 11/14 (variable length), Fig. 12/13, Fig. 15 / Table 1, Fig. 7, 8,
    10; one GRU Fig. 2 cell (K = 64, PE, seed 333) is missing."""
    root = tmp_path_factory.mktemp("runs")
    for i, seed in enumerate(SEEDS):
        for vocab, pe_acc, van_acc in ((32, 0.99, 0.98), (64, 0.97, 0.60)):
            for enc, acc in (("sinusoidal", pe_acc), ("none", van_acc)):
                if (vocab, enc, seed) == (64, "sinusoidal", 333):
                    continue
                fake_run(root, f"fig2/{vocab}/{enc}/{seed}", encoding=enc, vocab=vocab,
                         seed=seed, metrics={"token_accuracy": acc + 0.001 * i,
                                             "dl_distance": (1 - acc) * 64})
        for enc, good, bad, st_end in (("sinusoidal", 0.99, 0.97, 0.9), ("none", 0.95, 0.3, 0.2)):
            fake_run(root, f"fig3/{enc}/{seed}", encoding=enc, vocab=64, seed=seed,
                     task_extra={"dual_frequency": True},
                     metrics={"token_accuracy": good, "by_band": by_band(good, bad)},
                     stability=stability_rows(0.8, st_end))
        for enc, good in (("sinusoidal", 0.9), ("none", 0.4), ("random", 0.6),
                          ("learnable", 0.5)):
            lengths = [{"length": n, "token_accuracy": good - (n - 32) / 200,
                        "n": 1024} for n in (32, 48, 64)]
            fake_run(root, f"varlen/{enc}/{seed}", arch="lstm", encoding=enc, vocab=16384,
                     seed=seed, task_extra={"min_length": 32},
                     metrics={"token_accuracy": good, "by_length": lengths})
        for enc, acc in (("none", 0.5), ("sinusoidal", 0.9), ("random", 0.8),
                         ("learnable", 0.7), ("duplicate", 0.5)):
            fake_run(root, f"fig13/{enc}/{seed}", arch="lstm", encoding=enc, vocab=16384,
                     seed=seed, metrics={"token_accuracy": acc, "dl_distance": 10.0})
        for enc, ppl, curve in (("none", 37.5, [6.0, 4.0, 3.6]), ("sinusoidal", 38.5,
                                                                   [5.0, 3.9, 3.65])):
            fake_run(root, f"lm/{enc}/{seed}", task="lm", arch="lstm", encoding=enc,
                     vocab=32768, seed=seed, curve=curve,
                     metrics={"test_perplexity": ppl + i, "valid_perplexity": ppl + i + 0.5})
        for task, vocabs, metric in (("reverse_add", (896, 1088), "token_accuracy"),
                                     ("sort", (32, 256), "token_accuracy"),
                                     ("predecessor", (512, 1024), "accuracy")):
            for vocab in vocabs:
                for enc in ("none", "sinusoidal"):
                    fake_run(root, f"{task}/{vocab}/{enc}/{seed}", task=task,
                             arch="lstm", encoding=enc, vocab=vocab, seed=seed,
                             metrics={metric: 0.9 if enc == "sinusoidal" else 0.6,
                                      "dl_distance": 3.0})
    fake_run(root, "unfinished", seed=999, finished=False)
    return root


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


def test_results_table_names_the_grid_coordinates(paper_like):
    table = results_table(collect([paper_like]))
    assert list(table.columns[:6]) == ["run", "task", "vocab_size", "arch", "encoding",
                                       "seed"] or {"task", "vocab_size", "arch", "encoding",
                                                   "seed"} <= set(table.columns)
    assert {"min_length", "dual_frequency", "token_accuracy", "train_seconds"} <= \
        set(table.columns)
    assert table["train_seconds"].iloc[0] == pytest.approx(20.0)


def test_every_figure_is_drawn(paper_like, tmp_path):
    written = make_figures([paper_like], out=tmp_path)
    names = {p.name for p in written}
    for stem in ("fig02_reverse_vocabulary", "fig03_dual_frequency", "fig05_stability",
                 "fig07_reverse_add", "fig08_sort", "fig10_predecessor",
                 "fig11_variable_length", "fig12_double_vanilla", "fig13_pe_variants",
                 "fig14_pe_variants_variable_length", "fig15_lm_training"):
        for ext in (".png", ".pdf"):
            assert any(n.startswith(stem) and n.endswith(ext) for n in names), (stem, names)
    for path in written:
        assert path.exists() and path.stat().st_size > 0
        if path.suffix == ".png":
            image = imread(path)
            assert image.ndim == 3 and image.shape[0] > 100
    assert {"results.csv", "results_by_band.csv", "results_by_length.csv",
            "results_stability.csv", "table1_lm_perplexity.md",
            "table1_lm_perplexity.csv"} <= names


def test_table1_min_mean_max(paper_like, tmp_path):
    make_figures([paper_like], out=tmp_path)
    table = pd.read_csv(tmp_path / "table1_lm_perplexity.csv").set_index("model")
    assert table.loc["Vanilla LSTM", ["test min", "test mean", "test max"]].tolist() == \
        pytest.approx([37.5, 38.5, 39.5])
    assert table.loc["Position-Encoded LSTM", "test mean"] == pytest.approx(39.5)
    assert "| Vanilla LSTM | 3 | 37.5000 |" in (tmp_path / "table1_lm_perplexity.md").read_text()


def test_missing_cells_are_warned_and_settings_split(paper_like, tmp_path, capsys):
    demo = tmp_path / "demo"
    fake_run(demo, "small", hidden=16, metrics={"token_accuracy": 0.5, "dl_distance": 1.0})
    written = make_figures([paper_like, demo], out=tmp_path / "figs")
    err = capsys.readouterr().err
    assert "1 missing run(s): arch=gru vocab_size=64 encoding=sinusoidal seed=333" in err
    # The hidden-16 demo run is drawn apart from the paper-sized runs.
    fig2 = sorted(p.name for p in written if p.name.startswith("fig02") and p.suffix == ".png")
    assert fig2 == ["fig02_reverse_vocabulary__hidden_size=16.png",
                    "fig02_reverse_vocabulary__hidden_size=512.png"]


def test_no_runs_is_an_error(tmp_path):
    from perencode.errors import UserError

    with pytest.raises(UserError, match="no run directories"):
        make_figures([tmp_path], out=tmp_path / "figs")
