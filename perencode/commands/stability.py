"""`perencode stability`: gradient stability (perencode.analysis.gradient_stability) at every
checkpoint of a dual-frequency run, written to its stability.csv (Fig. 4-5;
docs/paper-facts.md#gradient-stability). docs/stability.md has the formulas, the triplets,
what the CSV holds and what the paper leaves open.
"""

from __future__ import annotations

import csv
import functools
import io
from pathlib import Path
from typing import Any

import torch

from perencode.analysis.gradient_stability import METRICS, Triplets, analyse_triplets, make_triplets
from perencode.analysis.gradient_stability import (
    gradient_stability as gradient_stability,  # public name
)
from perencode.common import defaults
from perencode.common.console import console, results
from perencode.common.device import resolve_device
from perencode.common.errors import UserError
from perencode.common.files import atomic_write_text
from perencode.common.progress import Reporter
from perencode.config import registry
from perencode.store import runs
from perencode.training.session import Session

# --------------------------------------------------------------------------------------
# The analysis of a run: stability.csv.
# --------------------------------------------------------------------------------------

COLUMNS = ("iteration", "comparison", "target", "disturbants", "triplet", "stability",
           "stability_weighted", "stability_printed", "stability_mean", "stability_frobenius",
           "frobenius_distance", "forward_distance", "forward_cosine", "metric", "model",
           "encoding", "seed")


def _read_csv(path: Path, triplets: int, metric: str) -> list[dict[str, str]]:
    """Rows of an existing stability.csv (empty if none); UserError if it cannot be resumed."""
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise UserError(f"{path}: not a stability.csv of this perencode version (columns "
                            "differ); move it away to recompute")
        rows = list(reader)
    per_iteration: dict[str, int] = {}
    for row in rows:
        per_iteration[row["iteration"]] = per_iteration.get(row["iteration"], 0) + 1
    found_metric = {row["metric"] for row in rows}
    found_count = {n // 2 for n in per_iteration.values()}
    if found_metric - {metric} or found_count - {triplets}:
        raise UserError(f"{path}: holds an analysis with --triplets "
                        f"{'/'.join(map(str, sorted(found_count)))} --metric "
                        f"{'/'.join(sorted(found_metric))}; rerun with those or move the "
                        "file away to recompute")
    return rows


def _write_csv(path: Path, rows: list[dict]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def analyse_run(run_dir: str | Path, triplets: int = defaults.STABILITY_TRIPLETS,
                metric: str = defaults.STABILITY_METRIC, device: str = defaults.DEVICE,
                every: int = defaults.STABILITY_EVERY, batch: int = defaults.STABILITY_BATCH,
                progress: bool = True, accept_code_change: bool = False,
                accept_data_change: bool = False) -> Path:
    """Gradient stability at every (every-th) checkpoint of a dual-frequency run.

    Writes RUN_DIR/stability.csv (columns COLUMNS; two rows per triplet and checkpoint,
    one per comparison) and returns its path. Checkpoints already in the CSV are skipped;
    after each new checkpoint the CSV is rewritten atomically with its rows appended, so
    an interrupted analysis resumes where it stopped. `metric` names the column copied into
    `stability` (METRICS). Memory grows linearly with `batch` (docs/stability.md). The run's
    recipe.toml, data and code must be those it was made with (perencode.store.identity; other
    code with `accept_code_change`, other data with `accept_data_change`, recorded in its
    identity.json).
    """
    if metric not in METRICS:
        raise UserError(f"--metric '{metric}': expected one of {', '.join(METRICS)}")
    if batch < 1 or every < 1:
        raise UserError(f"--batch {batch} / --every {every}: both must be at least 1")
    run_dir = Path(run_dir)
    recipe = runs.read_recipe(run_dir)
    task = recipe.task
    analysable = registry.having("task", "stability")
    if task.name not in analysable:
        raise UserError(f"{run_dir}: gradient stability needs a run of task.name = "
                        f"{' or '.join(map(repr, analysable))} "
                        f"(docs/paper-facts.md#gradient-stability), this one is '{task.name}'")
    prefix = registry.get("model", recipe.model.arch).stability_prefix
    if prefix and task.length <= prefix + 1:
        raise UserError(f"{run_dir}: the S4D analysis puts the target at t = {prefix + 1}; "
                        f"task.length = {task.length} is too short")
    chosen = make_triplets(task.vocab_size, task.length, triplets, recipe.train.seed, prefix)
    dev = resolve_device(device)
    with runs.Run.open(run_dir, "stability", accept_code_change=accept_code_change,
                       accept_data_change=accept_data_change) as run:
        return _analyse(run, chosen, dev, triplets, metric, every, batch, progress)


def _analyse(run: runs.Run, chosen: Triplets, dev: torch.device, triplets: int, metric: str,
             every: int, batch: int, progress: bool) -> Path:
    """`analyse_run` inside the locked run directory."""
    recipe = run.recipe
    task = recipe.task
    checkpoints = run.checkpoints()[::every]
    path = run.dir / "stability.csv"
    if not checkpoints:
        if run.is_complete() and path.exists():
            console.print(f"{run.dir}: its checkpoints were deleted; {path} is kept as it is",
                          highlight=False, soft_wrap=True)
            return path
        if run.is_complete():
            raise UserError(f"{run.dir}: the run is finished but its checkpoints were "
                            "deleted; the analysis reads them: train the recipe again into "
                            "a new run directory to analyse it")
        raise UserError(f"{run.dir}: no checkpoints yet (train it first)")
    rows: list[dict[str, Any]] = list(_read_csv(path, triplets, metric))
    done = {int(row["iteration"]) for row in rows}
    todo = [(it, ckpt) for it, ckpt in checkpoints if it not in done]
    batches = -(-triplets // batch)
    reporter = Reporter("stability", len(todo) * batches, log_every=batches, unit="batch",
                        enabled=progress)
    run_fields: dict[str, Any] = {"metric": metric, "model": recipe.model.arch,
                  "encoding": recipe.encoding.kind, "seed": recipe.train.seed}
    with reporter:
        for iteration, ckpt in todo:
            model = Session.of_checkpoint(recipe, dev, *run.load(ckpt, map_location=dev)).model
            model.eval()
            new = analyse_triplets(model, chosen, task.vocab_size, batch, dev,
                                   on_batch=functools.partial(reporter.advance, 1, step=iteration))
            for row in new:
                row.update(iteration=iteration, stability=row[f"stability_{metric}"],
                           **run_fields)
            rows.extend(new)
            _write_csv(path, rows)
    # One line, true in each case: a finished analysis is left as it is.
    results.print(f"wrote {path}" if todo else f"{path}: every checkpoint analysed already; "
                  "kept as it is", highlight=False, soft_wrap=True)
    return path
