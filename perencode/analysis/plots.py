"""The results table and the paper's figures, drawn from collected runs (perencode.analysis.results)
by `perencode figures` and `perencode report`.

`draw_figures` writes the results out (results.csv: one row per run, its grid coordinates
and metrics) and draws each figure of the paper they cover, as PNG and PDF. Figures select
runs by their recipes, not by the grid that made them, so a run shared by several figures
is drawn in each. Runs whose settings differ beyond a figure's own axes (a quick demo next
to the paper's grids) go to separate files, suffixed with the differing settings, except a
setting that takes one value in every cell of the figure's axes (the quick demo's
iterations, set per vocabulary size): those runs stay one figure and a note names the
setting. An encoding of a study's own is drawn beside vanilla and the sinusoidal PE in the
figure of its task; finished runs that no figure of the paper draws (a task of a study's
own) get one of their own, other_<task>_vocabulary. Each kind has one colour in every
figure (`_colour`). Error bars: 95% percentile-bootstrap CI of the mean over seeds, 10,000
resamples (perencode.analysis.stats).

What a figure shows is said on it: runs that are not cells of the paper's grids for the
figure (recipes/paper/figNN_*.toml, seeds aside) give a file ending in `__nonpaper` with a
subtitle naming each differing setting and the paper's value; accuracy axes span [0, 1]
with chance (1/K) dotted (reverse ordering: 1/L dashed too, the last-token plateau); each
panel states its seed count, and a point of one seed (no CI) is drawn open (a bar
hatched); panels of one metric share their y scale; the one legend sits below the panels.
"""

from __future__ import annotations

import functools
import io
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from perencode.analysis.results import (
    ORIGIN,
    Results,
    flatten,
    results_table,
    say_left_out,
)
from perencode.analysis.stats import bootstrap_ci
from perencode.common.console import console
from perencode.common.files import atomic_write_bytes, atomic_write_text, remove_stale_temps
from perencode.config import registry
from perencode.config.grid import load_grid, paper_folder
from perencode.config.naming import format_value, ordered, short_key, short_names
from perencode.config.recipe import BOOKKEEPING, KIND_SECTIONS, kind_base
from perencode.store.lock import hold

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


# Labels and orders of tasks, models and encodings come from their registrations
# (perencode.config.registry); a kind no registration knows is drawn under its raw name, last.

def _label(column: str, value) -> str:
    kind = registry.of_field(column)
    return registry.label(kind, value) if kind is not None else str(value)


# One colour per kind in every figure: a kind's index in its registry (the package's own
# first: vanilla blue, sinusoidal orange, ...), a kind no registration knows after them by a
# hash of its name, in matplotlib's ten-colour cycle.
PALETTE = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
           "tab:pink", "tab:gray", "tab:olive", "tab:cyan"]


def _colour(column: str, value) -> str | None:
    """The colour of a kind's name in every figure; None (matplotlib's cycle) for a value
    that is not a kind's."""
    kind = registry.of_field(column)
    if kind is None:
        return None
    registered = registry.names(kind)
    if value in registered:
        return PALETTE[registered.index(value) % len(PALETTE)]
    spare = max(len(PALETTE) - len(registered), 1)  # the colours no registered kind has
    index = len(registered) + zlib.crc32(str(value).encode()) % spare
    return PALETTE[index % len(PALETTE)]


def _order(column: str, values) -> list:
    """The distinct values of a column: a kind's in registration order, others as a reader
    expects them (perencode.config.naming.ordered)."""
    kind = registry.of_field(column)
    return registry.order(kind, values) if kind is not None else ordered(values)


def _subplots(nrows: int, ncols: int, width: float = 4.0, height: float = 3.2,
              sharey: bool | Literal["row"] = False):
    """Panels laid out by matplotlib's constrained layout, which keeps room for a subtitle
    and for the legend outside the panels (`_save`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper")
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(width * ncols, 5.0), height * nrows),
                             squeeze=False, sharey=sharey, layout="constrained")
    return fig, axes


def named(stem: Path, suffix: str) -> Path:
    """A figure's file: its name (`Part.stem`, which may hold a value's dot: `__lr=0.01`)
    and `suffix`, never `with_suffix`, which would cut the name at that dot."""
    return stem.with_name(stem.name + suffix)


# Said on every figure with error bars: they follow the paper's method, which is not the
# verdicts' (a percentile bootstrap over 3-5 seeds covers less than 95%; verify decides by
# one-sided t-tests, docs/claims.md#statistics).
ERROR_BARS = ("error bars: 95% percentile bootstrap over seeds (the paper's method; "
              "verdicts: verify)")


def _save(fig, stem: Path, note: str = "", error_bars: bool = True) -> list[Path]:
    """PNG and PDF of `fig`: one legend for all panels, outside them (never over data),
    `note` (how these runs differ from the paper's) as a subtitle, and the method of the
    error bars in small print as the legend's title (`error_bars`)."""
    import matplotlib.pyplot as plt


    handles: dict[str, object] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    if handles:
        # as many columns as the longest label leaves room for: a label is never cut
        longest = max(len(label) for label in handles) + 6  # the line sample's width too
        fits = max(1, int(15 * fig.get_figwidth()) // longest)
        fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                   ncol=min(len(handles), 3, fits), fontsize="small",
                   title=ERROR_BARS if error_bars else None, title_fontsize="x-small")
    elif error_bars:
        fig.text(0.005, 0.005, ERROR_BARS, ha="left", va="bottom", fontsize="x-small")
    if note:  # about 13 characters an inch at this size; a setting is not split
        lines, width = [""], int(13 * fig.get_figwidth())
        for piece in _marked(note, width).split("; "):
            joined = f"{lines[-1]}; {piece}" if lines[-1] else piece
            if len(joined) <= width or not lines[-1]:
                lines[-1] = joined
            else:
                lines[-1] += ";"
                lines.append(piece)
        fig.suptitle("\n".join(lines), color="firebrick", fontsize="medium")
    paths = [named(stem, ".png"), named(stem, ".pdf")]
    for path in paths:
        buffer = io.BytesIO()
        fig.savefig(buffer, format=path.suffix[1:], dpi=150)
        atomic_write_bytes(path, buffer.getvalue())
        # the PDF keeps the PNG's layout: constrained layout is not solved twice (a third
        # of a figure's time), and both files place every panel and label alike
        fig.set_layout_engine("none")
    plt.close(fig)
    return paths


def _marked(note: str, width: int) -> str:
    """`note` with its paper difference (paper_difference) cut to one line of `width`
    characters where it is longer: the settings' names without their values ('Not the
    paper's settings: length, hidden_size and 3 more'). The figure says that it differs and
    where; the values are said once, under it on the report's page and by `figures`."""
    if len(note) <= width or not note.startswith(NOT_PAPER):
        return note
    pieces = note.removeprefix(NOT_PAPER).split("; ")
    others = [p for p in pieces if p.startswith(TAGGED)]  # `tags`, after the settings
    names = [p.split(" ", 1)[0] for p in pieces if p not in others]
    for shown in range(len(names), 0, -1):
        line = NOT_PAPER + ", ".join(names[:shown]) + (
            f" and {len(names) - shown} more" if shown < len(names) else "")
        if len(line) <= width:
            break
    return "; ".join([line, *others])


def _archs(df: pd.DataFrame) -> list[str]:
    return registry.order("model", df["model.arch"])


def _seeds(s: pd.DataFrame, single: str) -> list[str]:
    """The seed count of a panel from its points' `n` ('3 seeds', '1-3 seeds per point'),
    and how a point of one seed (no CI) is drawn (`single`) where there is one."""
    low, high = int(s["n"].min()), int(s["n"].max())
    if high == 1:
        return [f"1 seed: no CI ({single})"]
    lines = [f"{low} seeds" if low == high else f"{low}-{high} seeds per point"]
    if low == 1:
        lines.append(f"{single}: 1 seed, no CI")
    return lines


def _titled(ax, title: str, s: pd.DataFrame, single: str) -> None:
    ax.set_title("\n".join([*([title] if title else []), *_seeds(s, single)]),
                 fontsize="medium")


def _accuracy_axis(ax, chance: dict | None = None) -> None:
    """Accuracy on [0, 1]; `chance` ({K: 1/K} along x, or {None: 1/K} for one K) dashed."""
    ax.set_ylim(0, 1)
    if not chance:
        return
    if len(chance) == 1:
        ax.axhline(next(iter(chance.values())), ls=":", color="grey", lw=1,
                   label="chance (1/K)")
    else:
        xs = sorted(chance)
        ax.plot(xs, [chance[x] for x in xs], ls=":", color="grey", lw=1,
                label="chance (1/K)")


def _last_token_plateau(ax, df: pd.DataFrame) -> None:
    """Reverse ordering at one length L: 1/L dashed, the token accuracy of a model that
    returns the last token it read (the plateau a vanilla RNN stays on at large K)."""
    names = df["task.name"].dropna().unique() if "task.name" in df else []
    lengths = df["task.length"].dropna().unique() if "task.length" in df else []
    if list(names) == ["reverse"] and len(lengths) == 1:
        ax.axhline(1 / float(lengths[0]), ls="--", color="grey", lw=0.8,
                   label="last token only (1/L)")


def _one_k(df: pd.DataFrame) -> dict | None:
    """{None: 1/K} where the rows have one vocabulary size K (chance of a uniform guess)."""
    sizes = df["task.vocab_size"].dropna().unique() if "task.vocab_size" in df else []
    return {None: 1 / float(sizes[0])} if len(sizes) == 1 else None


MARKERS = ["o", "s", "^", "D", "v", "P"]
LINESTYLES = ["-", "--", "-.", ":"]


def _lines(ax, s: pd.DataFrame, x: str, hue: str, log2: bool = False) -> None:
    """Mean with CI error bars against x, one line per hue value; a point of one seed (no
    CI) is drawn open."""
    for i, value in enumerate(_order(hue, s[hue])):
        part = s[s[hue] == value].sort_values(x)
        # Each line its own marker, dash and size, the later ones smaller and on top, so a
        # line lying on another (two encodings both at 1.0) still shows beneath it.
        marker, dashes = MARKERS[i % len(MARKERS)], LINESTYLES[i % len(LINESTYLES)]
        size = max(4.0, 8.0 - 1.2 * i)
        line = ax.errorbar(part[x], part["mean"], yerr=[part["mean"] - part["low"],
                                                        part["high"] - part["mean"]],
                           marker=marker, markersize=size, ls=dashes, capsize=3, alpha=0.9,
                           label=_label(hue, value), clip_on=False, zorder=2 + i / 10,
                           color=_colour(hue, value))
        single = part[part["n"] < 2]
        if len(single):
            ax.plot(single[x], single["mean"], marker, color=line[0].get_color(), zorder=3,
                    markersize=size, markerfacecolor="white", clip_on=False)
    if log2:
        ax.set_xscale("log", base=2)
        ticks = sorted(s[x].unique())
        ax.set_xticks(ticks, [str(int(t)) for t in ticks])
        ax.minorticks_off()


def _bars(ax, s: pd.DataFrame, x: str, hue: str, x_order: list) -> None:
    """Grouped bars with CI error bars: groups along x, one bar per hue value; a bar of one
    seed (no CI) is hatched."""
    hues = _order(hue, s[hue])
    width = 0.8 / max(1, len(hues))
    for i, value in enumerate(hues):
        part = s[s[hue] == value].set_index(x).reindex(x_order)
        pos = np.arange(len(x_order)) + (i - (len(hues) - 1) / 2) * width
        bars = ax.bar(pos, part["mean"], width, yerr=[part["mean"] - part["low"],
                                                      part["high"] - part["mean"]],
                      capsize=3, label=_label(hue, value), color=_colour(hue, value))
        for bar, n in zip(bars, part["n"]):
            if n == 1:
                bar.set_hatch("//")
    ax.set_xticks(np.arange(len(x_order)), [_label(x, v) for v in x_order])


# --------------------------------------------------------------------------------------
# The figures
# --------------------------------------------------------------------------------------

ACCURACIES = ("token_accuracy", "accuracy")  # chance level: a uniform guess, 1/K


def draw_vocabulary(metrics: list[str]) -> Callable[[pd.DataFrame, Path, str], list[Path]]:
    """Fig. 2, 7, 8, 10: metric vs vocabulary size (log2), vanilla vs PE, one column per arch
    (a row per metric, on one y scale)."""
    def draw(df: pd.DataFrame, stem: Path, note: str = "") -> list[Path]:
        archs = _archs(df)
        fig, axes = _subplots(len(metrics), len(archs), sharey="row")
        for j, arch in enumerate(archs):
            part = df[df["model.arch"] == arch]
            for i, metric in enumerate(metrics):
                ax = axes[i, j]
                s = group_ci(part, ["task.vocab_size", "encoding.kind"], metric)
                if s["task.vocab_size"].nunique() == 1:  # one K: bars side by side, not
                    _bars(ax, s, "task.vocab_size", "encoding.kind",  # points on one x
                          list(s["task.vocab_size"].unique()))
                    _titled(ax, _label("model.arch", arch), s, "hatched")
                else:
                    _lines(ax, s, "task.vocab_size", "encoding.kind", log2=True)
                    _titled(ax, _label("model.arch", arch), s, "open markers")
                ax.set_xlabel("Vocabulary size")
                ax.set_ylabel(METRICS.get(metric, metric))
                if metric in ACCURACIES:
                    _accuracy_axis(ax, {k: 1 / k for k in s["task.vocab_size"].unique()})
                    _last_token_plateau(ax, part)
        for i, metric in enumerate(metrics):  # once the row's shared scale holds every panel
            if metric not in ACCURACIES:
                axes[i, 0].set_ylim(bottom=0)
        return _save(fig, stem, note)
    return draw


def draw_dual_frequency(df: pd.DataFrame, stem: Path, note: str = "") -> list[Path]:
    """Fig. 3: target-token accuracy per target-position band, one panel per arch and
    condition (target x disturbants FREQUENT/RARE); each panel has its runs' own bands (the
    band scheme follows L, which may differ between archs)."""
    archs = _archs(df)
    conditions = sorted(set(zip(df["target"], df["disturbants"])))
    fig, axes = _subplots(len(archs), len(conditions), width=3.4)
    for i, arch in enumerate(archs):
        for j, (target, disturbants) in enumerate(conditions):
            part = df[(df["model.arch"] == arch) & (df["target"] == target)
                      & (df["disturbants"] == disturbants)]
            bands = part.drop_duplicates("band").sort_values("first")["band"].tolist()
            ax = axes[i, j]
            s = group_ci(part, ["band", "encoding.kind"], "accuracy")
            _bars(ax, s, "band", "encoding.kind", bands)
            _accuracy_axis(ax, _one_k(part))
            _titled(ax, f"{_label('model.arch', arch)}: target {target}\n"
                        f"disturbants {disturbants}", s, "hatched")
            ax.set_xlabel("Target position")
            ax.set_ylabel("Target accuracy")
    return _save(fig, stem, note)


def draw_stability(df: pd.DataFrame, stem: Path, note: str = "") -> list[Path]:
    """Fig. 5: stability (common-target comparison) over training; one row per model, one
    column per encoding, every panel on one y scale; colour = target type, line style =
    disturbant type."""
    df = df[df["comparison"] == "target"]
    archs = _archs(df)
    encodings = _order("encoding.kind", df["encoding.kind"])
    fig, axes = _subplots(len(archs), len(encodings), sharey=True)
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
            if len(s):
                _titled(ax, f"{_label('model.arch', arch)}, "
                            f"{_label('encoding.kind', encoding)}", s, "no band")
            ax.set_xlabel("Training iterations")
            ax.set_ylabel("Gradient stability")
    return _save(fig, stem, note)


def draw_by_length(df: pd.DataFrame, stem: Path, note: str = "") -> list[Path]:
    """Fig. 11: token accuracy per input length, vanilla vs PE."""
    fig, axes = _subplots(1, 1, width=5.0)
    ax = axes[0, 0]
    s = group_ci(df, ["length", "encoding.kind"], "token_accuracy")
    _lines(ax, s, "length", "encoding.kind")
    _titled(ax, "", s, "open markers")
    _accuracy_axis(ax, _one_k(df))
    ax.set_xlabel("Input length")
    ax.set_ylabel("Token accuracy")
    return _save(fig, stem, note)


def draw_encodings(x: str) -> Callable[[pd.DataFrame, Path, str], list[Path]]:
    """Fig. 12-14: token accuracy as bars, one per encoding (grouped by `x`)."""
    def draw(df: pd.DataFrame, stem: Path, note: str = "") -> list[Path]:
        fig, axes = _subplots(1, 1, width=5.5)
        ax = axes[0, 0]
        s = group_ci(df, [x, "encoding.kind"], "token_accuracy")
        order = _order(x, s[x])
        _bars(ax, s, x, "encoding.kind", order)
        _titled(ax, "", s, "hatched")
        ax.set_ylabel("Token accuracy")
        _accuracy_axis(ax, _one_k(df))
        return _save(fig, stem, note)
    return draw


def draw_lm_training(df: pd.DataFrame, stem: Path, note: str = "") -> list[Path]:
    """Fig. 15: training perplexity (exp of the logged loss), one line per seed."""
    fig, axes = _subplots(1, 1, width=6.0, height=4.0)
    ax = axes[0, 0]
    for (encoding, seed), part in df.groupby(["encoding.kind", "train.seed"]):
        ax.plot(part["step"], part["train_perplexity"], color=_colour("encoding.kind", encoding),
                alpha=0.8, lw=1, label=f"{_label('encoding.kind', encoding)} (seed {seed})")
    seeds = df.groupby("encoding.kind")["train.seed"].nunique()
    ax.set_title("(" + ", ".join(f"{_label('encoding.kind', e)}: {n} seed{'s' if n > 1 else ''}"
                                 for e, n in seeds.items()) + "; one line per seed, no CI)")
    ax.set_yscale("log")
    ax.set_xlabel("Training iterations")
    ax.set_ylabel("Training perplexity")
    return _save(fig, stem, note, error_bars=False)


def table_perplexity(df: pd.DataFrame, stem: Path, note: str = "") -> list[Path]:
    """Table 1: min / mean / max over seeds of the test (and validation) perplexity."""
    rows = []
    for encoding in _order("encoding.kind", df["encoding.kind"]):
        part = df[df["encoding.kind"] == encoding]
        row = {"model": f"{_label('encoding.kind', encoding)} LSTM", "runs": len(part)}
        for split in ("test", "valid"):
            values = part.get(f"{split}_perplexity", pd.Series(dtype=float)).dropna()
            for stat in ("min", "mean", "max"):
                row[f"{split} {stat}"] = getattr(values, stat)() if len(values) else math.nan
        rows.append(row)
    table = pd.DataFrame(rows)
    csv, md = named(stem, ".csv"), named(stem, ".md")
    atomic_write_text(csv, table.to_csv(index=False))
    header = "| " + " | ".join(table.columns) + " |\n|" + "---|" * len(table.columns) + "\n"
    body = "".join("| " + " | ".join(f"{v:.4f}" if isinstance(v, float) else str(v)
                                     for v in r) + " |\n" for r in table.itertuples(index=False))
    atomic_write_text(md, "Table 1: perplexity on WikiText-103 over seeds (min / mean / max)."
                          + (f"\n\n**{note}**" if note else "") + "\n\n" + header + body)
    return [md, csv]


def _is(column: str, *values):
    return lambda df: df[column].isin(values)


def _undrawn_of_task(name: str, undrawn: set, df: pd.DataFrame) -> pd.Series:
    """The rows of task `name` that no figure of the paper drew."""
    return _is("task.name", name)(df) & df["run"].isin(undrawn)


@dataclass
class Figure:
    name: str
    table: str                                   # a Results.table name
    select: Callable[[pd.DataFrame], pd.Series]  # on run rows
    axes: list[str]      # recipe fields the figure plots (panels, x, hue); the rest must agree
    draw: Callable[[pd.DataFrame, Path, str], list[Path]]
    requires: tuple[str, ...] = ()  # drawn only where a run has one of these encodings
    complete: bool = True           # only finished runs (False: training curves of any run)
    paper: str = ""  # its grids in recipes/paper/ ("fig02": fig02_*.toml); "" not the paper's


PE_PAIR = ("none", "sinusoidal")


def _pe_pair_or_new(df: pd.DataFrame) -> pd.Series:
    """Vanilla, sinusoidal, and the encodings of a study's own (a plugin's, or one no
    registration knows): a new encoding is drawn beside the baselines it is compared to; the
    package's other variants have figures of their own (Fig. 12-14)."""
    return df["encoding.kind"].map(lambda name: name in PE_PAIR or not registry.is_builtin(
        "encoding", name)).astype(bool)
VOCAB_AXES = ["model.arch", "task.vocab_size", "encoding.kind"]
FIGURES = [
    Figure("fig02_reverse_vocabulary", "runs",
           lambda d: _is("task.name", "reverse")(d) & _pe_pair_or_new(d),
           VOCAB_AXES,
           draw_vocabulary(["token_accuracy", "dl_distance"]), paper="fig02"),
    Figure("fig03_dual_frequency", "by_band",
           _is("task.name", "dual_frequency"), VOCAB_AXES, draw_dual_frequency, paper="fig03"),
    Figure("fig05_stability", "stability",
           _is("task.name", "dual_frequency"), VOCAB_AXES, draw_stability, paper="fig05"),
    Figure("fig07_reverse_add", "runs", _is("task.name", "reverse_add"), VOCAB_AXES,
           draw_vocabulary(["token_accuracy"]), paper="fig07"),
    Figure("fig08_sort", "runs",
           lambda d: _is("task.name", "sort")(d) & _pe_pair_or_new(d),
           VOCAB_AXES, draw_vocabulary(["token_accuracy", "dl_distance"]), paper="fig08"),
    Figure("fig10_predecessor", "runs", _is("task.name", "predecessor"), VOCAB_AXES,
           draw_vocabulary(["accuracy"]), paper="fig10"),
    Figure("fig11_variable_length", "by_length",
           lambda d: _is("task.name", "variable_length")(d) & _pe_pair_or_new(d),
           ["encoding.kind"], draw_by_length, paper="fig11"),
    Figure("fig12_double_vanilla", "runs",
           lambda d: _is("task.name", "reverse", "sort")(d)
           & _is("encoding.kind", *PE_PAIR, "duplicate")(d),
           ["task.name", "encoding.kind"], draw_encodings("task.name"), ("duplicate",),
           paper="fig12"),
    Figure("fig13_pe_variants", "runs",
           lambda d: _is("task.name", "reverse")(d) & ~_is("encoding.kind", "duplicate")(d),
           ["encoding.kind"], draw_encodings("encoding.kind"), ("random", "learnable"),
           paper="fig13"),
    Figure("fig14_pe_variants_variable_length", "runs",
           lambda d: _is("task.name", "variable_length")(d)
           & ~_is("encoding.kind", "duplicate")(d),
           ["encoding.kind"], draw_encodings("encoding.kind"), ("random", "learnable"),
           paper="fig14"),
    Figure("fig15_lm_training", "curves", _is("task.name", "lm"), ["encoding.kind"],
           draw_lm_training, complete=False, paper="fig15"),
    Figure("table1_lm_perplexity", "runs", _is("task.name", "lm"), ["encoding.kind"],
           table_perplexity, paper="fig15"),
]


def settings(df: pd.DataFrame, columns: list[str],
             axes: list[str]) -> tuple[list[tuple[str, pd.DataFrame]], list[str]]:
    """Split runs by the recipe fields (other than the figure's axes) that differ: one
    (file suffix, rows) per setting, no suffix when they all agree; and the differing fields
    that did not split because they are tied to the axes (one value in every cell of the
    axes: the quick demo trains K = 32 for fewer iterations than K = 1,024).

    Whether a field is tied is decided within each sweep's runs (their ORIGIN), and a
    sweep's runs are never split by a tied field: the runs of a folder go to the same files
    whether `figures` is given the folder or its parent, where another sweep may have taken
    other values. Sweeps whose tied fields disagree in a cell are drawn apart, each file
    named by the values its runs took (`__iterations=1500,4000`)."""
    differing = [c for c in columns if c not in axes and c not in BOOKKEEPING
                 and df[c].nunique(dropna=False) > 1]
    keys = [a for a in axes if a in df.columns]
    origins = df[ORIGIN] if ORIGIN in df.columns else pd.Series("", index=df.index)
    tied = []
    if keys and differing:
        cells = df.groupby([origins, *(df[k] for k in keys)], dropna=False)
        tied = [c for c in differing if cells[c].nunique(dropna=False).max() <= 1]
        differing = [c for c in differing if c not in tied]
    names = short_names([*differing, *tied])
    split = df.groupby(differing, dropna=False, sort=True) if differing else [((), df)]
    found: list[tuple[dict[str, str], pd.DataFrame]] = []
    for values, part in split:
        values = values if isinstance(values, tuple) else (values,)
        named = {c: format_value(v) for c, v in zip(differing, values)}
        groups = _agreeing(part, origins[part.index], keys, tied)
        apart = [c for c in tied if len({_values(g, c) for g in groups}) > 1]
        found += [({**named, **{c: _values(g, c) for c in apart}}, g) for g in groups]
    if len(found) == 1:
        return [("", df)], tied
    out: list[tuple[str, pd.DataFrame]] = []
    for named, part in found:
        suffix = "__" + "_".join(f"{names[c]}={v}" for c, v in named.items())
        taken = {name for name, _ in out}
        # two values spelt alike in a file name ("a b" and "a_b"): never one file for both
        unique = suffix if suffix not in taken else next(
            f"{suffix}_{n}" for n in range(2, len(out) + 3) if f"{suffix}_{n}" not in taken)
        out.append((unique, part))
    return out, tied


def _values(df: pd.DataFrame, column: str) -> str:
    """The values a field takes among runs, as a file name spells them: '1500,4000'."""
    shown = [_spelt(v) for v in ordered(df[column].dropna())]
    return ",".join(shown + (["unset"] if df[column].isna().any() else []))


def _agreeing(part: pd.DataFrame, origins: pd.Series, keys: list[str],
              tied: list[str]) -> list[pd.DataFrame]:
    """The runs of `part` in groups of whole sweeps (`origins`) whose `tied` fields take the
    same values in every cell of the axes both have: each sweep, in the order of their
    names, joins the first group it agrees with that took the same values (a setting like
    any other), else the first it agrees with (a sweep of a few of another's cells)."""
    if not tied:
        return [part]
    groups: list[tuple[dict, list]] = []  # (cell of the axes -> tied values, row labels)

    def taken(plan: dict) -> set:
        return set(plan.values())

    for _, sweep in part.groupby(origins, sort=True):
        plan = {tuple(map(_spelt, row[:len(keys)])): tuple(map(_spelt, row[len(keys):]))
                for row in sweep[keys + tied].itertuples(index=False)}
        agreeing = [(seen, labels) for seen, labels in groups
                    if all(seen.get(cell, values) == values for cell, values in plan.items())]
        alike = [g for g in agreeing if taken(g[0]) == taken(plan)]
        if agreeing:
            seen, labels = (alike or agreeing)[0]
            seen.update(plan)
            labels.extend(sweep.index)
        else:
            groups.append((plan, list(sweep.index)))
    return [part[part.index.isin(labels)] for _, labels in groups]


def tied_note(df: pd.DataFrame, tied: list[str], axes: list[str]) -> str:
    """'train.iterations follows vocab_size (32: 2000; 1024: 4000)' for the fields tied to
    the figure's axes that vary among these runs, '' when none does."""
    varying = [a for a in axes if a in df.columns and df[a].nunique(dropna=False) > 1]
    notes = []
    for column in (c for c in tied if df[c].nunique(dropna=False) > 1
                   and not _option_of_an_axis_kind(c, axes)):
        alone = [a for a in varying if df.groupby(a, dropna=False)[column]
                 .nunique(dropna=False).max() <= 1]
        along = alone[:1] or varying  # the one axis that decides it, where there is one
        pairs = df[along + [column]].drop_duplicates().sort_values(along)
        shown = "; ".join(", ".join(_spelt(v) for v in row[:-1]) + ": "
                          + _spelt(row[-1]) for row in pairs.itertuples(index=False))
        notes.append(f"{column} follows {', '.join(short_key(a) for a in along)} ({shown})")
    return "; ".join(notes)


def _option_of_an_axis_kind(column: str, axes: list[str]) -> bool:
    """An option of a kind the figure plots (a learned sinusoid's `encoding.base` along the
    encoding axis): it follows its kind, as nothing else can."""
    section, _, option = column.partition(".")
    if section not in KIND_SECTIONS:
        return False
    base = kind_base(section)
    return f"{section}.{base.TAG}" in axes and option not in base.model_fields


def missing_runs(df: pd.DataFrame, axes: list[str]) -> list[str]:
    """Cells of a figure without a run: per arch (its own vocabularies), the product of the
    values seen on the other axes and of the seeds seen."""
    keys = [a for a in axes if a != "model.arch"] + ["train.seed"]
    missing = []
    for arch, part in df.groupby("model.arch"):
        have = set(map(tuple, part[keys].map(str).to_numpy()))
        for cell in product(*(list(map(str, ordered(part[k]))) for k in keys)):
            if cell not in have:
                missing.append(f"arch={arch} " + " ".join(f"{short_key(k)}={v}"
                                                         for k, v in zip(keys, cell)))
    return missing


def _warn(message: str) -> None:
    console.print(f"[yellow]warning:[/] {message}", highlight=False, soft_wrap=True)


# Fields that never make runs other than the paper's: bookkeeping, and where the prepared
# data lies on this machine.
NOT_SETTINGS = (*BOOKKEEPING, "task.data")


@functools.cache
def paper_cells(prefix: str) -> pd.DataFrame:
    """Every cell of the paper's grids `recipes/paper/<prefix>_*.toml`, one row of recipe
    fields (as results.flatten spells them) per cell; empty where there is none."""
    folder = paper_folder()
    paths = sorted(folder.glob(f"{prefix}_*.toml")) if folder and prefix else []
    return pd.DataFrame([flatten(cell.recipe) for path in paths
                         for cell in load_grid(path).cells])


def _spelt(value) -> str:
    """A recipe value as compared with the paper's: 'unset' for None/NaN, 512 for 512.0."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "unset"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return format_value(value)


def _in_order(column: str, values) -> list:
    """A kind's names in registration order (gru, lstm, s4d), other values as `ordered`."""
    kind = registry.of_field(column)
    return registry.order(kind, values) if kind else ordered(values)


def _options_of_other_kinds(column: str, cells: pd.DataFrame) -> bool:
    """An option only kinds the paper's cells do not use have (minGRU's model.log_space):
    the kind's own difference (arch mingru) already says it."""
    section, _, option = column.partition(".")
    if section not in KIND_SECTIONS:
        return False
    base = kind_base(section)
    owners = base.options().get(option, [])
    tag = f"{section}.{base.TAG}"
    return bool(owners) and tag in cells.columns and not set(owners) & set(cells[tag])


def paper_difference(part: pd.DataFrame, figure: Figure, columns: list[str]) -> str:
    """How the runs of one figure file differ from the paper's grids for that figure: 'not
    the paper's settings: hidden_size 32 (paper: 512); iterations 400 (paper: 300000)', or
    '' when each run is a cell of them (seeds aside). A run is compared with the cells of
    its own model (the paper's grids differ per model); a model the figure's grids do not
    have is itself the difference."""
    cells = paper_cells(figure.paper)
    if cells.empty:
        return ""
    compared = [c for c in columns if c in cells.columns and c not in NOT_SETTINGS
                and not _options_of_other_kinds(c, cells)]
    # values in dicts (ordered sets): the subtitle reads the same in every call
    found: dict[str, tuple[dict, dict]] = {}
    for _, run in part.drop_duplicates(compared).iterrows():
        same = cells[cells["model.arch"] == run["model.arch"]]
        for column in compared:
            paper = same[column] if len(same) else cells[column]
            if _spelt(run[column]) not in set(map(_spelt, paper)):
                ours, theirs = found.setdefault(column, ({}, {}))
                ours[run[column]] = None
                theirs.update(dict.fromkeys(paper))
    if not found:
        return ""
    names = short_names(found)
    shown = [f"{names[c]} {', '.join(map(_spelt, _in_order(c, ours)))} (paper: "
             f"{', '.join(dict.fromkeys(map(_spelt, _in_order(c, theirs))))})"
             for c, (ours, theirs) in found.items()]
    return NOT_PAPER + "; ".join(shown)


NOT_PAPER = "Not the paper's settings: "
TAGGED = "Sweep tag: "


def draw_figures(results: Results, out: Path, compare_with_paper: bool = True) -> list[Path]:
    """results.csv, the per-row tables and every figure `results` cover, written to `out`;
    without `compare_with_paper` (a study of one's own) no figure is subtitled with how its
    runs differ from the paper's.

    `out` is locked meanwhile (perencode.store.lock), and what a killed `figures` left half
    written there (its temporary files, not those of `verify`) is removed first."""
    out = Path(out)
    with hold(out, "figures"):
        remove_stale_temps(out, lambda name: name.startswith(
            ("results", "other_", *(figure.name for figure in FIGURES))))
        return _make_figures(results, out, compare_with_paper)


def _shown(names: pd.Series) -> str:
    return ", ".join(names.head(5)) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _make_figures(results: Results, out: Path, compare_with_paper: bool = True) -> list[Path]:
    say_left_out(results)
    runs = results.runs
    unfinished = runs[runs["status"] == "unfinished"]
    if len(unfinished):
        _warn(f"{len(unfinished)} unfinished run(s) listed in results.csv (complete = False) "
              f"and left out of every figure but Fig. 15's training curves: "
              f"{_shown(unfinished['run'])}")
    diverged = results.diverged()
    if len(diverged):
        _warn(f"{len(diverged)} diverged run(s) listed in results.csv (status = diverged, "
              "no metrics) and never plotted: "
              + _shown(diverged["run"] + " (iteration "
                       + diverged["train_step"].map(lambda v: str(int(v))) + ")"))
    if paper_folder() is None:
        _warn("recipes/paper/ not found (beside the package or in the working directory): "
              "figures cannot say whether their runs have the paper's settings")
    written = [out / "results.csv"]
    atomic_write_text(written[0], results_table(results).to_csv(index=False))
    for name, table in sorted(results.tables.items()):
        if name != "curves":
            written.append(out / f"results_{name}.csv")
            atomic_write_text(written[-1], table.to_csv(index=False))
    drawn: set = set()
    for figure in FIGURES:
        written += _draw(figure, results, out, drawn, compare_with_paper)
    for figure in other_figures(results.runs, drawn):
        written += _draw(figure, results, out, drawn, compare_with_paper)
    earlier = sorted(p.name for p in out.iterdir() if p.suffix in (".png", ".pdf")
                     and p.name.startswith(("other_", *(f.name for f in FIGURES)))
                     and p not in written)
    if earlier:
        _warn(f"{out}: {len(earlier)} figure file(s) of an earlier `figures` call, not drawn "
              f"from these runs: {', '.join(earlier[:6])}{' ...' if len(earlier) > 6 else ''}")
    return written


def other_figures(runs: pd.DataFrame, drawn: set) -> list[Figure]:
    """A vocabulary figure per task for the finished runs no paper figure drew (a task or
    an encoding the paper does not have), so that no run is left out of the figures; only
    those runs, so that no run is drawn twice."""
    left = runs[runs["complete"] & ~runs["run"].isin(drawn)]
    metrics = [m for m in METRICS if m in left.columns and left[m].notna().any()]
    undrawn = set(left["run"])
    return [Figure(f"other_{name}_vocabulary", "runs",
                   functools.partial(_undrawn_of_task, name, undrawn),
                   VOCAB_AXES, draw_vocabulary(metrics[:2]))
            for name in registry.order("task", left["task.name"])] if metrics else []


@dataclass
class Part:
    """One file a figure draws: its runs split off by the settings beyond its axes."""
    stem: str               # file name without suffix: fig02_reverse_vocabulary[__...]
    runs: pd.DataFrame      # rows of Results.runs drawn in it
    rows: pd.DataFrame      # rows of the figure's Results table drawn in it
    note: str               # settings tied to its axes although they differ (tied_note)
    differs: str            # how its runs differ from the paper's grids ("" if they do not)
    diverged: pd.DataFrame = field(default_factory=pd.DataFrame)  # its cells' diverged runs,
                                                                  # counted, never drawn


def figure_parts(figure: Figure, results: Results) -> list[Part]:
    """The files `figure` draws from `results`: one per setting, named `__nonpaper` where
    the runs differ from the paper's grids for the figure (figures and report read this)."""
    chosen = results.runs[figure.select(results.runs)]
    diverged = chosen[chosen["status"] == "diverged"]
    if figure.complete:
        chosen = chosen[chosen["complete"]]
    if figure.requires:  # only settings with such a run; a suffix only if several do
        chosen = pd.concat([chosen.iloc[:0]] + [
            part for _, part in settings(chosen, results.recipe_columns, figure.axes)[0]
            if part["encoding.kind"].isin(figure.requires).any()])
    parts, tied = settings(chosen, results.recipe_columns, figure.axes)
    table = results.table(figure.table)
    found = []
    for suffix, part in parts:
        rows = table[table["run"].isin(part["run"])]
        if rows.empty:
            continue
        drawn = part[part["run"].isin(rows["run"])]
        differs = paper_difference(drawn, figure, results.recipe_columns)
        found.append(Part(f"{figure.name}{suffix}" + ("__nonpaper" if differs else ""), drawn,
                          rows, tied_note(part, tied, figure.axes), differs,
                          diverged[_in_setting(diverged, part, results.recipe_columns,
                                               figure.axes)]))
    return found


def _in_setting(runs: pd.DataFrame, part: pd.DataFrame, columns: list[str],
                axes: list[str]) -> pd.Series:
    """Which of `runs` have the settings of `part` (every field but the axes and the
    bookkeeping among the values its runs take)."""
    mask = pd.Series(True, index=runs.index)
    for column in columns:
        if column not in axes and column not in BOOKKEEPING:
            mask &= runs[column].map(_spelt).isin(set(part[column].map(_spelt)))
    return mask

def tags(runs: pd.DataFrame) -> str:
    """'Sweep tag: lr-low, lr-high' for runs made by tagged sweeps (`sweep --tag`), or ''."""
    found = sorted(set(runs["tag"].dropna())) if "tag" in runs.columns else []
    return f"{TAGGED}{', '.join(found)}" if found else ""


def _draw(figure: Figure, results, out: Path, drawn: set,
          compare_with_paper: bool = True) -> list[Path]:
    """Draw one figure from its runs, one file per part (figure_parts), subtitled with how
    its runs differ from the paper's; adds the runs drawn to `drawn`."""
    written: list[Path] = []
    for part in figure_parts(figure, results):
        if part.note:
            console.print(f"{part.stem}: one figure although {part.note}",
                          highlight=False, soft_wrap=True)
        lacking = missing_runs(pd.concat([part.runs, part.diverged]), figure.axes)
        if lacking:
            shown = "; ".join(lacking[:8]) + (f"; and {len(lacking) - 8} more"
                                              if len(lacking) > 8 else "")
            _warn(f"{part.stem}: drawn without {len(lacking)} missing run(s): {shown}")
        if len(part.diverged):
            keys = [a for a in figure.axes if a != "model.arch"] + ["train.seed"]
            cells = [f"arch={r['model.arch']} "
                     + " ".join(f"{short_key(k)}={_spelt(r[k])}" for k in keys)
                     + f" (iteration {int(r['train_step'])})"
                     for _, r in part.diverged.iterrows()]
            _warn(f"{part.stem}: {len(cells)} diverged run(s) in its cells, counted and not "
                  f"plotted (a loss or weight not finite): {'; '.join(cells[:8])}"
                  + (f"; and {len(cells) - 8} more" if len(cells) > 8 else ""))
        differs = part.differs if compare_with_paper else ""
        if differs:
            console.print(f"{part.stem}: {differs}", highlight=False, soft_wrap=True)
        written += figure.draw(part.rows, out / part.stem,
                               "; ".join(filter(None, [differs, tags(part.runs)])))
        drawn.update(part.rows["run"])
    return written
