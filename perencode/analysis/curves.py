"""Learning curves from the runs' own metrics.jsonl, for report.html: what a researcher used
to TensorBoard or Weights & Biases looks at first after a sweep, without a server.

`draw_curves(runs, recipe_columns)` draws, for the runs of one figure, one panel per
setting of its axes but one (the hue: the encoding where it varies) and a row per metric:
training loss, training accuracy, and each held-out score logged every train.eval_every.
Each cell is one colour and line style (its kind's colour in every figure,
perencode.analysis.plots): its seeds thin and faint, their mean bold. The mean is taken at the steps
every seed of the cell logged, so a seed that stopped early does not bend it.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import pandas as pd

from perencode.analysis.plots import _colour, _label, _order, _subplots
from perencode.config.naming import format_value, short_names
from perencode.config.recipe import BOOKKEEPING
from perencode.store import runs as run_dirs
from perencode.store.records import HELD_OUT

# The metrics.jsonl columns drawn, in order, with their axis labels; held-out scores
# (train.eval_every) follow, as many as were logged.
TRAINING = {"loss": "Training loss", "accuracy": "Training accuracy"}
STYLES = ["-", "--", "-.", ":"]
FACETS_PER_ROW = 4


def read_curves(paths: list[str]) -> pd.DataFrame:
    """One row per logged step of each run: run, step and the logged metrics (empty if no run
    has logged a step)."""
    frames = [pd.DataFrame([row.as_dict() for row in rows]).assign(run=path)
              for path in paths if (rows := run_dirs.Run(Path(path)).metrics())]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def varying(runs: pd.DataFrame, columns: list[str]) -> list[str]:
    """The recipe fields (seed and bookkeeping aside) that take more than one value among
    `runs`: what tells their cells apart."""
    return [c for c in columns if c in runs and c not in BOOKKEEPING and c != "train.seed"
            and runs[c].map(format_value).nunique() > 1]


def cell_label(row: pd.Series, columns: list[str]) -> str:
    """'vocab_size=64, encoding=Sinusoidal': a cell by the fields that tell it apart."""
    names = short_names(columns)
    return ", ".join(f"{names[c]}={_label(c, row[c])}" for c in columns) or "all runs"


def metric_columns(curves: pd.DataFrame) -> list[str]:
    found = [c for c in TRAINING if c in curves and curves[c].notna().any()]
    return found + sorted(c for c in curves.columns if c.startswith(HELD_OUT)
                          and curves[c].notna().any())


def _axis_label(metric: str) -> str:
    if metric in TRAINING:
        return TRAINING[metric]
    return "Held-out " + metric.removeprefix(HELD_OUT).replace("_", " ")


def draw_curves(runs: pd.DataFrame, columns: list[str]) -> bytes | None:
    """A PNG of the learning curves of `runs` (rows of Results.runs), or None when none of
    them logged a step."""
    curves = read_curves(list(runs["run"]))
    if curves.empty:
        return None
    keep = ["run", *dict.fromkeys(["train.seed", *[c for c in columns if c in runs]])]
    curves = curves.merge(runs[keep], on="run")
    metrics = metric_columns(curves)
    differ = varying(runs, columns)
    hue = "encoding.kind" if "encoding.kind" in differ else (differ[-1] if differ else None)
    facet_keys = [c for c in differ if c != hue]
    facets = (list(curves.groupby([curves[c].map(format_value) for c in facet_keys],
                                  sort=False))
              if facet_keys else [((), curves)])
    ordered_facets = sorted(facets, key=lambda item: [_sort_key(v) for v in _tuple(item[0])])
    ncols = min(len(ordered_facets), FACETS_PER_ROW)
    blocks = math.ceil(len(ordered_facets) / ncols)
    fig, axes = _subplots(blocks * len(metrics), ncols, width=3.6, height=2.6)
    hues = _order(hue, curves[hue].dropna()) if hue else [None]
    for f, (_, facet) in enumerate(ordered_facets):
        block, col = divmod(f, ncols)
        title = cell_label(facet.iloc[0], facet_keys) if facet_keys else ""
        seeds = facet["train.seed"].nunique()
        for m, metric in enumerate(metrics):
            ax = axes[block * len(metrics) + m, col]
            for h, value in enumerate(hues):
                cell = facet if hue is None else facet[facet[hue] == value]
                _draw_cell(ax, cell, metric, value, hue, STYLES[h % len(STYLES)])
            ax.set_ylabel(_axis_label(metric), fontsize="small")
            if m == 0:
                ax.set_title(f"{title}\n" * bool(title) + f"{seeds} seed{'s' * (seeds > 1)}: "
                             "thin, mean bold", fontsize="small")
            if m == len(metrics) - 1:
                ax.set_xlabel("Training iterations", fontsize="small")
            if metric == "loss" and facet[metric].dropna().gt(0).all():
                ax.set_yscale("log")  # a loss falls by orders of magnitude
                ax.yaxis.set_major_formatter(_plain_log()())
                ax.yaxis.set_minor_formatter(_plain_log()(minor_thresholds=(2, 0.5)))
    for f in range(len(ordered_facets), blocks * ncols):  # empty places of the last row
        for m in range(len(metrics)):
            axes[(f // ncols) * len(metrics) + m, f % ncols].set_visible(False)
    return _png(fig)


def _plain_log():
    """matplotlib's log-axis labels (minor ones where the axis spans under two decades) as
    plain numbers, 3 and 0.6, not 3x10^0 and 6e-01."""
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):
        def _num_to_string(self, x, vmin, vmax):
            return f"{x:g}"

    return Plain


def _tuple(key) -> tuple:
    return key if isinstance(key, tuple) else (key,)


def _sort_key(value: str) -> tuple:
    """Numbers by value, then words: 32 before 1024."""
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def mean_curve(cell: pd.DataFrame, metric: str) -> pd.Series:
    """The mean over a cell's runs of `metric` at each step, at the steps every run logged
    (a seed that stopped early, or logged more often, does not bend it)."""
    cell = cell.dropna(subset=[metric])
    every = cell.groupby("step")["run"].nunique()
    shared = every[every == cell["run"].nunique()].index
    return cell[cell["step"].isin(shared)].groupby("step")[metric].mean()


def _draw_cell(ax, cell: pd.DataFrame, metric: str, value, hue: str | None,
               style: str) -> None:
    """One cell: each seed thin and faint, the mean over seeds bold, in the cell's colour."""
    cell = cell.dropna(subset=[metric])
    if cell.empty:
        return
    colour = _colour(hue, value) if hue else "tab:blue"
    for _, seed in cell.groupby("run"):
        ax.plot(seed["step"], seed[metric], color=colour, lw=0.8, alpha=0.35, ls=style)
    mean = mean_curve(cell, metric)
    label = _label(hue, value) if hue else "mean over seeds"
    ax.plot(mean.index, mean.to_numpy(), color=colour, lw=2.2, ls=style, label=label)


def _png(fig) -> bytes:
    """The figure as PNG bytes, its one legend below the panels, never over a curve."""
    import matplotlib.pyplot as plt

    handles: dict[str, object] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                   ncol=min(len(handles), 4), fontsize="small")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()
