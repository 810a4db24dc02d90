"""One page for a reviewer (`perencode report`): report.html beside the figures.

`make_report` draws the figures (perencode.analysis.plots, into the same folder), checks the
claims (perencode.analysis.verdicts, nothing written but the page) and writes `report.html`: a
summary of the verdicts; then each figure with the claims it supports beside it (a claim
stands beside the figure drawing the largest share of the runs its verdict rests on, the
one its `source` cites first) and the runs behind it (count, seeds, sizes, devices, code
commits, fingerprints (perencode.store.identity), device-hours: training wall time summed over
the runs); the claims that rest on no drawn figure; and the claims not run, grouped by
their reason. The page is self-contained: images inline as base64 PNG, styles inline,
nothing fetched, so it can be mailed or opened offline. verify.md / verify.json and the
PNG/PDF files stay the formats for people and machines that prefer them.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from perencode.analysis.curves import draw_curves, varying
from perencode.analysis.plots import (
    FIGURES,
    Figure,
    draw_figures,
    figure_parts,
    other_figures,
)
from perencode.analysis.results import Results, collect
from perencode.analysis.verdicts import (
    BUNDLED_CLAIMS,
    FAIL,
    INCONCLUSIVE,
    NOT_RUN,
    PASS,
    RULE,
    Checked,
    Outcome,
    adjusted,
    check_claims,
    paper_interval,
    reproduced,
    tested,
)
from perencode.common import defaults
from perencode.common.console import console
from perencode.common.errors import UserError
from perencode.common.files import atomic_write_text, remove_stale_temps
from perencode.config import plugins, registry
from perencode.config.naming import format_value, short_key
from perencode.store import runs as run_dirs
from perencode.store.lock import hold

REPORT = "report.html"
# The sizes a reader compares with the paper's first (hidden size 512, L = 64, 300,000
# iterations for most figures): a demo or a shrunk sweep shows it here at once.
SETTINGS = ("model.hidden_size", "model.embed_size", "task.length", "train.iterations",
            "train.batch_size")
COLOURS = {PASS: "#1a7f37", FAIL: "#cf222e", INCONCLUSIVE: "#9a6700", NOT_RUN: "#6e7781"}


@dataclass
class Panel:
    """One drawn figure file and the runs drawn in it."""
    stem: str           # file name without suffix: fig02_reverse_vocabulary
    image: Path | None  # its PNG (None for a table)
    runs: pd.DataFrame  # rows of Results.runs
    table: str          # the Results table it draws (runs, by_band, stability, ...)
    note: str = ""      # settings that differ among its runs yet drawn together
    differs: str = ""   # how its runs differ from the paper's grids for the figure
    diverged: int = 0   # diverged runs of its cells (counted, not drawn)


def panels(results: Results, written: list[Path]) -> list[Panel]:
    """The figures `figures` wrote, in the paper's order, each with the runs drawn in it."""
    files = {p.name: p for p in written}
    found: list[Panel] = []
    drawn: set = set()

    def add(figures: list[Figure]) -> None:
        for figure in figures:
            for part in figure_parts(figure, results):
                if f"{part.stem}.png" in files or f"{part.stem}.csv" in files:
                    found.append(Panel(part.stem, files.get(f"{part.stem}.png"), part.runs,
                                       figure.table, part.note, part.differs,
                                       len(part.diverged)))
                    drawn.update(part.runs["run"])

    add(FIGURES)
    add(other_figures(results.runs, drawn))
    return found


def provenance(part: pd.DataFrame) -> dict:
    """Count, seeds, devices, commits, fingerprints and device-hours of the runs in `part`
    (devices and commits from each run's env.json, fingerprints from its identity.json,
    device-hours from its logged training time)."""
    devices: dict[str, int] = {}
    commits: dict[str, int] = {}
    used: dict[str, int] = {}
    for run in part["run"]:
        for plugin in _plugins_of(Path(run)):
            used[plugin] = used.get(plugin, 0) + 1
        try:
            env = (found.as_dict() if (found := run_dirs.env_record(run)) else {})
        except UserError as exc:  # provenance only: the report goes on without it
            console.print(f"[yellow]note:[/] {exc}; its device and commit are shown as not "
                          "recorded", highlight=False, soft_wrap=True)
            env = {}
        device = env.get("device")
        name = env.get("device_name")
        label = f"{device} ({name})" if device and name else (device or "not recorded")
        devices[label] = devices.get(label, 0) + 1
        commit = env.get("git_commit")
        commit = commit[:10] if isinstance(commit, str) and commit else "not recorded"
        if env.get("git_dirty"):
            commit += " (edited checkout)"
        commits[commit] = commits.get(commit, 0) + 1
    seconds = part["train_seconds"].fillna(0).sum() if "train_seconds" in part else 0.0
    # A run read with other code than made it (--accept-code) is marked beside its own.
    accepted = part.get("code_changes_accepted", pd.Series([None] * len(part)))
    fingerprints = sorted({f"{found} (other code accepted)" if isinstance(other, str) else found
                           for found, other in zip(part.get("fingerprint", []), accepted)})
    if "code_differs" in part and part["code_differs"].any():  # perencode.analysis.results
        fingerprints.append("(runs of one cell made by different code)")
    shown = {short_key(c): _distinct(part[c]) for c in SETTINGS if c in part}
    return {"runs": len(part), "seeds": sorted(int(s) for s in part["train.seed"].unique()),
            "settings": {k: v for k, v in shown.items() if v}, "devices": devices,
            "commits": commits, "fingerprints": fingerprints, "plugins": used,
            "device_hours": float(seconds) / 3600,
            "tags": sorted(set(part["tag"].dropna())) if "tag" in part else []}


def _plugins_of(run: Path) -> list[str]:
    """The plugins a run's kinds came from (RUN_DIR/plugins.json), as 'perencode_minrnn.plugin
    (perencode-minrnn 0.1.0)'; only read."""
    try:
        record = run_dirs.recorded_plugins(run)
    except UserError:
        return ["unreadable plugins.json"]
    return [plugins.Plugin(**entry.origin()).describe() for entry in
            (record.plugins if record else []) if entry.module]


def _distinct(column: pd.Series) -> str:
    """'2000, 4000': the values taken, integers as integers (a column with gaps is float)."""
    values = [v.item() if hasattr(v, "item") else v for v in sorted(column.dropna().unique())]
    return ", ".join(format_value(int(v) if isinstance(v, float) and v.is_integer() else v)
                     for v in values)


# --------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------

STYLE = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px;
       color: #1f2328; background: #fff; max-width: 1500px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 32px;
  border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
.meta, .rule { color: #59636e; font-size: 13px; }
.summary { font-size: 16px; margin: 12px 0; padding: 10px 14px; background: #f6f8fa;
           border: 1px solid #d0d7de; border-radius: 6px; }
.demo { font-weight: bold; color: #9a6700; }
.figure img { max-width: 100%; border: 1px solid #d0d7de; }
.side h3 { font-size: 15px; margin: 12px 0 4px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
table.claims { width: 100%; }
.claims td:first-child { width: 38%; } .claims td:nth-child(2) { width: 22%; }
th, td { border: 1px solid #d0d7de; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
.verdict { font-weight: bold; color: #fff; padding: 1px 6px; border-radius: 4px;
           white-space: nowrap; }
.runs { display: grid; grid-template-columns: 120px auto; gap: 2px 8px; margin: 0;
        font-size: 14px; }
.runs dt { font-weight: bold; } .runs dd { margin: 0; }
li { margin-bottom: 6px; }
.note { color: #9a6700; font-size: 14px; }
details.curves summary { cursor: pointer; color: #59636e; font-size: 14px; margin: 8px 0; }
table.sortable th { cursor: pointer; white-space: nowrap; }
table.sortable th[data-order="up"]::after { content: " \\25B2"; }
table.sortable th[data-order="down"]::after { content: " \\25BC"; }
.wide { overflow-x: auto; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
"""


def _e(text) -> str:
    return html.escape(str(text))


def _badge(verdict: str) -> str:
    return f'<span class="verdict" style="background:{COLOURS[verdict]}">{_e(verdict)}</span>'


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{_e(k)} (&times;{n})" if len(counts) > 1 else _e(k)
                     for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _runs_box(part: pd.DataFrame, diverged: int = 0) -> str:
    p = provenance(part)
    return ('<dl class="runs">'
            f'<dt>runs</dt><dd>{p["runs"]}</dd>'
            + (f'<dt>diverged</dt><dd>{diverged} more, not drawn (a loss or weight not '
               'finite)</dd>' if diverged else "") +
            f'<dt>seeds</dt><dd>{_e(", ".join(map(str, p["seeds"])))}</dd>'
            + (f'<dt>sweep tag</dt><dd>{_e(", ".join(p["tags"]))}</dd>' if p["tags"] else "")
            + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in p["settings"].items())
            + f'<dt>devices</dt><dd>{_counted(p["devices"])}</dd>'
            f'<dt>commits</dt><dd>{_counted(p["commits"])}</dd>'
            f'<dt>fingerprints</dt><dd>{_e(", ".join(p["fingerprints"]))}</dd>'
            + (f'<dt>plugins</dt><dd>{_counted(p["plugins"])}</dd>' if p["plugins"] else "")
            + f'<dt>device-hours</dt><dd>{p["device_hours"]:.3g}</dd></dl>')


def _claims_table(outcomes: list[Outcome], framing: str = "paper") -> str:
    """The claims with their verdicts; a column of the paper's values only where a claim
    has one, and the measured value called 'reproduced' only in a paper's reproduction."""
    if not outcomes:
        return '<p class="meta">No claim rests on these runs.</p>'
    paper = any(o.claim.paper for o in outcomes)
    rows = "".join(
        f"<tr><td><b>{_e(o.claim.id)}</b><br>{_e(o.claim.statement)}</td>"
        + (f"<td>{_e(o.claim.paper)}</td>" if paper else "")
        + f"<td>{_e(reproduced(o))}</td><td>{_e(o.method)}<br><i>tests</i> {_e(tested(o))}"
        + (f"<br>{_e(adjusted(o))}" if o.tested else "")
        + f"</td><td>{_e(paper_interval(o))}</td>"
        f"<td>{_badge(o.verdict)}</td></tr>" for o in outcomes)
    measured = "measured" if framing == OWN else "reproduced"
    return ('<table class="claims"><tr><th>claim</th>' + ("<th>paper</th>" if paper else "")
            + f"<th>{measured} [one-sided bounds]</th><th>decided by</th>"
            "<th>paper's bootstrap 95% CI</th><th>verdict</th></tr>"
            f"{rows}</table>")


def _cited_not_run(stem: str, checked: Checked) -> str:
    """The claims about this figure (their `source` cites it) that were not run."""
    ids = [o.claim.id for o in checked.outcomes
           if o.verdict == NOT_RUN and _cited(stem, o.claim.source)]
    if not ids:
        return ""
    return (f'<p class="meta">Not run, though about this figure ({len(ids)}): '
            f'{_e(", ".join(ids))}; the reasons are under <a href="#not-run">Claims not '
            "run</a>.</p>")


def _image(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{_e(path.stem)}" src="data:image/png;base64,{data}">'


def _table_file(out: Path, stem: str) -> str:
    """A table `figures` wrote as CSV (Table 1), as an HTML table."""
    frame = pd.read_csv(out / f"{stem}.csv")
    return frame.to_html(index=False, float_format=lambda v: f"{v:.4f}", border=0)


def _cited(stem: str, source: str) -> bool:
    """Whether a claim's `source` ("Appendix B, Fig. 11; ...") names this figure file."""
    found = re.match(r"(fig|table)(\d+)", stem)
    if not found:
        return False
    word = "Fig." if found.group(1) == "fig" else "Table"
    return re.search(rf"\b{re.escape(word)} {int(found.group(2))}\b", source) is not None


def placed(decided: list[Outcome], found: list[Panel]) -> dict[str, list[Outcome]]:
    """Panel stem -> the claims shown beside it: each claim goes to the figure(s) drawing
    the largest share of the runs its verdict rests on; among those, first the figure its
    `source` cites, then one of the claim's own table (Fig. 5's stability claims rest on
    Fig. 3's runs too, Fig. 11's and Fig. 14's share theirs)."""
    beside: dict[str, list[Outcome]] = {p.stem: [] for p in found}
    for outcome in decided:
        rested = set(outcome.runs)
        scores = {p.stem: (len(rested & set(p.runs["run"])) / max(len(rested), 1),
                           _cited(p.stem, outcome.claim.source),
                           p.table == outcome.claim.table) for p in found}
        best = max(scores.values(), default=(0, False, False))
        if best[0] > 0:
            for stem, score in scores.items():
                if score == best:
                    beside[stem].append(outcome)
    return beside


def other_claims(checked: Checked, run_paths: list[Path], results: Results
                 ) -> list[tuple[str, int]]:
    """(bundled claims file, claims it decides on these runs) for the bundled files other than
    `checked`'s that decide any: what to pass as --claims when none of its claims concern
    the runs."""
    found = []
    for path in sorted(BUNDLED_CLAIMS.glob("*.toml")):
        if path.resolve() != checked.claims_path.resolve():
            decided = len(check_claims(run_paths, path, results=results).decided)
            if decided:
                found.append((path.stem, decided))
    return found


TITLE = "Positional Encoding Helps RNNs Handle a Large Vocabulary: reproduction report"
# How a page is framed (`framing`): the paper's reproduction at its settings, a demo of it
# at smaller sizes, or a study of one's own (its own claims, or kinds of its own).
PAPER, DEMO, OWN = "paper", "demo", "own"
KIND_COLUMNS = ("task.name", "model.arch", "encoding.kind")


def own_study(checked: Checked) -> bool:
    """A study of one's own: a claims file of one's own, or runs of kinds of one's own (a
    plugin's, or one no registration knows) that no bundled claim concerns."""
    bundled = checked.claims_path.resolve().parent == BUNDLED_CLAIMS.resolve()
    runs = checked.results.runs
    own_kinds = any(not registry.is_builtin(column.split(".")[0], name)
                    for column in KIND_COLUMNS if column in runs
                    for name in runs[column].dropna().unique())
    return not bundled or (own_kinds and not checked.decided)


def framing(checked: Checked, found: list[Panel]) -> str:
    """OWN for a study of one's own (`own_study`), else DEMO where a figure's runs are not
    at the paper's settings, else PAPER."""
    if own_study(checked):
        return OWN
    return DEMO if any(panel.differs for panel in found) else PAPER


def own_title(run_paths: list[Path]) -> str:
    """The heading of an own study's page without --title: its runs' folder."""
    names = ", ".join(Path(p).name or str(p) for p in run_paths[:3])
    return f"{names}{' and more' if len(run_paths) > 3 else ''}: study report"


def _curves(panel: Panel, columns: list[str]) -> str:
    """The learning curves of a figure's runs (perencode.analysis.curves), inline; '' when none of
    them logged a step."""
    png = draw_curves(panel.runs, columns)
    if png is None:
        return ""
    data = base64.b64encode(png).decode("ascii")
    return ('<details class="curves" open><summary>Learning curves (metrics.jsonl)</summary>'
            f'<img class="curves" alt="learning curves of {_e(panel.stem)}" '
            f'src="data:image/png;base64,{data}"></details>')


# The columns of the runs table that are bookkeeping, not results.
NOT_METRICS = {"run", "status", "complete", "fingerprint", "tag", "train_step",
               "train_seconds", "code_changes_accepted", "iteration"}


def _duration(seconds) -> str:
    if seconds is None or pd.isna(seconds):
        return ""
    seconds = float(seconds)
    return f"{seconds:.0f} s" if seconds < 120 else (
        f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h")


def _cell(value, shown: str | None = None) -> str:
    """A table cell that sorts by its value: numbers as numbers (data-sort), text as text."""
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return '<td data-sort=""></td>'
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        text = shown if shown is not None else (f"{value:.4g}" if isinstance(value, float)
                                                else str(value))
        return f'<td data-sort="{float(value)!r}" class="num">{_e(text)}</td>'
    return f"<td>{_e(shown if shown is not None else value)}</td>"


def runs_table(results: Results) -> str:
    """Every run given, one row each: its cell (the settings that tell the cells apart),
    seed, state, final metrics, fingerprint, device, training time and sweep tag; a click
    on a heading sorts by it (SORT_SCRIPT, in the page)."""
    frame = results.runs
    cells = varying(frame, results.recipe_columns)
    names = {c: short_key(c) for c in cells}
    metrics = [c for c in frame.columns if c not in results.recipe_columns
               and c not in NOT_METRICS and pd.api.types.is_numeric_dtype(frame[c])
               and not c.startswith("n_") and frame[c].notna().any()]
    head = (["run", *[names[c] for c in cells], "seed", "state", *metrics, "fingerprint",
             "device", "training time"] + (["tag"] if "tag" in frame else []))
    paths = [Path(os.path.abspath(r)) for r in frame["run"]]
    root = Path(os.path.commonpath(paths)) if len(paths) > 1 else paths[0].parent
    rows = []
    for _, run in frame.sort_values("run").iterrows():
        device = _device(Path(run["run"]))
        cells_html = "".join(_cell(run[c], format_value(run[c]) if not pd.isna(run[c])
                                   else None) for c in cells)
        below = Path(os.path.abspath(run["run"])).relative_to(root).as_posix()
        rows.append(f'<tr><td title="{_e(run["run"])}">{_e(below)}</td>' + cells_html
                    + _cell(int(run["train.seed"])) + _cell(run["status"])
                    + "".join(_cell(run[m]) for m in metrics)
                    + _cell(run.get("fingerprint")) + _cell(device)
                    + _cell(run.get("train_seconds"), _duration(run.get("train_seconds")))
                    + (_cell(run.get("tag")) if "tag" in frame else "") + "</tr>")
    header = "".join(f'<th title="click to sort">{_e(h)}</th>' for h in head)
    return (f'<h2 id="runs">Runs ({len(frame)})</h2><p class="meta">One row per run; click '
            f'a heading to sort by it (again: the other way). Below {_e(root)}.</p>'
            '<div class="wide"><table class="sortable runs-table">'
            f'<thead><tr>{header}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def _device(run: Path) -> str:
    """'cuda:0 (NVIDIA H100 80GB HBM3)' from a run's env.json, '' where not recorded."""
    try:
        env = (found.as_dict() if (found := run_dirs.env_record(run)) else {})
    except UserError:
        return ""
    device, name = env.get("device"), env.get("device_name")
    return f"{device} ({name})" if device and name else str(device or "")


# Sorts a table.sortable by the clicked column: numbers (data-sort) as numbers, empty cells
# last; a second click reverses. No library and nothing fetched: the page stays offline.
SORT_SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, column) {
    th.style.cursor = "pointer";
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var up = th.getAttribute("data-order") !== "up";
      table.querySelectorAll("th").forEach(function (h) { h.removeAttribute("data-order"); });
      th.setAttribute("data-order", up ? "up" : "down");
      function key(row) {
        var cell = row.cells[column], sort = cell.getAttribute("data-sort");
        if (sort === "") { return null; }
        return sort !== null ? parseFloat(sort) : cell.textContent;
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        if (x === null || y === null) { return x === y ? 0 : (x === null ? 1 : -1); }
        var order = typeof x === "number" && typeof y === "number" ? x - y
          : String(x).localeCompare(String(y), undefined, {numeric: true});
        return up ? order : -order;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
"""


def render(checked: Checked, found: list[Panel], out: Path, run_paths: list[Path],
           others: list[tuple[str, int]] | None = None, title: str | None = None) -> str:
    decided = checked.decided
    beside = placed(decided, found)
    shown = {o.claim.id for claims in beside.values() for o in claims}
    frame = framing(checked, found)
    columns = checked.results.recipe_columns
    sections = []
    for panel in found:
        picture = _image(panel.image) if panel.image else _table_file(out, panel.stem)
        sections.append(
            f'<h2 id="{_e(panel.stem)}">{_e(panel.stem)}</h2><div class="figure">'
            f'<div class="picture">{picture}</div>'
            + (f'<p class="note">{_e(panel.differs)}.</p>'
               if panel.differs and frame != OWN else "")
            + (f'<p class="note">Drawn together although {_e(panel.note)}.</p>'
               if panel.note else "")
            + _curves(panel, columns)
            + '<div class="side"><h3>Runs behind it</h3>'
            f'{_runs_box(panel.runs, panel.diverged)}<h3>Claims</h3>'
            f'{_claims_table(beside[panel.stem], frame)}'
            + _cited_not_run(panel.stem, checked) + "</div></div>")
    rest = [o for o in decided if o.claim.id not in shown]
    if rest:
        sections.append("<h2>Claims decided on runs no figure draws</h2>"
                        + _claims_table(rest, frame))
    groups = checked.not_run()
    if groups:
        items = "".join(f"<li>{_e(reason)} <b>({len(group)})</b><br>"
                        f"<span class=\"meta\">{_e(', '.join(o.claim.id for o in group))}"
                        "</span></li>" for reason, group in groups)
        sections.append(f'<h2 id="not-run">Claims not run</h2><ul>{items}</ul>')
    sections.append(runs_table(checked.results))
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    counts = " ".join(f"{_badge(v)} {sum(o.verdict == v for o in checked.outcomes)}"
                      for v in (PASS, FAIL, INCONCLUSIVE, NOT_RUN))
    if others:
        counts += ("<br>No claim of " + _e(checked.claims_path.name) + " concerns these runs; "
                   + "; ".join(f"<b>--claims {_e(name)}</b> decides {n}" for name, n in others)
                   + ".")
    # Beside the badges, where a reader skimming sees it first: runs not at the paper's
    # settings (a demo) show the effect's direction, not the paper's numbers. An own study
    # is measured against its own claims: no banner.
    nonpaper = [panel for panel in found if panel.differs]
    if frame == DEMO:
        counts += (f'<br><span class="demo">Demo settings: direction, not magnitude. The runs '
                   f"of {len(nonpaper)} of {len(found)} figures are not at the paper's "
                   "settings (each figure says how): a pass says the effect points the "
                   "paper's way at these sizes, not that the paper's numbers are "
                   "reproduced.</span>")
    heading = title or (own_title(run_paths) if frame == OWN else TITLE)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_e(heading if heading != TITLE else 'perencode report')}</title>"
            f"<style>{STYLE}</style></head><body>"
            f"<h1>{_e(heading)}</h1>"
            f'<p class="meta">Runs: {_e(", ".join(map(str, run_paths)))} &middot; claims: '
            f"{_e(checked.claims_path.name)} &middot; written {when} by perencode &middot; "
            '<a href="#runs">every run</a></p>'
            f'<div class="summary">{_e(checked.summary())}<br>{counts}</div>'
            f'<p class="rule">{_e(RULE)}</p>' + "".join(sections)
            + f"<script>{SORT_SCRIPT}</script></body></html>\n")


def make_report(runs: list[Path], claims: str | Path = defaults.CLAIMS,
                out: Path = defaults.FIGURES, accept_code_change: bool = False,
                title: str | None = None) -> Path:
    """Draw the figures into `out`, check the claims and write `out`/report.html (headed
    `title`, else as its framing says: the paper's reproduction, or a study of one's own);
    its path."""
    run_paths = [Path(p) for p in runs]
    out = Path(out)
    results = collect(run_paths, "report", accept_code_change)
    checked = check_claims(run_paths, claims, results=results)  # a bad claims file stops it here
    written = draw_figures(results, out, compare_with_paper=not own_study(checked))
    others = [] if checked.decided else other_claims(checked, run_paths, results)
    if others:
        console.print(f"no claim of {checked.claims_path.name} concerns these runs; "
                      + "; ".join(f"--claims {name} decides {n}" for name, n in others),
                      highlight=False, soft_wrap=True)
    page = render(checked, panels(results, written), out, run_paths, others, title)
    with hold(out, "report"):
        remove_stale_temps(out, lambda name: name == REPORT)
        atomic_write_text(out / REPORT, page)
    return out / REPORT
