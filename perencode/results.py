"""The results of finished runs as tidy tables (read by `figures` and `verify`).

`collect(paths)` reads every run directory under `paths` (recipe.toml, eval.json,
metrics.jsonl, stability.csv) into one `Results`: a row per run (its recipe fields as
dotted columns, eval.json's scalars, a training summary) and the per-row tables of
eval.json (by_band, by_condition, by_length) and stability.csv; a task's registration adds
its own columns and tables (the language model's perplexity and training curves). Runs of
the same recipe (`recipe.identity`) are kept once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from perencode import kinds, runs
from perencode.errors import UserError
from perencode.naming import format_value, short_names
from perencode.recipe import SECTIONS, field_names, run_key

# Recipe fields that change nothing a figure compares: never a reason to split a figure.
BOOKKEEPING = ("train.seed", "train.log_every", "train.checkpoint_every",
               "train.eval_batch_size", "train.keep_checkpoints", "train.eval_every")
IDENTITY = tuple(runs.EVAL_IDENTITY.values())

@dataclass
class Results:
    runs: pd.DataFrame                  # one row per run: run, recipe fields (dotted), metrics
    tables: dict[str, pd.DataFrame]     # by_band, by_condition, by_length, stability, curves
                                        # (training curves of language models)
    recipe_columns: list[str]
    duplicates: list[str] = field(default_factory=list)

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


def _training_summary(rows: list[dict]) -> dict:
    """Last logged loss/accuracy and the training wall time summed over (re)starts
    (`seconds` restarts from 0 when a run resumes)."""
    if not rows:
        return {}
    seconds, previous = 0.0, 0.0
    for row in rows:
        if row["seconds"] < previous:
            seconds += previous
        previous = row["seconds"]
    last = rows[-1]
    return {"train_step": last["step"], "train_loss": last["loss"],
            "train_accuracy": last.get("accuracy"), "train_seconds": seconds + previous}


def _read_eval(run_dir: Path) -> tuple[dict, dict[str, list[dict]]]:
    """eval.json split into scalars and its lists of rows (by_band, by_length, ...)."""
    path = run_dir / "eval.json"
    if not path.exists():
        return {}, {}
    data = runs.read_json(path)
    # eval.json's identity fields repeat recipe fields: the recipe's are kept.
    scalars = {k: v for k, v in data.items() if isinstance(v, (int, float, str, bool))
               and k not in runs.EVAL_IDENTITY}
    nested = {k: v for k, v in data.items()
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


def collect(paths: list[Path]) -> Results:
    """Every run under `paths` into one Results; identical recipes are kept once."""
    rows: list[dict[str, Any]] = []
    tables: dict[str, list[pd.DataFrame]] = {}
    kept: dict[str, Path] = {}
    duplicates = []
    for run_dir in runs.find_runs(paths):
        recipe = runs.read_recipe(run_dir, any_kind=True)
        key = run_key(recipe)
        if key in kept:
            duplicates.append(f"{run_dir} (same recipe as {kept[key]})")
            continue
        kept[key] = run_dir
        run = str(run_dir)
        scalars, nested = _read_eval(run_dir)
        metrics = runs.Run(run_dir).metrics()
        row = {"run": run, **flatten(recipe), **scalars, **_training_summary(metrics),
               "complete": runs.Run(run_dir).is_complete()}
        tag = runs.sweep_record(run_dir).get("tag")
        if tag:  # `sweep --tag`: a column only where a run has one
            row["tag"] = str(tag)
        own = {name: pd.DataFrame(items) for name, items in nested.items()}
        stability = _read_stability(run_dir)
        if stability is not None:
            own["stability"] = stability
        # The task's own columns and tables (perencode.kinds.TaskKind.results); a task no
        # registration knows (its plugin absent) has none.
        task = kinds.registry("task").get(recipe.task.name)
        if task is not None and task.results is not None:
            task.results(row, metrics, own)
        rows.append(row)
        for name, table in own.items():
            tables.setdefault(name, []).append(pd.DataFrame(table).assign(run=run))
    if not rows:
        raise UserError(f"{', '.join(map(str, paths))}: no run directories (recipe.toml) found")
    frame = pd.DataFrame(rows)
    recipe_columns = [c for c in frame.columns if c.split(".")[0] in SECTIONS]
    joined = {name: pd.concat(parts, ignore_index=True) for name, parts in tables.items()}
    return Results(frame, joined, recipe_columns, duplicates)


def results_table(results: Results) -> pd.DataFrame:
    """results.csv: run, identity fields, the other recipe fields that vary, metrics."""
    df = results.runs
    varying = [c for c in results.recipe_columns if c in IDENTITY
               or (c not in BOOKKEEPING and df[c].nunique(dropna=False) > 1)]
    names = short_names(varying)
    metrics = [c for c in df.columns if c not in results.recipe_columns and c != "run"]
    return df[["run", *varying, *metrics]].rename(columns=names)
