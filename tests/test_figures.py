"""Figures (perencode.figures) on hand-made run directories: every figure kind is drawn from
runs whose numbers are known, without training anything. The sweep -> figures -> verify
path on real tiny runs is in test_sweep.py."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from fake_runs import fake_run
from matplotlib.image import imread

from perencode.figures import make_figures


@pytest.fixture(scope="module")
def drawn(paper_like, tmp_path_factory) -> tuple[Path, list[Path]]:
    """Every figure of `paper_like`, drawn once for the module: (folder, written files)."""
    out = tmp_path_factory.mktemp("figures")
    return out, make_figures([paper_like], out=out)


@pytest.mark.slow
def test_every_figure_is_drawn(drawn):
    _, written = drawn
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


@pytest.mark.slow
def test_table1_min_mean_max(drawn):
    out, _ = drawn
    table = pd.read_csv(out / "table1_lm_perplexity.csv").set_index("model")
    assert table.loc["Vanilla LSTM", ["test min", "test mean", "test max"]].tolist() == \
        pytest.approx([37.5, 38.5, 39.5])
    assert table.loc["Position-Encoded LSTM", "test mean"] == pytest.approx(39.5)
    assert "| Vanilla LSTM | 3 | 37.5000 |" in (out / "table1_lm_perplexity.md").read_text()


@pytest.mark.slow
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


def test_a_killed_figures_leaves_nothing_the_next_one_keeps(tmp_path):
    """Temporary files of `figures` (results*, fig*) go; those of `verify` stay."""
    fake_run(tmp_path / "runs", "a", metrics={"token_accuracy": 0.5, "dl_distance": 1.0})
    out = tmp_path / "figs"
    out.mkdir()
    ours = [out / ".results.csv.abcdefgh.tmp", out / ".fig02_reverse_vocabulary.png.x_y_z_12.tmp"]
    theirs = [out / ".verify.md.abcdefgh.tmp", out / "notes.tmp"]
    for path in ours + theirs:
        path.write_text("half")
    written = make_figures([tmp_path / "runs"], out=out)
    assert out / "results.csv" in written
    assert not any(p.exists() for p in ours) and all(p.exists() for p in theirs)
    assert not (out / ".perencode.lock").exists()
