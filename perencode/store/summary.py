"""A run's story for `perencode show RUN_DIR`: what state it is in, what it scored, on what
device and for how long, with which code and data, and whether its files still match the
record (the checks `eval`, `figures` and `verify` apply, reported here instead of refused).

Everything is read from the run directory alone: a plugin's run is shown without its
plugin (its kinds keep their names, their labels come from RUN_DIR/plugins.json).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perencode.common.errors import UserError
from perencode.config import registry
from perencode.config.recipe import Recipe
from perencode.store import identity, records, runs


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.2f} h"


def training_time(rows: list[records.MetricsRow]) -> tuple[float, int]:
    """The training wall time summed over the run's (re)starts, and how many starts
    (metrics.jsonl's `seconds` restarts from 0 when a run resumes)."""
    total, previous, starts = 0.0, None, 0
    for row in rows:
        if previous is None or row.seconds < previous:
            total += previous or 0.0
            starts += 1
        previous = row.seconds
    return total + (previous or 0.0), starts


def mismatches(run_dir: Path, recipe: Recipe) -> list[str]:
    """How the run's files differ from what was recorded when it was made, one phrase each:
    an edited recipe.toml or changed data (perencode.store.identity, as eval and resume check
    them), code that differs from the code loaded now, an eval.json that is another run's or
    was edited since the run wrote it (perencode.store.runs.check_eval, as figures and verify
    check it)."""
    found = []
    try:
        changes = identity.check(run_dir, recipe, "show", accept_code_change=True,
                                 write=False, note_missing=False)
    except UserError as exc:
        found.append(str(exc).removeprefix(f"{run_dir}: "))
    else:
        found += changes
    try:  # another run's eval.json, or one edited since the run wrote it (its hash)
        runs.check_eval(run_dir, recipe)
    except UserError as exc:
        found.append(str(exc))
    return found


def summarise(run_dir: str | Path) -> tuple[Recipe, dict[str, Any]]:
    """The run's recipe (as recorded, kinds no registration knows kept by name) and its
    story: state, results, training, device, duration, fingerprint, origins, mismatches."""
    run_dir = Path(run_dir)
    recipe = runs.read_recipe(run_dir, any_kind=True)
    registry.RECORDED.update(runs.recorded_labels(run_dir))
    run = runs.Run(run_dir)
    status = run.status()
    rows = run.metrics()
    story: dict[str, Any] = {"run": str(run_dir), "state": status.state,
                             "iterations": recipe.train.iterations}
    if status.reason:
        story["reason"] = status.reason
    if rows:
        last = rows[-1]
        seconds, starts = training_time(rows)
        story["training"] = {"step": last.step, "loss": last.loss,
                             "accuracy": last.accuracy, "seconds": round(seconds, 3),
                             "starts": starts}
    story["iteration"] = status.iteration if status.iteration is not None else (
        rows[-1].step if rows else 0)
    path = run_dir / "eval.json"
    if path.is_file():
        try:
            scored = records.read_eval(path).result()
        except UserError as exc:  # there, but unreadable: said, not "no eval.json"
            scored = {}
            story["results_unreadable"] = str(exc)
        story["results"] = {k: v for k, v in scored.items()
                            if isinstance(v, (int, float)) and not isinstance(v, bool)
                            and k not in records.EVAL_IDENTITY}
    try:
        env = runs.env_record(run_dir) or records.EnvRecord()
    except UserError:
        env = records.EnvRecord()
    story["device"] = env.get("device")
    story["device_name"] = env.get("device_name")
    sweep = runs.sweep_record(run_dir)
    story["tag"] = sweep.tag if sweep else None
    story["fingerprint"] = identity.short(run_dir)
    story["origin"] = identity.describe(run_dir)
    story["mismatches"] = mismatches(run_dir, recipe)
    return recipe, story


def story_lines(story: dict[str, Any]) -> list[str]:
    """The story as lines for people (show prints each as a TOML comment)."""
    state = story["state"]
    lines = [f"run: {story['run']}",
             f"state: {state} at iteration {story['iteration']} of {story['iterations']}"
             + (f" ({story['reason']})" if story.get("reason") else "")]
    if story.get("results"):
        lines.append("results (eval.json): " + ", ".join(
            f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
            for k, v in story["results"].items()))
    elif story.get("results_unreadable"):
        lines.append(f"results: {story['results_unreadable']}")
    elif state == runs.FINISHED:
        lines.append("results: no eval.json")
    training = story.get("training")
    if training:
        accuracy = training.get("accuracy")
        lines.append(f"training: loss {training['loss']:.4g}"
                     + (f", accuracy {accuracy:.4g}" if isinstance(accuracy, float) else "")
                     + f" at step {training['step']}; {_duration(training['seconds'])}"
                     + (f" over {training['starts']} starts" if training["starts"] > 1 else ""))
    device = story.get("device")
    lines.append("device: " + (f"{device} ({story['device_name']})" if device
                               and story.get("device_name") else device or "not recorded"))
    if story.get("tag"):
        lines.append(f"sweep tag: {story['tag']}")
    lines += story["origin"]
    lines += [f"WARNING: {line}" for line in story["mismatches"]]
    return lines
