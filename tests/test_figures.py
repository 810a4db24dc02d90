"""Figures (perencode.analysis.plots) on hand-made run directories: every figure kind is drawn from
runs whose numbers are known, without training anything. The sweep -> figures -> verify
path on real tiny runs is in test_sweep.py."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT
from fake_runs import fake_run
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.image import imread

from perencode.analysis import plots
from perencode.commands.figures import make_figures
from perencode.config.grid import load_grid
from perencode.config.recipe import validate


def drawing(runs: list[Path], out: Path) -> tuple[list[Path], dict[str, Figure]]:
    """make_figures, and each matplotlib figure it saved by file stem (read back: axes'
    limits, titles, legends)."""
    saved: dict[str, Figure] = {}
    save = plots._save

    def keep(fig, stem, note="", **options):
        saved[stem.name] = fig
        return save(fig, stem, note, **options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(plots, "_save", keep)
        written = make_figures(runs, out=out)
    return written, saved


# The figures `drawn` saved, by file stem (read by `drawing_saved`), and what it printed.
SAVED: dict[str, Figure] = {}
PRINTED: list[str] = []


@pytest.fixture(scope="module")
def drawn(paper_like, tmp_path_factory) -> tuple[Path, list[Path]]:
    """Every figure of `paper_like`, drawn once for the module: (folder, written files)."""
    out = tmp_path_factory.mktemp("figures")
    with contextlib.redirect_stderr(io.StringIO()) as printed:
        written, saved = drawing([paper_like], out)
    SAVED.update(saved)
    PRINTED.append(printed.getvalue())
    return out, written


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
            "results_stability.csv", "table1_lm_perplexity__nonpaper.md",
            "table1_lm_perplexity__nonpaper.csv"} <= names


@pytest.mark.slow
def test_table1_min_mean_max(drawn):
    out, _ = drawn
    table = pd.read_csv(out / "table1_lm_perplexity__nonpaper.csv").set_index("model")
    assert table.loc["Vanilla LSTM", ["test min", "test mean", "test max"]].tolist() == \
        pytest.approx([37.5, 38.5, 39.5])
    assert table.loc["Position-Encoded LSTM", "test mean"] == pytest.approx(39.5)
    assert "| Vanilla LSTM | 3 | 37.5000 |" in \
        (out / "table1_lm_perplexity__nonpaper.md").read_text()


@pytest.mark.slow
def test_missing_cells_are_warned_and_settings_split(paper_like, tmp_path, capsys):
    demo = tmp_path / "demo"
    fake_run(demo, "small", hidden=16, metrics={"token_accuracy": 0.5, "dl_distance": 1.0})
    # Fig. 2's runs only: the warning and the split are Fig. 2's (every figure: `drawn`).
    written = make_figures([paper_like / "fig2", demo], out=tmp_path / "figs")
    err = capsys.readouterr().err
    assert "1 missing run(s): arch=gru vocab_size=64 encoding=sinusoidal seed=333" in err
    # The hidden-16 demo run is drawn apart from the paper-sized runs.
    fig2 = sorted(p.name for p in written if p.name.startswith("fig02") and p.suffix == ".png")
    assert fig2 == ["fig02_reverse_vocabulary__hidden_size=16__nonpaper.png",
                    "fig02_reverse_vocabulary__hidden_size=512__nonpaper.png"]


@pytest.mark.slow
@pytest.mark.compat
def test_the_pdf_places_every_panel_where_the_pngs_layout_put_it(tmp_path):
    """_save solves the constrained layout for the PNG (room for the legend below and the
    subtitle above) and draws the PDF with the same positions."""
    def figure():
        fig, axes = plots._subplots(1, 2)
        for ax in axes.flat:
            ax.plot([1, 10, 100], [0.2, 0.5, 0.9], label="Sinusoidal PE")
            ax.set_xscale("log")
            ax.set_ylabel("Token accuracy")
        return fig

    fig, positions = figure(), []
    savefig = fig.savefig

    def saving(*args, **options):
        savefig(*args, **options)
        positions.append([ax.get_position().bounds for ax in fig.axes])

    fig.savefig = saving
    paths = plots._save(fig, tmp_path / "fig02_reverse", note="Not the paper's settings: x")
    assert [p.name for p in paths] == ["fig02_reverse.png", "fig02_reverse.pdf"]
    assert paths[1].read_bytes().startswith(b"%PDF") and imread(paths[0]).shape[2] == 4
    assert len(positions) == 2 and positions[0] == positions[1]
    unlaid = figure()
    unlaid.set_layout_engine("none")
    default = [ax.get_position().bounds for ax in unlaid.axes]
    legend = fig.legends[0].get_window_extent(FigureCanvasAgg(fig).get_renderer())
    assert positions[0] != default and all(
        not legend.overlaps(ax.get_window_extent()) for ax in fig.axes)


def test_no_runs_is_an_error(tmp_path):
    from perencode.common.errors import UserError

    with pytest.raises(UserError, match="no run directories"):
        make_figures([tmp_path], out=tmp_path / "figs")


@pytest.mark.slow
@pytest.mark.compat
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


# -- What a figure shows (issue: figures say what they show) ---------------------------------

def _panels(fig) -> list:
    return [ax for ax in fig.axes if ax.get_title()]


def _saved(drawn, prefix: str):
    (name,) = [n for n in drawing_saved() if n.startswith(prefix)]
    return drawing_saved()[name]


def drawing_saved() -> dict[str, Figure]:
    return SAVED


@pytest.mark.slow
def test_accuracy_axes_span_zero_to_one_with_chance_drawn(drawn):
    fig = _saved(drawn, "fig02")
    accuracy = [ax for ax in fig.axes if ax.get_ylabel() == "Token accuracy"]
    assert accuracy and all(ax.get_ylim() == (0.0, 1.0) for ax in accuracy)
    (chance,) = [line for line in accuracy[0].get_lines()
                 if line.get_label() == "chance (1/K)"]
    assert list(chance.get_xdata()) == [32, 64]
    assert list(chance.get_ydata()) == pytest.approx([1 / 32, 1 / 64])
    # Reverse ordering: the plateau of returning the last token, 1/L (L = 64 here).
    (plateau,) = [line for line in accuracy[0].get_lines()
                  if line.get_label() == "last token only (1/L)"]
    assert list(plateau.get_ydata()) == pytest.approx([1 / 64, 1 / 64])
    sort = [ax for ax in _saved(drawn, "fig08").axes if ax.get_ylabel() == "Token accuracy"]
    assert sort and not [line for ax in sort for line in ax.get_lines()
                         if line.get_label() == "last token only (1/L)"]
    for prefix, label in (("fig03", "Target accuracy"), ("fig11", "Token accuracy"),
                          ("fig13", "Token accuracy"), ("fig12", "Token accuracy")):
        panels = [ax for ax in _saved(drawn, prefix).axes if ax.get_ylabel() == label]
        assert panels and all(ax.get_ylim() == (0.0, 1.0) for ax in panels), prefix
    # Fig. 3 at K = 64: chance is one level, 1/64.
    levels = {tuple(line.get_ydata()) for ax in _saved(drawn, "fig03").axes
              for line in ax.get_lines() if line.get_label() == "chance (1/K)"}
    assert levels == {(1 / 64, 1 / 64)}


@pytest.mark.slow
def test_every_panel_states_its_seed_count(drawn):
    for name, fig in drawing_saved().items():
        for ax in _panels(fig):
            assert "seed" in ax.get_title(), (name, ax.get_title())
    # Fig. 2's GRU at K = 64 with PE lacks seed 333: 2 or 3 seeds per point.
    titles = [ax.get_title() for ax in _saved(drawn, "fig02").axes]
    assert titles[0] == "GRU\n2-3 seeds per point"
    assert "3 seeds" in _saved(drawn, "fig03").axes[0].get_title()


@pytest.mark.slow
@pytest.mark.compat
def test_every_figure_with_error_bars_names_their_method(drawn):
    from perencode.analysis.plots import ERROR_BARS

    assert "percentile bootstrap" in ERROR_BARS and "the paper's method" in ERROR_BARS
    for name, fig in drawing_saved().items():
        said = [legend.get_title().get_text() for legend in fig.legends]
        said += [t.get_text() for t in fig.texts]
        assert said.count(ERROR_BARS) == (0 if name.startswith("fig15") else 1), name


@pytest.mark.slow
def test_a_point_of_one_seed_is_marked_as_having_no_ci(tmp_path):
    for seed in (111, 222):
        for enc in ("none", "sinusoidal"):
            for vocab in (32, 64):  # two K: lines (one K is drawn as bars, hatched)
                if (seed, enc, vocab) != (222, "sinusoidal", 32):
                    fake_run(tmp_path / "runs", f"{enc}/{vocab}/{seed}", encoding=enc,
                             seed=seed, vocab=vocab,
                             metrics={"token_accuracy": 0.5, "dl_distance": 1.0})
    _, saved = drawing([tmp_path / "runs"], tmp_path / "figs")
    (fig,) = saved.values()
    ax = fig.axes[0]
    assert ax.get_title() == "GRU\n1-2 seeds per point\nopen markers: 1 seed, no CI"
    open_points = [line for line in ax.get_lines() if line.get_markerfacecolor() == "white"]
    assert len(open_points) == 1 and list(open_points[0].get_ydata()) == [0.5]  # type: ignore[arg-type]


def _paper_cell_runs(root: Path, grid: str, hidden: int | None = None) -> Path:
    """Runs of every cell of one paper grid, optionally at another hidden size."""
    for cell in load_grid(ROOT / "recipes/paper" / grid).cells:
        recipe = cell.recipe
        if hidden is not None:
            recipe = recipe.model_copy(update={"model": recipe.model.model_copy(
                update={"hidden_size": hidden})})
        fake_run(root, cell.name, recipe=recipe,
                 metrics={"token_accuracy": 0.9, "dl_distance": 1.0})
    return root


@pytest.mark.slow
def test_runs_of_the_papers_settings_get_the_papers_name_and_others_say_how_they_differ(
        tmp_path, capsys):
    written, saved = drawing([_paper_cell_runs(tmp_path / "paper", "fig02_gru_reverse.toml")],
                             tmp_path / "a")
    assert sorted(p.name for p in written if p.suffix == ".png") == [
        "fig02_reverse_vocabulary.png"]
    assert saved["fig02_reverse_vocabulary"]._suptitle is None  # type: ignore[attr-defined]
    written, saved = drawing([_paper_cell_runs(tmp_path / "small", "fig02_gru_reverse.toml",
                                               hidden=32)], tmp_path / "b")
    assert sorted(p.name for p in written if p.suffix == ".png") == [
        "fig02_reverse_vocabulary__nonpaper.png"]
    title = saved["fig02_reverse_vocabulary__nonpaper"]._suptitle  # type: ignore[attr-defined]
    subtitle = title.get_text()
    assert subtitle == "Not the paper's settings: hidden_size 32 (paper: 512)"
    assert "fig02_reverse_vocabulary__nonpaper: Not the paper's settings: hidden_size 32 " \
        "(paper: 512)" in " ".join(capsys.readouterr().err.split())


@pytest.mark.slow
def test_comparable_panels_share_their_y_axis(drawn, tmp_path):
    # Fig. 5: vanilla ends at 0.2, PE at 0.9; both panels read on one scale.
    limits = {ax.get_ylim() for ax in _saved(drawn, "fig05").axes if ax.get_title()}
    assert len(limits) == 1
    # Fig. 2's DL-distance row across models with very different distances.
    for arch, distance in (("gru", 2.0), ("lstm", 40.0)):
        for enc in ("none", "sinusoidal"):
            fake_run(tmp_path / "runs", f"{arch}/{enc}", arch=arch, encoding=enc,
                     metrics={"token_accuracy": 0.5, "dl_distance": distance})
    _, saved = drawing([tmp_path / "runs"], tmp_path / "figs")
    (fig,) = saved.values()
    rows: dict = {}
    for ax in _panels(fig):
        rows.setdefault(ax.get_ylabel(), set()).add(ax.get_ylim())
    assert all(len(limits) == 1 for limits in rows.values()), rows
    assert rows["Damerau-Levenshtein distance"].pop()[1] >= 40.0


def _bands(length: int, width: int) -> list[dict]:
    return [{"target": t, "disturbants": d, "band": f"{a}-{a + width - 1}", "first": a,
             "last": a + width - 1, "accuracy": 0.9, "n": 16}
            for t in ("frequent", "rare") for d in ("frequent", "rare")
            for a in range(1, length + 1, width)]


@pytest.mark.slow
def test_each_panel_has_one_band_scheme(tmp_path):
    """A GRU grid at L = 64 (bands of 16) and an LSTM grid at L = 8 (bands of 2) in one
    Fig. 3: each panel's target positions are its own runs' bands."""
    for arch, length, width in (("gru", 64, 16), ("lstm", 8, 2)):
        for enc in ("none", "sinusoidal"):
            fake_run(tmp_path / "runs", f"{arch}/{enc}", arch=arch, encoding=enc,
                     task="dual_frequency", task_extra={"length": length},
                     metrics={"token_accuracy": 0.9, "by_band": _bands(length, width)})
    _, saved = drawing([tmp_path / "runs"], tmp_path / "figs")
    (name,) = [n for n in saved if n.startswith("fig03")]
    for ax in _panels(saved[name]):
        labels = [t.get_text() for t in ax.get_xticklabels()]
        expected = {"GRU": ["1-16", "17-32", "33-48", "49-64"],
                    "LSTM": ["1-2", "3-4", "5-6", "7-8"]}[ax.get_title().split(":")[0]]
        assert labels == expected, ax.get_title()


@pytest.mark.slow
def test_no_run_is_drawn_twice_and_no_file_repeats_another(tmp_path):
    """Sort runs at two iteration counts (two Fig. 8 files) and one with an encoding no
    paper figure draws for sort: its own other_ figure holds that run only."""
    for iterations in (100, 1000):
        for enc in ("none", "sinusoidal"):
            recipe = validate({"task": {"name": "sort", "vocab_size": 32, "length": 64},
                               "encoding": {"kind": enc},
                               "train": {"iterations": iterations}}, "x")
            fake_run(tmp_path / "runs", f"{iterations}/{enc}", recipe=recipe,
                     metrics={"token_accuracy": 0.5, "dl_distance": 1.0})
    recipe = validate({"task": {"name": "sort", "vocab_size": 32, "length": 64},
                       "encoding": {"kind": "random"}, "train": {"iterations": 100}}, "x")
    fake_run(tmp_path / "runs", "100/random", recipe=recipe,
             metrics={"token_accuracy": 0.7, "dl_distance": 1.0})
    written, saved = drawing([tmp_path / "runs"], tmp_path / "figs")
    pngs = [p for p in written if p.suffix == ".png"]
    assert len({p.read_bytes() for p in pngs}) == len(pngs)
    assert len(set(written)) == len(written)
    (other,) = [n for n in saved if n.startswith("other_")]
    # One K: bars, whose error bars are unlabelled containers of their own.
    labels = {line.get_label() for ax in saved[other].axes for line in ax.containers
              if not str(line.get_label()).startswith("_")}
    assert labels == {"Random PE"}


@pytest.mark.slow
def test_legends_never_cover_data(drawn):
    for name, fig in drawing_saved().items():
        assert all(ax.get_legend() is None for ax in fig.axes), name
        if not fig.legends:
            continue
        canvas = FigureCanvasAgg(fig)  # the saved figure is closed: draw it again
        canvas.draw()
        renderer = canvas.get_renderer()
        legend = fig.legends[0].get_window_extent(renderer)
        for ax in fig.axes:
            assert not legend.overlaps(ax.get_window_extent(renderer)), name


@pytest.mark.slow
def test_unfinished_runs_in_results_are_named(paper_like, drawn):
    out, _ = drawn  # make_figures([paper_like]), and what it printed
    err = " ".join(PRINTED[0].split())
    assert "1 unfinished run(s) listed in results.csv (complete = False)" in err
    assert f"{paper_like}/unfinished" in err
    table = pd.read_csv(out / "results.csv")
    assert list(table.loc[~table["complete"], "run"]) == [str(paper_like / "unfinished")]
    assert "origin" not in table.columns  # a folder of this machine, only for grouping


def test_a_sweeps_runs_are_split_alike_with_or_without_other_sweeps():
    """plots.settings over runs of several sweeps (the ORIGIN column): a field tied to the
    figure's axis within each sweep never splits a sweep; sweeps that disagree in a cell go
    to files named by the values each took; a sweep that took one value joins the group of
    that value, not merely the first it agrees with."""
    from perencode.analysis.plots import settings
    from perencode.analysis.results import ORIGIN

    def runs(origin: str, column: str, by_k: dict) -> list[dict]:
        return [{ORIGIN: origin, "task.vocab_size": k, "model.arch": "gru", column: v,
                 "train.seed": seed} for k, v in by_k.items() for seed in (111, 222)]

    columns = ["task.vocab_size", "model.arch", "train.iterations"]
    axes = ["model.arch", "task.vocab_size"]
    demo = runs("runs/x/quick", "train.iterations", {32: 1500, 1024: 4000})
    short = runs("runs/y/quick", "train.iterations", {32: 200, 1024: 200})
    alone, tied = settings(pd.DataFrame(demo), columns, axes)
    assert [(s, len(p)) for s, p in alone] == [("", 4)] and tied == ["train.iterations"]
    both, tied = settings(pd.DataFrame(demo + short), columns, axes)
    assert [(s, sorted(set(p[ORIGIN]))) for s, p in both] == [
        ("__iterations=1500,4000", ["runs/x/quick"]), ("__iterations=200", ["runs/y/quick"])]
    assert tied == ["train.iterations"]
    # One value each (an lr per sweep): grouped by value, whatever the sweeps' order.
    lr = ["task.vocab_size", "model.arch", "optim.lr"]
    frame = pd.DataFrame(runs("1", "optim.lr", {32: 0.02}) + runs("2", "optim.lr", {32: 0.01})
                         + runs("3", "optim.lr", {64: 0.01}))
    parts, _ = settings(frame, lr, axes)
    assert [(s, sorted(set(p[ORIGIN]))) for s, p in parts] == [
        ("__lr=0.02", ["1"]), ("__lr=0.01", ["2", "3"])]
