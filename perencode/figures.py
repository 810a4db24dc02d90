"""The results table and the paper's figures (`perencode figures`).

`make_figures` collects the runs under its paths (perencode.results) and writes them out
(results.csv: one row per run, its grid coordinates and metrics) and draws each figure of
the paper the results cover, as PNG and PDF. Figures select runs by their recipes, not by
the grid that made them, so a run shared by several figures is drawn in each. Runs whose
settings differ beyond a figure's own axes (a quick demo next to the paper's grids) go to
separate files, suffixed with the differing settings, except a setting that takes one value
in every cell of the figure's axes (the quick demo's iterations, set per vocabulary size):
those runs stay one figure and a note names the setting. Finished runs that no figure of
the paper draws (a task or an encoding of a study's own) get one of their own,
other_<task>_vocabulary. Error bars: 95% percentile-bootstrap CI of the mean over seeds,
10,000 resamples (perencode.stats).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import numpy as np
import pandas as pd

from perencode import kinds
from perencode.console import console
from perencode.io import atomic_write_bytes, atomic_write_text, remove_stale_temps
from perencode.lock import hold
from perencode.naming import format_value, short_key, short_names
from perencode.results import BOOKKEEPING, Results, collect, results_table
from perencode.stats import bootstrap_ci

# Labels and orders of tasks, models and encodings come from their registrations
# (perencode.kinds); a kind no registration knows is drawn under its raw name, last.
LABELLED = {"task.name": "task", "model.arch": "model", "encoding.kind": "encoding"}
METRICS = {"token_accuracy": "Token accuracy", "dl_distance": "Damerau-Levenshtein distance",
           "accuracy": "Accuracy"}


# --------------------------------------------------------------------------------------
# Drawing helpers
# --------------------------------------------------------------------------------------

def group_ci(df: pd.DataFrame, by: list[str], metric: str) -> pd.DataFrame:
    """Mean and 95% bootstrap CI over runs (seeds) of `metric` per `by` group."""
    out = []
    for keys, part in df.groupby(by, dropna=False, sort=True):
        mean, low, high = bootstrap_ci(part[metric].to_numpy(dtype=float))
        out.append({**dict(zip(by, keys if isinstance(keys, tuple) else (keys,))),
                    "mean": mean, "low": low, "high": high, "n": len(part)})
    return pd.DataFrame(out)


def _label(column: str, value) -> str:
    if column in LABELLED:
        return kinds.label(LABELLED[column], value)
    return str(value)


def _subplots(nrows: int, ncols: int, width: float = 4.0, height: float = 3.2):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows),
                             squeeze=False)
    return fig, axes


def _save(fig, stem: Path) -> list[Path]:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    for path in paths:
        buffer = io.BytesIO()
        fig.savefig(buffer, format=path.suffix[1:], dpi=150)
        atomic_write_bytes(path, buffer.getvalue())
    plt.close(fig)
    return paths


def _encoding_order(values) -> list[str]:
    return kinds.order("encoding", values)


def _archs(df: pd.DataFrame) -> list[str]:
    return kinds.order("model", df["model.arch"])


def _lines(ax, s: pd.DataFrame, x: str, hue: str, log2: bool = False) -> None:
    """Mean with CI error bars against x, one line per hue value."""
    for value in _encoding_order(s[hue]) if hue == "encoding.kind" else sorted(s[hue].unique()):
        part = s[s[hue] == value].sort_values(x)
        ax.errorbar(part[x], part["mean"], yerr=[part["mean"] - part["low"],
                                                 part["high"] - part["mean"]],
                    marker="o", capsize=3, label=_label(hue, value))
    if log2:
        ax.set_xscale("log", base=2)
        ticks = sorted(s[x].unique())
        ax.set_xticks(ticks, [str(int(t)) for t in ticks])
        ax.minorticks_off()


def _bars(ax, s: pd.DataFrame, x: str, hue: str, x_order: list) -> None:
    """Grouped bars with CI error bars: groups along x, one bar per hue value."""
    hues = _encoding_order(s[hue]) if hue == "encoding.kind" else sorted(s[hue].unique())
    width = 0.8 / max(1, len(hues))
    for i, value in enumerate(hues):
        part = s[s[hue] == value].set_index(x).reindex(x_order)
        pos = np.arange(len(x_order)) + (i - (len(hues) - 1) / 2) * width
        ax.bar(pos, part["mean"], width, yerr=[part["mean"] - part["low"],
                                               part["high"] - part["mean"]],
               capsize=3, label=_label(hue, value))
    ax.set_xticks(np.arange(len(x_order)), [_label(x, v) for v in x_order])


# --------------------------------------------------------------------------------------
# The figures
# --------------------------------------------------------------------------------------

def draw_vocabulary(metrics: list[str]) -> Callable[[pd.DataFrame, Path], list[Path]]:
    """Fig. 2, 7, 8, 10: metric vs vocabulary size (log2), vanilla vs PE, one column per arch."""
    def draw(df: pd.DataFrame, stem: Path) -> list[Path]:
        archs = _archs(df)
        fig, axes = _subplots(len(metrics), len(archs))
        for j, arch in enumerate(archs):
            part = df[df["model.arch"] == arch]
            for i, metric in enumerate(metrics):
                ax = axes[i, j]
                s = group_ci(part, ["task.vocab_size", "encoding.kind"], metric)
                _lines(ax, s, "task.vocab_size", "encoding.kind", log2=True)
                ax.set_title(_label("model.arch", arch))
                ax.set_xlabel("Vocabulary size")
                ax.set_ylabel(METRICS.get(metric, metric))
        axes[0, 0].legend()
        return _save(fig, stem)
    return draw


def draw_dual_frequency(df: pd.DataFrame, stem: Path) -> list[Path]:
    """Fig. 3: target-token accuracy per target-position band, one panel per arch and
    condition (target x disturbants FREQUENT/RARE)."""
    archs = _archs(df)
    conditions = sorted(set(zip(df["target"], df["disturbants"])))
    bands = df.drop_duplicates("band").sort_values("first")["band"].tolist()
    fig, axes = _subplots(len(archs), len(conditions), width=3.4)
    for i, arch in enumerate(archs):
        for j, (target, disturbants) in enumerate(conditions):
            part = df[(df["model.arch"] == arch) & (df["target"] == target)
                      & (df["disturbants"] == disturbants)]
            ax = axes[i, j]
            _bars(ax, group_ci(part, ["band", "encoding.kind"], "accuracy"), "band",
                  "encoding.kind", bands)
            ax.set_ylim(0, 1.05)
            ax.set_title(f"{_label('model.arch', arch)}: target {target}\n"
                         f"disturbants {disturbants}")
            ax.set_xlabel("Target position")
            ax.set_ylabel("Target accuracy")
    axes[0, 0].legend(fontsize="small")
    return _save(fig, stem)


def draw_stability(df: pd.DataFrame, stem: Path) -> list[Path]:
    """Fig. 5: stability (common-target comparison) over training; one row per model, one
    column per encoding; colour = target type, line style = disturbant type."""
    df = df[df["comparison"] == "target"]
    archs = _archs(df)
    encodings = _encoding_order(df["encoding.kind"])
    fig, axes = _subplots(len(archs), len(encodings))
    colours = {"FREQUENT": "tab:blue", "RARE": "tab:red"}
    styles = {"FREQUENT": "-", "RARE": "--"}
    for i, arch in enumerate(archs):
        for j, encoding in enumerate(encodings):
            ax = axes[i, j]
            part = df[(df["model.arch"] == arch) & (df["encoding.kind"] == encoding)]
            s = group_ci(part, ["target", "disturbants", "iteration"], "stability")
            for (target, disturbants), line in s.groupby(["target", "disturbants"]):
                ax.plot(line["iteration"], line["mean"], styles.get(disturbants, ":"),
                        color=colours.get(target), label=f"target {target}, disturbants "
                                                         f"{disturbants}")
                ax.fill_between(line["iteration"], line["low"], line["high"],
                                color=colours.get(target), alpha=0.15)
            ax.set_title(f"{_label('model.arch', arch)}, {_label('encoding.kind', encoding)}")
            ax.set_xlabel("Training iterations")
            ax.set_ylabel("Gradient stability")
    axes[0, 0].legend(fontsize="small")
    return _save(fig, stem)


def draw_by_length(df: pd.DataFrame, stem: Path) -> list[Path]:
    """Fig. 11: token accuracy per input length, vanilla vs PE."""
    fig, axes = _subplots(1, 1, width=5.0)
    _lines(axes[0, 0], group_ci(df, ["length", "encoding.kind"], "token_accuracy"), "length",
           "encoding.kind")
    axes[0, 0].set_xlabel("Input length")
    axes[0, 0].set_ylabel("Token accuracy")
    axes[0, 0].legend()
    return _save(fig, stem)


def draw_encodings(x: str) -> Callable[[pd.DataFrame, Path], list[Path]]:
    """Fig. 12-14: token accuracy as bars, one per encoding (grouped by `x`)."""
    def draw(df: pd.DataFrame, stem: Path) -> list[Path]:
        fig, axes = _subplots(1, 1, width=5.5)
        s = group_ci(df, [x, "encoding.kind"], "token_accuracy")
        order = sorted(s[x].unique(), key=str) if x != "encoding.kind" else \
            _encoding_order(s[x])
        _bars(axes[0, 0], s, x, "encoding.kind", order)
        axes[0, 0].set_ylabel("Token accuracy")
        axes[0, 0].set_ylim(0, 1.05)
        axes[0, 0].legend(fontsize="small")
        return _save(fig, stem)
    return draw


def draw_lm_training(df: pd.DataFrame, stem: Path) -> list[Path]:
    """Fig. 15: training perplexity (exp of the logged loss), one line per seed."""
    fig, axes = _subplots(1, 1, width=6.0, height=4.0)
    ax = axes[0, 0]
    colours = {"none": "tab:blue", "sinusoidal": "tab:orange"}
    for (encoding, seed), part in df.groupby(["encoding.kind", "train.seed"]):
        ax.plot(part["step"], part["train_perplexity"], color=colours.get(encoding),
                alpha=0.8, lw=1, label=f"{_label('encoding.kind', encoding)} (seed {seed})")
    ax.set_yscale("log")
    ax.set_xlabel("Training iterations")
    ax.set_ylabel("Training perplexity")
    ax.legend(fontsize="x-small", ncol=2)
    return _save(fig, stem)


def table_perplexity(df: pd.DataFrame, stem: Path) -> list[Path]:
    """Table 1: min / mean / max over seeds of the test (and validation) perplexity."""
    rows = []
    for encoding in _encoding_order(df["encoding.kind"]):
        part = df[df["encoding.kind"] == encoding]
        row = {"model": f"{_label('encoding.kind', encoding)} LSTM", "runs": len(part)}
        for split in ("test", "valid"):
            values = part.get(f"{split}_perplexity", pd.Series(dtype=float)).dropna()
            for stat in ("min", "mean", "max"):
                row[f"{split} {stat}"] = getattr(values, stat)() if len(values) else math.nan
        rows.append(row)
    table = pd.DataFrame(rows)
    csv, md = stem.with_suffix(".csv"), stem.with_suffix(".md")
    atomic_write_text(csv, table.to_csv(index=False))
    header = "| " + " | ".join(table.columns) + " |\n|" + "---|" * len(table.columns) + "\n"
    body = "".join("| " + " | ".join(f"{v:.4f}" if isinstance(v, float) else str(v)
                                     for v in r) + " |\n" for r in table.itertuples(index=False))
    atomic_write_text(md, "Table 1: perplexity on WikiText-103 over seeds (min / mean / max)."
                          "\n\n" + header + body)
    return [md, csv]


def _is(column: str, *values):
    return lambda df: df[column].isin(values)


@dataclass
class Figure:
    name: str
    table: str                                   # a Results.table name
    select: Callable[[pd.DataFrame], pd.Series]  # on run rows
    axes: list[str]      # recipe fields the figure plots (panels, x, hue); the rest must agree
    draw: Callable[[pd.DataFrame, Path], list[Path]]
    requires: tuple[str, ...] = ()  # drawn only where a run has one of these encodings
    complete: bool = True           # only finished runs (False: training curves of any run)


PE_PAIR = ("none", "sinusoidal")
VOCAB_AXES = ["model.arch", "task.vocab_size", "encoding.kind"]
FIGURES = [
    Figure("fig02_reverse_vocabulary", "runs",
           lambda d: _is("task.name", "reverse")(d) & _is("encoding.kind", *PE_PAIR)(d),
           VOCAB_AXES,
           draw_vocabulary(["token_accuracy", "dl_distance"])),
    Figure("fig03_dual_frequency", "by_band",
           _is("task.name", "dual_frequency"), VOCAB_AXES, draw_dual_frequency),
    Figure("fig05_stability", "stability",
           _is("task.name", "dual_frequency"), VOCAB_AXES, draw_stability),
    Figure("fig07_reverse_add", "runs", _is("task.name", "reverse_add"), VOCAB_AXES,
           draw_vocabulary(["token_accuracy"])),
    Figure("fig08_sort", "runs",
           lambda d: _is("task.name", "sort")(d) & _is("encoding.kind", *PE_PAIR)(d),
           VOCAB_AXES, draw_vocabulary(["token_accuracy", "dl_distance"])),
    Figure("fig10_predecessor", "runs", _is("task.name", "predecessor"), VOCAB_AXES,
           draw_vocabulary(["accuracy"])),
    Figure("fig11_variable_length", "by_length",
           lambda d: _is("task.name", "variable_length")(d)
           & _is("encoding.kind", *PE_PAIR)(d),
           ["encoding.kind"], draw_by_length),
    Figure("fig12_double_vanilla", "runs",
           lambda d: _is("task.name", "reverse", "sort")(d)
           & _is("encoding.kind", *PE_PAIR, "duplicate")(d),
           ["task.name", "encoding.kind"], draw_encodings("task.name"), ("duplicate",)),
    Figure("fig13_pe_variants", "runs",
           lambda d: _is("task.name", "reverse")(d) & ~_is("encoding.kind", "duplicate")(d),
           ["encoding.kind"], draw_encodings("encoding.kind"), ("random", "learnable")),
    Figure("fig14_pe_variants_variable_length", "runs",
           lambda d: _is("task.name", "variable_length")(d)
           & ~_is("encoding.kind", "duplicate")(d),
           ["encoding.kind"], draw_encodings("encoding.kind"), ("random", "learnable")),
    Figure("fig15_lm_training", "curves", _is("task.name", "lm"), ["encoding.kind"],
           draw_lm_training, complete=False),
    Figure("table1_lm_perplexity", "runs", _is("task.name", "lm"), ["encoding.kind"],
           table_perplexity),
]


def settings(df: pd.DataFrame, columns: list[str],
             axes: list[str]) -> tuple[list[tuple[str, pd.DataFrame]], list[str]]:
    """Split runs by the recipe fields (other than the figure's axes) that differ: one
    (file suffix, rows) per setting, no suffix when they all agree; and the differing fields
    that did not split because they are tied to the axes (one value in every cell of the
    axes: the quick demo trains K = 32 for fewer iterations than K = 1,024)."""
    differing = [c for c in columns if c not in axes and c not in BOOKKEEPING
                 and df[c].nunique(dropna=False) > 1]
    keys = [a for a in axes if a in df.columns]
    tied = []
    if keys and differing:
        cells = df.groupby(keys, dropna=False)
        tied = [c for c in differing if cells[c].nunique(dropna=False).max() <= 1]
        differing = [c for c in differing if c not in tied]
    if not differing:
        return [("", df)], tied
    names = short_names(differing)
    out = []
    for values, part in df.groupby(differing, dropna=False, sort=True):
        values = values if isinstance(values, tuple) else (values,)
        out.append(("__" + "_".join(f"{names[c]}={format_value(v)}"
                                    for c, v in zip(differing, values)), part))
    return out, tied


def tied_note(df: pd.DataFrame, tied: list[str], axes: list[str]) -> str:
    """'train.iterations follows vocab_size (32: 2000; 1024: 4000)' for the fields tied to
    the figure's axes that vary among these runs, '' when none does."""
    varying = [a for a in axes if a in df.columns and df[a].nunique(dropna=False) > 1]
    notes = []
    for column in (c for c in tied if df[c].nunique(dropna=False) > 1):
        alone = [a for a in varying if df.groupby(a, dropna=False)[column]
                 .nunique(dropna=False).max() <= 1]
        along = alone[:1] or varying  # the one axis that decides it, where there is one
        pairs = df[along + [column]].drop_duplicates().sort_values(along)
        shown = "; ".join(", ".join(format_value(v) for v in row[:-1]) + ": "
                          + format_value(row[-1]) for row in pairs.itertuples(index=False))
        notes.append(f"{column} follows {', '.join(short_key(a) for a in along)} ({shown})")
    return "; ".join(notes)


def missing_runs(df: pd.DataFrame, axes: list[str]) -> list[str]:
    """Cells of a figure without a run: per arch (its own vocabularies), the product of the
    values seen on the other axes and of the seeds seen."""
    keys = [a for a in axes if a != "model.arch"] + ["train.seed"]
    missing = []
    for arch, part in df.groupby("model.arch"):
        have = set(map(tuple, part[keys].map(str).to_numpy()))
        for cell in product(*(sorted(part[k].map(str).unique()) for k in keys)):
            if cell not in have:
                missing.append(f"arch={arch} " + " ".join(f"{short_key(k)}={v}"
                                                         for k, v in zip(keys, cell)))
    return missing


def _warn(message: str) -> None:
    console.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)


def make_figures(runs: list[Path], out: Path = Path("figures")) -> list[Path]:
    """results.csv, the per-row tables and every figure the runs under `runs` cover.

    `out` is locked meanwhile (perencode.lock), and what a killed `figures` left half
    written there (its temporary files, not those of `verify`) is removed first."""
    results = collect([Path(p) for p in runs])
    out = Path(out)
    with hold(out, "figures"):
        remove_stale_temps(out, lambda name: name.startswith(
            ("results", *(figure.name for figure in FIGURES))))
        return _make_figures(results, out)


def _make_figures(results: Results, out: Path) -> list[Path]:
    for line in results.duplicates:
        _warn(f"ignored a second run of the same recipe: {line}")
    written = [out / "results.csv"]
    atomic_write_text(written[0], results_table(results).to_csv(index=False))
    for name, table in sorted(results.tables.items()):
        if name != "curves":
            written.append(out / f"results_{name}.csv")
            atomic_write_text(written[-1], table.to_csv(index=False))
    drawn: set = set()
    for figure in FIGURES:
        written += _draw(figure, results, out, drawn)
    for figure in other_figures(results.runs, drawn):
        written += _draw(figure, results, out, drawn)
    return written


def other_figures(runs: pd.DataFrame, drawn: set) -> list[Figure]:
    """A vocabulary figure per task for the finished runs no paper figure drew (a task or
    an encoding the paper does not have), so that no run is left out of the figures."""
    left = runs[runs["complete"] & ~runs["run"].isin(drawn)]
    metrics = [m for m in METRICS if m in left.columns and left[m].notna().any()]
    return [Figure(f"other_{name}_vocabulary", "runs", _is("task.name", name), VOCAB_AXES,
                   draw_vocabulary(metrics[:2]))
            for name in kinds.order("task", left["task.name"])] if metrics else []


def _draw(figure: Figure, results, out: Path, drawn: set) -> list[Path]:
    """Draw one figure from its runs, one file per setting; adds the runs drawn to `drawn`."""
    written: list[Path] = []
    chosen = results.runs[figure.select(results.runs)]
    if figure.complete:
        chosen = chosen[chosen["complete"]]
    if figure.requires:  # only settings with such a run; a suffix only if several do
        chosen = pd.concat([chosen.iloc[:0]] + [
            part for _, part in settings(chosen, results.recipe_columns, figure.axes)[0]
            if part["encoding.kind"].isin(figure.requires).any()])
    parts, tied = settings(chosen, results.recipe_columns, figure.axes)
    for suffix, part in parts:
        rows = results.table(figure.table)
        rows = rows[rows["run"].isin(part["run"])]
        if rows.empty:
            continue
        note = tied_note(part, tied, figure.axes)
        if note:
            console.print(f"{figure.name}{suffix}: one figure although {note}",
                          highlight=False, soft_wrap=True)
        lacking = missing_runs(part[part["run"].isin(rows["run"])], figure.axes)
        if lacking:
            shown = "; ".join(lacking[:8]) + (f"; and {len(lacking) - 8} more"
                                              if len(lacking) > 8 else "")
            _warn(f"{figure.name}{suffix}: drawn without {len(lacking)} missing run(s): "
                  f"{shown}")
        written += figure.draw(rows, out / f"{figure.name}{suffix}")
        drawn.update(rows["run"])
    return written
