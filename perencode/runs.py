"""Run directories: resolved recipe, provenance, metrics, checkpoints, results.

    RUN_DIR/recipe.toml            the resolved recipe (overrides applied)
    RUN_DIR/env.json               the environment report (`perencode env`), seed, start/end times
    RUN_DIR/metrics.jsonl          one row per log step: step, loss, accuracy, lr, seconds
    RUN_DIR/checkpoints/step-K.pt  every train.checkpoint_every iterations and the last one;
                                   the newest train.keep_checkpoints of them are kept
    RUN_DIR/checkpoints/resume.pt  written when a run is interrupted (SIGINT/SIGTERM)
    RUN_DIR/eval.json              held-out metrics of the final model
    RUN_DIR/tensorboard/           TensorBoard event files (`train --tensorboard`; tracking.py)
    RUN_DIR/.perencode.lock        while a command writes in the run (perencode.lock)

A checkpoint found unreadable when resuming is renamed step-K.pt.corrupt (never deleted)
and the run resumes from the newest readable one.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from perencode import environment
from perencode.console import console
from perencode.errors import UserError
from perencode.io import (
    CorruptCheckpoint,
    append_line,
    atomic_torch_save,
    atomic_write_json,
    atomic_write_text,
    safe_torch_load,
)
from perencode.lock import LOCK_NAME
from perencode.recipe import Recipe, read_toml, validate

CHECKPOINT_FORMAT = "perencode-checkpoint"
CHECKPOINT_VERSION = 1
_STEP_RE = re.compile(r"^step-(\d+)\.pt$")


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories (holding recipe.toml) at or below `paths`, following links (a sweep
    links cells to identical finished runs), each real directory once, in a stable order.
    Hidden folders (a sweep's .submitit logs) are skipped."""
    found, seen = [], set()
    for path in paths:
        path = Path(path)
        if not path.exists():
            raise UserError(f"{path}: no such run directory or folder")
        for folder, dirs, files in os.walk(path, followlinks=True):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            if "recipe.toml" in files:
                dirs.clear()  # a run directory holds no other run
                real = os.path.realpath(folder)
                if real not in seen:
                    seen.add(real)
                    found.append(Path(folder))
    return found


def default_run_dir(recipe_path: str | Path, seed: int) -> Path:
    return Path("runs") / Path(recipe_path).stem / f"seed-{seed}"


def read_recipe(run_dir: str | Path, any_kind: bool = False) -> Recipe:
    """The run's resolved recipe; `any_kind` for reading its results (a task, model or
    encoding the reader has not registered keeps its name; perencode.recipe.validate)."""
    path = Path(run_dir) / "recipe.toml"
    if not path.is_file():
        raise UserError(f"{run_dir}: not a perencode run directory (no recipe.toml)")
    return validate(read_toml(path), str(path), any_kind)


def _differences(a: dict, b: dict, prefix: str = "") -> list[str]:
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key), b.get(key)
        if isinstance(va, dict) and isinstance(vb, dict):
            out += _differences(va, vb, f"{prefix}{key}.")
        elif va != vb:
            out.append(f"{prefix}{key}: {va!r} there vs {vb!r} now")
    return out


def claim(run_dir: Path, recipe: Recipe) -> bool:
    """Make `run_dir` this recipe's run. Returns True if it already held this recipe's run.

    A different recipe in an existing run directory is refused: a finished run is never
    silently overwritten.
    """
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir}: exists and is not a directory; choose another --out")
    path = run_dir / "recipe.toml"
    if path.exists():
        existing = read_recipe(run_dir)
        diff = _differences(existing.identity(), recipe.identity())
        if diff:
            raise UserError(f"{run_dir}: holds a run of a different recipe ({diff[0]}"
                            f"{'; ...' if len(diff) > 1 else ''}); choose another --out")
        return True
    if run_dir.exists() and any(p.name != LOCK_NAME for p in run_dir.iterdir()):
        raise UserError(f"{run_dir}: exists and is not a perencode run directory; "
                        "choose another --out")
    atomic_write_text(path, recipe.to_toml())
    return False


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def record_start(run_dir: Path, device: torch.device, seed: int) -> None:
    """env.json: provenance of the first start, plus one entry per (re)start."""
    path = run_dir / "env.json"
    previous = read_json(path) if path.exists() else {}
    current = {**environment.report(device), "seed": seed}
    starts = [*previous.get("starts", []),
              {"time": now(), "device": current["device"], "git_commit": current["git_commit"]}]
    atomic_write_json(path, {**current, "start_time": starts[0]["time"], "starts": starts})


def record_end(run_dir: Path) -> None:
    path = run_dir / "env.json"
    env = read_json(path) if path.exists() else {}
    env["end_time"] = now()
    atomic_write_json(path, env)


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """The periodic checkpoints `step-K.pt`, sorted by iteration K."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _STEP_RE.match(p.name))]
    return sorted(found)


def prune_checkpoints(run_dir: Path, keep: int | None) -> list[Path]:
    """Delete all but the newest `keep` periodic checkpoints (None: keep all); the deleted
    paths. Called after a new one is written, so the newest always survives."""
    if keep is None:
        return []
    old = [path for _, path in list_checkpoints(run_dir)[:-keep]]
    for path in old:
        path.unlink(missing_ok=True)
    return old


def resume_state(run_dir: Path, map_location: str | torch.device = "cpu"
                 ) -> tuple[Path, dict] | None:
    """The newest readable checkpoint to resume from (the last step-K.pt, or resume.pt when
    it is later) and its state; None when there is none.

    An unreadable candidate is renamed NAME.corrupt (kept for inspection, out of every
    listing) and the next older one is tried; one line says what happened.
    """
    folder = Path(run_dir) / "checkpoints"
    found: tuple[Path, dict] | None = None
    corrupt: list[tuple[Path, str]] = []

    def read(path: Path) -> dict | None:
        try:
            return load_checkpoint(path, map_location)
        except CorruptCheckpoint as exc:
            aside = path.with_name(path.name + ".corrupt")
            os.replace(path, aside)
            corrupt.append((path, str(exc).partition(": ")[2]))
            return None

    resume = folder / "resume.pt"
    if resume.exists():
        state = read(resume)
        if state is not None:
            found = (resume, state)
    for iteration, path in reversed(list_checkpoints(run_dir)):
        if found is not None and iteration <= found[1]["iteration"]:
            break
        state = read(path)
        if state is not None:
            found = (path, state)
            break
    then = f"resuming from {found[0].name}" if found else "training from the start"
    for path, why in corrupt:
        console.print(f"[yellow]note:[/] {path}: {why}; kept aside as {path.name}.corrupt, "
                      f"{then}", highlight=False, soft_wrap=True)
    return found


def save_checkpoint(path: Path, *, iteration: int, recipe: Recipe, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, generator: torch.Generator) -> None:
    state = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "iteration": iteration,
        "recipe": recipe.to_dict(),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": {"step": iteration},
        # Batches come from `generator` alone (no dropout): its state and the CPU RNG are
        # all a resumed run needs to continue bit-identically.
        "rng": {"generator": generator.get_state(), "torch": torch.get_rng_state()},
    }
    atomic_torch_save(path, state)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    state = safe_torch_load(path, CHECKPOINT_FORMAT, map_location)
    if state.get("version") != CHECKPOINT_VERSION:
        raise UserError(f"{path}: checkpoint format version {state.get('version')} is not "
                        f"supported (this perencode reads version {CHECKPOINT_VERSION})")
    for key in ("iteration", "model", "recipe"):
        if key not in state:
            raise CorruptCheckpoint(f"{path}: checkpoint lacks '{key}' (corrupted or foreign)")
    return state


def restore_model(model: torch.nn.Module, state: dict, path: str | Path) -> None:
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise UserError(f"{path}: checkpoint does not fit this run's model ({first[:160]})") \
            from None


def append_metrics(run_dir: Path, row: dict[str, Any]) -> None:
    append_line(run_dir / "metrics.jsonl", json.dumps(row))


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut by a kill: everything after it is untrusted
    return rows


def truncate_metrics(run_dir: Path, last_step: int) -> None:
    """Drop rows written after the checkpoint a run resumes from (they will be redone)."""
    rows = [r for r in read_metrics(run_dir) if r.get("step", 0) <= last_step]
    atomic_write_text(run_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows))


def is_complete(run_dir: str | Path) -> bool:
    run_dir = Path(run_dir)
    if not (run_dir / "eval.json").exists() or not (run_dir / "recipe.toml").exists():
        return False
    steps = list_checkpoints(run_dir)
    return bool(steps) and steps[-1][0] == read_recipe(run_dir, any_kind=True).train.iterations


def read_json(path: str | Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None
