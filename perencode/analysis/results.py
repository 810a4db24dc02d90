"""The results of finished runs as tidy tables (read by `figures` and `verify`).

`collect(paths)` reads every run directory under `paths` (recipe.toml, eval.json,
metrics.jsonl, stability.csv) into one `Results`: a row per run (its recipe fields as
dotted columns, eval.json's scalars, a training summary) and the per-row tables of
eval.json (by_band, by_condition, by_length) and stability.csv; a task's registration adds
its own columns and tables (the language model's perplexity and training curves). Runs of
the same recipe (`recipe.identity`) are kept once: the finished one (`choose`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from perencode.common.console import console
from perencode.common.errors import UserError
from perencode.config import registry
from perencode.config.naming import format_value, short_names
from perencode.config.recipe import BOOKKEEPING, SECTIONS, field_names, run_key
from perencode.store import identity, records, runs
from perencode.store.records import SweepRecord

IDENTITY = tuple(records.EVAL_IDENTITY.values())

@dataclass
class Results:
    runs: pd.DataFrame                  # one row per run: run, recipe fields (dotted), metrics
    tables: dict[str, pd.DataFrame]     # by_band, by_condition, by_length, stability, curves
                                        # (training curves of language models)
    recipe_columns: list[str]
    duplicates: list[str] = field(default_factory=list)  # runs of a recipe not used, and why
    notes: list[str] = field(default_factory=list)       # links the run search skipped
    mixed_code: list[str] = field(default_factory=list)  # cells whose runs' code differs

    def diverged(self) -> pd.DataFrame:
        """The runs that stopped on a number that is not finite (no metrics of theirs)."""
        return self.runs[self.runs["status"] == runs.DIVERGED]

    def table(self, name: str) -> pd.DataFrame:
        """A per-row table joined with its runs' recipe fields (empty if no run has one)."""
        if name == "runs":
            return self.runs
        part = self.tables.get(name)
        if part is None or part.empty:
            return pd.DataFrame(columns=["run", "complete", *self.recipe_columns])
        return part.merge(self.runs[["run", "complete", *self.recipe_columns]], on="run")


def flatten(recipe) -> dict:
    """Recipe fields as dotted keys, every registered kind's options among them (None where
    the run's kind has none, or it is unset), so that a table of runs has the same columns
    whichever kinds it holds; lists in their directory spelling."""
    data = recipe.model_dump(mode="json")
    out = dict.fromkeys(field_names())
    out.update({f"{section}.{key}": format_value(value) if isinstance(value, list) else value
                for section in SECTIONS for key, value in data[section].items()})
    return out


def _training_summary(rows: list[records.MetricsRow]) -> dict:
    """Last logged loss/accuracy and the training wall time summed over (re)starts
    (`seconds` restarts from 0 when a run resumes)."""
    if not rows:
        return {}
    seconds, previous = 0.0, 0.0
    for row in rows:
        if row.seconds < previous:
            seconds += previous
        previous = row.seconds
    last = rows[-1]
    return {"train_step": last.step, "train_loss": last.loss,
            "train_accuracy": last.accuracy, "train_seconds": seconds + previous}


def _read_eval(run_dir: Path, recipe, status: records.StatusRecord
               ) -> tuple[dict, dict[str, list[dict]]]:
    """eval.json split into scalars and its lists of rows (by_band, by_length, ...); one
    line naming the file when it is damaged (an object with a whole-number iteration and
    numbers for its metrics, as `perencode eval` writes it), or not the run's own
    (perencode.store.runs.check_eval)."""
    path = run_dir / "eval.json"
    if not path.exists():
        return {}, {}
    again = runs.Run(run_dir).restore_hint()  # `eval` only where a checkpoint is left
    try:
        record = records.read_eval(path)
    except UserError as exc:
        raise UserError(f"{exc}; {again}") from None
    if record.iteration is None:
        raise UserError(f"{path}: no whole-number 'iteration' (damaged); {again}")
    runs.check_eval(run_dir, recipe, status)  # a whole file, but the run's own?
    # eval.json's identity fields repeat recipe fields: the recipe's are kept.
    scores = record.scores()
    scalars = {k: v for k, v in scores.items() if isinstance(v, (int, float, bool))}
    scalars["iteration"] = record.iteration
    nested = {k: v for k, v in scores.items()
              if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)}
    return scalars, nested


def _read_stability(run_dir: Path) -> pd.DataFrame | None:
    """Mean stability over the triplets of each checkpoint and condition."""
    path = run_dir / "stability.csv"
    if not path.exists():
        return None
    df = pd.read_csv(path, usecols=["iteration", "comparison", "target", "disturbants",
                                    "stability"])
    keys = ["iteration", "comparison", "target", "disturbants"]
    return df.groupby(keys, as_index=False).agg(stability=("stability", "mean"),
                                                n=("stability", "size"))


# Which of two run directories of one recipe is used: the finished one, else the diverged
# one (its divergence is the result), else a finished one whose eval.json is missing, else
# the first found.
_RANK = {runs.FINISHED: 3, runs.DIVERGED: 2, runs.UNFINISHED: 0}


def _rank(status: records.StatusRecord) -> int:
    return 1 if status.missing else _RANK[status.state]


def _describe(run_dir: Path, status: records.StatusRecord) -> str:
    state = status.state
    if status.missing:
        return f"finished, but its {status.missing} is missing"
    if state == runs.UNFINISHED:
        steps = runs.Run(run_dir).metrics()
        return f"unfinished (iteration {steps[-1].step if steps else 0})"
    return f"{state} (iteration {status.iteration})" if state == runs.DIVERGED else state


def _code(run_dir: Path) -> Any:
    """The code that made a run as its identity.json records it (None without one)."""
    entry = identity.read(run_dir)
    return None if entry is None else (entry.code, entry.modules)


Found = tuple[Path, Any, records.StatusRecord]  # a run directory, its recipe, its status


def choose(found: list[Found]) -> tuple[dict[str, Found], list[str]]:
    """run_key -> the (run directory, recipe, status) used of each recipe's runs, and one
    line per run directory left out, naming the one used and why. Two finished runs of
    one recipe with different eval.json are both named: the first is used."""
    kept: dict[str, Found] = {}
    lines = []
    for run_dir, recipe, status in found:
        key = run_key(recipe)
        if key not in kept:
            kept[key] = (run_dir, recipe, status)
            continue
        used, _, used_status = kept[key]
        if _rank(status) > _rank(used_status):
            kept[key] = (run_dir, recipe, status)
            lines.append(f"{used}: ignored, {_describe(used, used_status)}; the same "
                         f"recipe's {status.state} run {run_dir} is used")
        elif _rank(status) == _rank(used_status) == _RANK[runs.FINISHED]:
            ours, theirs = (records.read_eval(d / "eval.json").as_dict()
                            for d in (used, run_dir))
            if ours == theirs and _code(run_dir) != _code(used):
                lines.append(f"{run_dir} and {used}: two finished runs of the same recipe "
                             "and results, trained by other code (their identity.json "
                             f"differ in code); {used} is used, move it away to use the other")
            elif ours == theirs:
                lines.append(f"{run_dir}: ignored, the same recipe and results as {used}")
            else:
                differ = sorted(k for k in set(ours) | set(theirs)
                                if ours.get(k) != theirs.get(k))
                lines.append(f"{run_dir} and {used}: two finished runs of the same recipe "
                             f"with different results ({', '.join(differ[:4])} differ); "
                             f"{used} is used, move the other away to use it")
        else:
            lines.append(f"{run_dir}: ignored, {_describe(run_dir, status)}; the same "
                         f"recipe's {used_status.state} run {used} is used")
    return kept, lines


def collect(paths: list[Path], command: str = "figures",
            accept_code_change: bool = False) -> Results:
    """Every run under `paths` into one Results; of the runs of one recipe one is kept
    (`choose`). A diverged run has a row (status "diverged", complete False) without
    metrics: a number it produced is never shown.

    A run whose recipe.toml was edited, or whose eval.json is not the one its recipe and
    its finish recorded (perencode.store.runs.check_eval), is refused (for `command`). Each row
    carries the run's fingerprint and `code` (perencode.store.identity.code_digest: the code its
    numbers came from, changes accepted since included); these are recorded numbers, so
    the code is compared between the runs of a cell (`mixed_code`), not with the code
    loaded now (`accept_code_change` is no longer needed: one note says so)."""
    rows: list[dict[str, Any]] = []
    tables: dict[str, list[pd.DataFrame]] = {}
    notes: list[str] = []
    found = []
    if accept_code_change:
        console.print(f"[yellow]note:[/] {command} reads recorded numbers and compares the "
                      "runs' code with each other, not with the code loaded now: "
                      f"{identity.ACCEPT} changes nothing here", highlight=False,
                      soft_wrap=True)
    registry.RECORDED.clear()  # the labels of these runs' plugins' kinds, not of earlier ones
    for run_dir in runs.find_runs(paths, notes):
        recipe = runs.read_recipe(run_dir, any_kind=True)
        found.append((run_dir, recipe, runs.Run(run_dir).status()))
        registry.RECORDED.update(runs.recorded_labels(run_dir))
    kept, duplicates = choose(found)
    unverified = []
    for run_dir, recipe, status in kept.values():
        identity.check(run_dir, recipe, command, data=False, code=False, write=False,
                       note_missing=False)
        entry = identity.read(run_dir)
        accepted = [change for a in (entry.accepted if entry else [])
                    for change in a.get("changes", [])]
        fingerprint = identity.short(run_dir)
        if fingerprint == identity.UNVERIFIED:
            unverified.append(str(run_dir))
        run = str(run_dir)
        diverged = status.state == runs.DIVERGED
        scalars, nested = _read_eval(run_dir, recipe, status) if not diverged else ({}, {})
        metrics = runs.Run(run_dir).metrics()
        summary = _training_summary(metrics) if not diverged else {
            "train_step": status.iteration}
        if status.missing:
            notes.append(f"{run_dir}: finished, but its {status.missing} is missing: "
                         f"listed without metrics (complete = False); "
                         f"{runs.Run(run_dir).restore_hint()}")
        row = {"run": run, **flatten(recipe), **scalars, **summary, "status": status.state,
               "complete": status.state == runs.FINISHED and not status.missing,
               "fingerprint": fingerprint, "code": identity.code_digest(entry),
               **({"code_changes_accepted": "; ".join(accepted)} if accepted else {})}
        record = runs.sweep_record(run_dir)
        row[ORIGIN] = origin(run_dir, record)
        tag = record.tag if record else None
        if tag:  # `sweep --tag`: a column only where a run has one
            row["tag"] = str(tag)
        if diverged:
            rows.append(row)
            continue
        own = {name: pd.DataFrame(items) for name, items in nested.items()}
        stability = _read_stability(run_dir)
        if stability is not None:
            own["stability"] = stability
        # The task's own columns and tables (perencode.config.registry.TaskKind.results); a task no
        # registration knows (its plugin absent) has none.
        task = registry.registry("task").get(recipe.task.name)
        if task is not None and task.results is not None:
            task.results(row, [m.as_dict() for m in metrics], own)
        rows.append(row)
        for name, table in own.items():
            tables.setdefault(name, []).append(pd.DataFrame(table).assign(run=run))
    if not rows:
        raise UserError(f"{', '.join(map(str, paths))}: no run directories (recipe.toml) found")
    if unverified:
        console.print(f"[yellow]note:[/] {len(unverified)} run(s) have {identity.MISSING} "
                      f"(fingerprint {identity.UNVERIFIED}): {', '.join(unverified[:3])}"
                      f"{' and more' if len(unverified) > 3 else ''}", highlight=False,
                      soft_wrap=True)
    frame = pd.DataFrame(rows)
    recipe_columns = [c for c in frame.columns if c.split(".")[0] in SECTIONS]
    joined = {name: pd.concat(parts, ignore_index=True) for name, parts in tables.items()}
    mixed = mark_mixed_code(frame, recipe_columns)
    return Results(frame, joined, recipe_columns, duplicates, notes, mixed)


# Results.runs' column naming the sweep a run belongs to (`origin`)
ORIGIN = "origin"


def origin(run_dir: Path, record: SweepRecord | None) -> str:
    """The folder of the sweep that made a run (OUT/<grid>, above its cell's folders, as
    its sweep.json names the cell), or the folder holding a run trained by hand: the same
    for a run whichever folder above it was collected (perencode.analysis.plots.settings)."""
    real = Path(os.path.realpath(run_dir))
    depth = len(Path(record.cell).parts) if record and record.cell else 1
    return str(real.parents[min(depth, len(real.parents)) - 1])


def mark_mixed_code(frame: pd.DataFrame, recipe_columns: list[str]) -> list[str]:
    """Mark (column `code_differs`, True) the runs of a cell (every recipe field but the
    seed and the bookkeeping) whose runs' code (`code`) is not all the same; one line per
    such cell, naming each run's code."""
    frame["code_differs"] = False
    keys = [c for c in recipe_columns if c not in BOOKKEEPING]
    lines = []
    spelt = frame[keys].astype(str)
    for _, part in frame.groupby([spelt[c] for c in keys], dropna=False, sort=False):
        if part["code"].nunique() > 1:
            frame.loc[part.index, "code_differs"] = True
            shown = ", ".join(f"{r} (code {c})" for r, c in zip(part["run"], part["code"]))
            lines.append(f"runs of one cell made by different code (identity.json; a "
                         f"perencode upgrade or --accept-code): {shown}")
    return lines


def say_left_out(results: Results) -> None:
    """The notes of the run search and the run directories of a recipe not used, and why
    (`figures`, `verify`)."""
    for line in results.notes:
        console.print(f"[yellow]note:[/] {line}", highlight=False, soft_wrap=True)
    for line in [*results.duplicates, *results.mixed_code]:
        console.print(f"[yellow]warning:[/] {line}", highlight=False, soft_wrap=True)


def results_table(results: Results) -> pd.DataFrame:
    """results.csv: run, identity fields, the other recipe fields that vary, metrics."""
    df = results.runs
    varying = [c for c in results.recipe_columns if c in IDENTITY
               or (c not in BOOKKEEPING and df[c].nunique(dropna=False) > 1)]
    names = short_names(varying)
    # origin (the folder of a run's sweep) groups figures; as an absolute path of this
    # machine it has no place in a table a reviewer shares (`run` names the run)
    metrics = [c for c in df.columns if c not in results.recipe_columns
               and c not in ("run", ORIGIN)]
    return df[["run", *varying, *metrics]].rename(columns=names)
