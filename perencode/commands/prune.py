"""`perencode prune`: free the space of finished runs, keeping what their results need.

A finished run's checkpoints (checkpoints/step-K.pt, resume.pt) are what takes the space;
once its final evaluation is written (status.json, perencode.store.runs) they are needed only to
score it again (`eval`) or to analyse its gradient stability (`stability` reads every
checkpoint of a dual-frequency run). Prune deletes them and keeps every file that `figures`,
`verify`, `report` and `sweep` read (KEPT says what each is for). It leaves alone:
unfinished runs (their checkpoints resume them), diverged ones (the last finite checkpoint
is kept for inspection), another run's checkpoints set aside as *.foreign, and the
checkpoints of a dual-frequency run that stability.csv does not cover yet (unless
`without_stability`). A run written before status.json existed gets one first, so that it
stays finished without its checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from perencode.config import registry
from perencode.store import runs
from perencode.store.lock import hold

# What a pruned run keeps, and what for.
KEPT = {
    "recipe.toml": "its recipe (every command)",
    "status.json": "that it finished (figures, verify, report, sweep, train)",
    "eval.json": "its held-out metrics (figures, verify, report)",
    "metrics.jsonl": "its training curve and time (figures, report)",
    "env.json": "its devices and code commits (report)",
    "plugins.json": "the plugins its kinds came from (every command)",
    "identity.json": "the recipe, code and data that made it (every command)",
    "stability.csv": "its gradient stability (figures, verify, report)",
}


@dataclass
class Pruned:
    """What prune does (or would do) to one run directory."""
    run: Path
    state: str
    deleted: list[Path] = field(default_factory=list)
    size: int = 0
    kept_because: str = ""  # why checkpoints are kept, "" when none are
    inferred: str = ""      # an earlier perencode's run: what its state was inferred from

    def line(self, dry_run: bool) -> str:
        if not self.deleted:
            return f"{self.run}: nothing deleted, {self.kept_because or 'no checkpoints'}"
        verb = "would delete" if dry_run else "deleted"
        return (f"{self.run}: {verb} {len(self.deleted)} checkpoint(s), {_size(self.size)}"
                + (f"; {self.kept_because}" if self.kept_because else "")
                + (f"; {'would record' if dry_run else 'recorded'} status.json first (no "
                   f"record: finished inferred from {self.inferred})" if self.inferred else ""))


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def plan_run(run_dir: Path, without_stability: bool = False) -> Pruned:
    """What pruning `run_dir` deletes, and why it keeps what it keeps."""
    run = runs.Run(run_dir)
    status = run.status()
    found = Pruned(run_dir, status.state)
    if status.state == runs.UNFINISHED:
        if run.newest_checkpoint() is not None:
            found.kept_because = "unfinished: its checkpoints resume it"
        elif run.metrics():
            found.kept_because = ("unfinished, stopped before its first checkpoint: it "
                                  "trains again from iteration 0")
        else:  # a sweep's claimed cell, or a run stopped before its first step
            found.kept_because = "not started: it trains from iteration 0"
        return found
    if status.state == runs.DIVERGED:
        found.kept_because = "diverged: its last finite checkpoint is kept for inspection"
        return found
    if status.missing:
        found.kept_because = (f"finished, but its {status.missing} is missing: its "
                              f"checkpoints score it again (`perencode eval {run_dir}`)")
        return found
    steps = run.checkpoints()
    doomed = [path for _, path in steps]
    task = runs.read_recipe(run_dir, any_kind=True).task.name
    if task in registry.having("task", "stability") and not without_stability:
        analysed = stability_iterations(run_dir)
        todo = [path for k, path in steps if k not in analysed]
        if todo:
            doomed = [path for path in doomed if path not in todo]
            found.kept_because = (f"kept {len(todo)} checkpoint(s) stability.csv does not "
                                  "cover yet (`perencode stability` reads them; "
                                  "--without-stability deletes them too)")
    if run.resume_path.exists():
        doomed.append(run.resume_path)
    found.deleted = doomed
    found.inferred = status.inferred or ""
    found.size = sum(path.stat().st_size for path in doomed)
    return found


def stability_iterations(run_dir: Path) -> set[int]:
    """The checkpoints' iterations stability.csv holds rows of."""
    path = run_dir / "stability.csv"
    if not path.exists():
        return set()
    with path.open(encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split(",")
        if "iteration" not in header:
            return set()
        column = header.index("iteration")
        return {int(line.split(",")[column]) for line in f if line.strip()}


def prune(paths: list[Path], dry_run: bool = False,
          without_stability: bool = False) -> list[Pruned]:
    """Prune every run under `paths` (perencode.store.runs.find_runs); what was (or, `dry_run`,
    would be) deleted in each. Each run directory is locked while its files go."""
    done = []
    for run_dir in runs.find_runs(paths):
        found = plan_run(run_dir, without_stability)
        done.append(found)
        if dry_run or not found.deleted:
            continue
        run = runs.Run(run_dir)
        with hold(run_dir, "prune"):
            status = run.status()
            if status.inferred:  # an earlier perencode's run: the record comes first
                run.record_status(runs.FINISHED, iteration=status.iteration,
                                  inferred=status.inferred)
            for path in found.deleted:
                path.unlink(missing_ok=True)
            pruned = {"time": runs.now(), "bytes": found.size,
                      "deleted": [str(p.relative_to(run_dir)) for p in found.deleted]}
            run.write_status(run.status().model_copy(update={"pruned": pruned,
                                                             "missing": None}))
    return done
