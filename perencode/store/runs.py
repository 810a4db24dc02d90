"""Run directories: resolved recipe, provenance, metrics, checkpoints, results.

    RUN_DIR/recipe.toml            the resolved recipe (overrides applied)
    RUN_DIR/plugins.json           the plugins its kinds come from, if any
                                   (records.PluginsRecord; only this module reads it)
    RUN_DIR/identity.json          the recipe, code and data that made it
                                   (perencode.store.identity)
    RUN_DIR/env.json               the environment report (`perencode env`), seed,
                                   start/end times
    RUN_DIR/metrics.jsonl          one row per log step: step, loss, accuracy, lr, gradient
                                   norm, seconds (perencode.store.records.MetricsRow)
    RUN_DIR/checkpoints/step-K.pt  every train.checkpoint_every iterations and the last one;
                                   the newest train.keep_checkpoints of them are kept
    RUN_DIR/checkpoints/resume.pt  written when a run is interrupted (SIGINT/SIGTERM)
    RUN_DIR/eval.json              held-out metrics of the final model
    RUN_DIR/status.json            the run's state, written when it changes: {"state":
                                   "finished", "iteration", "eval_sha256"} once eval.json
                                   is written (the run stays finished when its checkpoints,
                                   or its eval.json, are deleted: never trained again);
                                   {"state": "diverged", "iteration", "reason", "checkpoint"}
                                   when training met a number that is not finite (the newest
                                   finite checkpoint is kept); "pruned" what `perencode prune`
                                   deleted. No file: unfinished (or a run of an earlier
                                   perencode: Run.status infers it)
    RUN_DIR/tensorboard/           TensorBoard event files (`train --tensorboard`;
                                   perencode.training.tensorboard)
    RUN_DIR/.perencode.lock        while a command writes in the run (perencode.store.lock)

A checkpoint found unreadable when resuming is renamed step-K.pt.corrupt, one of another
run (another recipe or seed: `foreign_reason`) step-K.pt.foreign (never deleted), and the run
resumes from the newest readable checkpoint of its own; with none left it starts over.

`Run` owns all of it: train, evaluate and stability read and write a run directory through
it (`Run.open`). What a checkpoint holds is perencode.store.checkpoints' alone; what eval.json,
status.json, identity.json, plugins.json and a metrics.jsonl row hold,
perencode.store.records'.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from perencode.common import defaults
from perencode.common.console import console, note_once
from perencode.common.errors import UserError
from perencode.common.files import (
    CorruptCheckpoint,
    append_line,
    atomic_write_json,
    atomic_write_text,
    remove_stale_temps,
)
from perencode.config import plugins, registry
from perencode.config.recipe import Recipe, differences, migrate_stored, read_toml, validate
from perencode.store import environment, identity
from perencode.store.checkpoints import atomic_torch_save, foreign_reason, whole
from perencode.store.checkpoints import load as load_checkpoint
from perencode.store.lock import LOCK_NAME, hold
from perencode.store.records import (
    DIVERGED,
    FINISHED,
    UNFINISHED,
    EnvRecord,
    EvalRecord,
    MetricsRow,
    PluginsRecord,
    StartEntry,
    StatusRecord,
    SweepRecord,
    eval_identity,
    infer_status,
    metrics_row,
    now,
    read_env,
    read_eval,
    read_json,  # noqa: F401  (a run's other JSON files: `runs.read_json`)
    read_plugins,
    read_status,
    read_sweep,
)

# What a run made by a sweep remembers of it (perencode.config.grid.Cell.record): the grid, the
# sweep's name and tag, the cell and its axes.
SWEEP_RECORD = "sweep.json"
PLUGINS_RECORD = "plugins.json"
ENV_RECORD = "env.json"
_STEP_RE = re.compile(r"^step-(\d+)\.pt$")

# A run's state (status.json: records.StatusRecord): its final evaluation written; training
# stopped on a loss, gradient norm or weight that is not a number; anything else (training,
# stopped, killed).
STATUS_NAME = "status.json"
DIVERGED_EXIT = 3  # the exit status of a `train` that stopped on a number that is not finite

# status.json of a finished run records the SHA-256 of the eval.json it wrote
# (StatusRecord.eval_sha256): a reader (figures, verify, report, train) refuses an eval.json
# edited or copied in since.


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def find_runs(paths: list[Path], notes: list[str] | None = None) -> list[Path]:
    """Run directories (holding recipe.toml) at or below `paths`, following links (a sweep
    links cells to identical finished runs), each real directory once, in a stable order.
    Hidden folders (a sweep's .submitit logs) are skipped.

    Each folder is entered once by its resolved path, and a link back to a folder it lies
    in (`self -> .`, `back -> ..`) is a loop: not followed, and named once in a note. A
    link whose target is gone (a run linked from a deleted grid) is named too. The notes
    go to `notes` when given, else to the console."""
    found: list[Path] = []
    entered: set[str] = set()
    said: list[str] = []

    def walk(folder: Path) -> None:
        entered.add(os.path.realpath(folder))
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            said.append(f"{folder}: cannot be read ({exc.strerror}); skipped")
            return
        if any(e.name == "recipe.toml" for e in entries):
            found.append(folder)  # a run directory holds no other run
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = folder / entry.name
            if entry.is_symlink() and not path.exists():
                why = _not_there(path)
                said.append(f"{why}; skipped" if "loop" in why else
                            f"{why} (its run was moved or deleted); skipped")
            elif entry.is_dir():
                real = os.path.realpath(path)
                if entry.is_symlink() and real in ancestors(folder):
                    said.append(f"{path}: a link back to {real}, a folder it lies in (a "
                                "loop); not followed")
                elif real not in entered:
                    walk(path)

    def ancestors(folder: Path) -> set[str]:
        real = Path(os.path.realpath(folder))
        return {str(real), *map(str, real.parents)}

    for path in paths:
        path = Path(path)
        if not path.exists():
            raise UserError(_not_there(path))
        if not path.is_dir():
            raise UserError(f"{path}: a file, not a run directory or a folder holding them")
        if os.path.realpath(path) not in entered:
            walk(path)
    for line in said:
        if notes is not None:
            notes.append(line)
        else:
            console.print(f"[yellow]note:[/] {line}", highlight=False, soft_wrap=True)
    return found


def _not_there(path: Path) -> str:
    """Why `path`, which does not resolve, is not a folder: a link to nothing, a loop of
    links, or nothing at all."""
    if not os.path.islink(path):
        return f"{path}: no such run directory or folder"
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{path}: a loop of symbolic links (it leads back to itself)"
    return f"{path}: a link to {os.readlink(path)}, which does not exist"


def enclosing_run(path: Path) -> Path | None:
    """The run directory (holding recipe.toml) that `path` lies inside, or None. `train`
    refuses to make a run there: `find_runs` stops at a run directory, so a run inside
    another would never be found."""
    for folder in Path(os.path.abspath(path)).parents:
        if (folder / "recipe.toml").is_file():
            return folder
    return None


def holds_run(recipe_path: str | Path) -> bool:
    """Whether `recipe_path` is the recipe.toml of a run directory (one `train` claimed: it
    wrote identity.json, status.json or metrics.jsonl beside it)."""
    path = Path(recipe_path)
    return path.name == "recipe.toml" and any(
        (path.parent / name).exists() for name in (identity.RECORD, STATUS_NAME, "metrics.jsonl"))


def recipe_check(recipe_path: str | Path) -> Callable[[dict], None] | None:
    """What `load_recipe` checks before validating a run's recipe.toml: the plugins its run
    needs (`require_plugins`); None for a recipe file that is no run's."""
    path = Path(recipe_path)
    return functools.partial(require_plugins, path.parent) if holds_run(path) else None


def default_run_dir(recipe_path: str | Path, seed: int) -> Path:
    """RUNS/<recipe stem>/seed=<seed>, the seed named as a sweep names its axes
    (perencode.config.naming). A run an earlier perencode made at RUNS/<stem>/seed-<seed> is that
    run (resumed or reported) while no seed=<seed> folder exists; a note says so."""
    folder = defaults.RUNS / Path(recipe_path).stem
    named, earlier = folder / f"seed={seed}", folder / f"seed-{seed}"
    if not named.exists() and (earlier / "recipe.toml").is_file():
        console.print(f"note: {earlier}: the run of this recipe and seed, in the folder an "
                      f"earlier perencode named (new runs go to {named})", highlight=False,
                      soft_wrap=True)
        return earlier
    return named


def read_recipe(run_dir: str | Path, any_kind: bool = False) -> Recipe:
    """The run's resolved recipe; `any_kind` for reading its results (a task, model or
    encoding the reader has not registered keeps its name; perencode.config.recipe.validate)."""
    path = Path(run_dir) / "recipe.toml"
    if not Path(run_dir).exists():
        raise UserError(f"{run_dir}: the folder does not exist")
    if not path.is_file():
        raise UserError(f"{run_dir}: not a perencode run directory (no recipe.toml)")
    data = read_toml(path)
    if not any_kind:
        require_plugins(run_dir, data)  # a plugin's kind: name the plugin and how to load it
    return validate(migrate_stored(data), str(path), any_kind)


def recorded_plugins(run_dir: str | Path) -> PluginsRecord | None:
    """RUN_DIR/plugins.json (None: no file, a run of the package's own kinds); UserError
    `PATH: damaged (why)` when it cannot be read."""
    path = Path(run_dir) / PLUGINS_RECORD
    return read_plugins(path) if path.is_file() else None


def recorded_labels(run_dir: str | Path) -> dict[tuple[str, str], str]:
    """(registry, name) -> label: the labels RUN_DIR/plugins.json records for its plugins'
    kinds; only read (a missing or damaged file, or one written before labels were
    recorded: none)."""
    try:
        record = recorded_plugins(run_dir)
    except UserError:
        return {}
    return {(section, name): label for entry in (record.plugins if record else [])
            for section, names in entry.labels.items() if section in registry.TAGS
            for name, label in names.items() if label}


_DAMAGED: set[str] = set()  # the damaged plugins.json files noted so far


def require_plugins(run_dir: str | Path, data: dict) -> None:
    """Before a run's recipe (`data`, as read) is validated: a kind it names that no
    registration holds, and that RUN_DIR/plugins.json says came from a plugin, is a
    UserError naming the plugin and how to load it. The file is only read: nothing a run
    directory names is executed. A damaged file is a note (once), and validation then names
    a kind nothing registers."""
    try:
        record = recorded_plugins(run_dir)
    except UserError as exc:
        if str(exc) not in _DAMAGED:  # once: a command reads a run's recipe more than once
            _DAMAGED.add(str(exc))
            console.print(f"[yellow]note:[/] {exc}; ignored", highlight=False,
                          soft_wrap=True)
        return
    for section, tag in registry.TAGS.items():
        table = data.get(section)
        name = table.get(tag) if isinstance(table, dict) else None
        if record is None or name is None or name in registry.registry(section):
            continue
        field = f"{section}.{tag} = {name!r}"
        for entry in record.plugins:
            if field in entry.provides:
                plugin = plugins.Plugin(**entry.origin())
                raise UserError(f"{run_dir}: the run needs the plugin {plugin.describe()} "
                                f"for {field}, which this process has not loaded; "
                                f"{plugin.how_to_load()}")


class Run:
    """One run directory (layout above) and its checkpoint format.

        run = Run(run_dir)
        existed = run.claim(recipe)          # recipe.toml; another recipe's run is refused
        run.start(device)                    # env.json: provenance of this (re)start
        found = run.resume(device) if existed else None  # the newest checkpoint to go on from
        run.log(row)                         # a metrics.jsonl row
        run.save(session.state())            # checkpoints/step-K.pt, older ones pruned
        run.finish(result)                   # eval.json and the end time
        path, state = run.load()             # the newest (or a given) checkpoint's state

    `recipe` is the claimed recipe, or else the one in recipe.toml (read when first needed).
    A command that writes in a run opens it (`Run.open`: the lock, the temporary files of
    killed writers, the identity check); one that only reads makes a plain `Run(path)`.
    """

    def __init__(self, path: str | Path):
        self.dir = Path(path)
        self._recipe: Recipe | None = None
        self.accepted: list[str] = []  # code or data changes `open` accepted

    @classmethod
    @contextlib.contextmanager
    def open(cls, path: str | Path, command: str, *, creating: bool = False,
             accept_code_change: bool = False, accept_data_change: bool = False
             ) -> Iterator[Run]:
        """The run directory `path`, opened for `command` (train, eval, stability) to write
        in, for the `with` block: its recipe read (unless `creating`, a `train` that may
        make the run: the directory need not hold one yet), the directory locked
        (perencode.store.lock: a second command on it is refused in one line), the temporary
        files killed writers left removed, and its recipe.toml, data and code checked to
        be those it was made with (perencode.store.identity; other code with
        `accept_code_change`, other data content with `accept_data_change`: recorded, and
        listed in `accepted`)."""
        run = cls(path)
        if not creating:
            run._recipe = read_recipe(run.dir)  # not a run: said before the lock file is made
        with hold(run.dir, command):
            if any((run.dir / name).exists() for name in ("recipe.toml", identity.RECORD)):
                for folder in (run.dir, run.checkpoint_dir):
                    remove_stale_temps(folder)
            if (run.dir / "recipe.toml").is_file():
                stored = run.recipe if not creating else read_recipe(run.dir, any_kind=True)
                run.accepted = identity.check(run.dir, stored, command,
                                              accept_code_change=accept_code_change,
                                              accept_data_change=accept_data_change)
            yield run

    @property
    def recipe(self) -> Recipe:
        if self._recipe is None:
            self._recipe = read_recipe(self.dir)
        return self._recipe

    @property
    def checkpoint_dir(self) -> Path:
        return self.dir / "checkpoints"

    @property
    def resume_path(self) -> Path:
        return self.checkpoint_dir / "resume.pt"

    def checkpoint_path(self, iteration: int) -> Path:
        return self.checkpoint_dir / f"step-{iteration}.pt"

    def checkpoints(self) -> list[tuple[int, Path]]:
        """The periodic checkpoints `step-K.pt`, sorted by iteration K."""
        if not self.checkpoint_dir.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.checkpoint_dir.iterdir()
                 if (m := _STEP_RE.match(p.name))]
        return sorted(found)

    @property
    def status_path(self) -> Path:
        return self.dir / STATUS_NAME

    def status(self) -> StatusRecord:
        """The run's completeness and numerical health (records.StatusRecord: FINISHED,
        DIVERGED or UNFINISHED, ...; the layout above). Read from status.json (a run
        recorded finished whose eval.json was deleted since stays finished, with "missing":
        `_missing`); a run directory written before perencode kept it has its state
        inferred from its other files (records.infer_status, the migration of those runs)."""
        if self.status_path.exists():
            try:
                return self._missing(read_status(self.status_path))
            except UserError as exc:
                note_once(f"{exc}; the run's state is inferred from its other files")
        if not (self.dir / "recipe.toml").exists():
            return StatusRecord(state=UNFINISHED)
        total = read_recipe(self.dir, any_kind=True).train.iterations
        rows = self.metrics()
        eval_path = self.dir / "eval.json"
        try:
            at = read_eval(eval_path).iteration if eval_path.exists() else None
        except UserError:
            at = None
        steps = self.checkpoints()
        return infer_status(total, rows, at, eval_path.exists(),
                            steps[-1][0] if steps else None, self._ended())

    def _missing(self, recorded: StatusRecord) -> StatusRecord:
        """A recorded state, with "missing": "eval.json" where the run is recorded finished
        and its eval.json was deleted since: it stays finished (never trained again) and
        has no result until the file is restored or written again (`train` and the sweep
        say which)."""
        if recorded.state == FINISHED and not (self.dir / "eval.json").exists():
            return recorded.model_copy(update={"missing": "eval.json"})
        return recorded

    def _ended(self) -> bool:
        """Whether env.json holds an end time (written after eval.json)."""
        try:
            return read_env(self.dir / ENV_RECORD).end_time is not None
        except UserError:
            return False

    def restore_hint(self) -> str:
        """How a finished run whose eval.json is missing gets it back."""
        if self.checkpoints():
            return (f"restore it from a copy of the run, or `perencode eval {self.dir}` "
                    "scores the final checkpoint again")
        return ("its checkpoints were deleted (pruned): restore it from a copy of the run, "
                f"or train the recipe into a new run directory (`perencode train "
                f"{self.dir / 'recipe.toml'} --run-dir NEW_DIR`)")

    def is_complete(self) -> bool:
        """The final evaluation is written (status); checkpoints may have been deleted."""
        return self.status().state == FINISHED

    def record_status(self, state: str, **fields: Any) -> None:
        """status.json: the run's state, with `fields` (iteration, reason, ...) and the time;
        what `perencode prune` recorded is kept."""
        pruned = self.status().pruned if self.status_path.exists() else None
        self.write_status(StatusRecord(state=state, **fields, time=now(), pruned=pruned))

    def write_status(self, record: StatusRecord) -> None:
        atomic_write_json(self.status_path, record.as_dict())

    def claim(self, recipe: Recipe) -> bool:
        """Make the directory this recipe's run. Returns True if it already held this
        recipe's run.

        A different recipe in an existing run directory is refused: a finished run is never
        silently overwritten.
        """
        existed = self.check_claim(recipe)
        if not existed:
            identity.record(self.dir, recipe)  # first: a run with a recipe.toml has one
            atomic_write_text(self.dir / "recipe.toml", recipe.to_toml())
            used = plugins.entries(recipe)
            if used:  # a run of the package's own kinds has none
                atomic_write_json(self.dir / PLUGINS_RECORD,
                                  PluginsRecord.model_validate({"plugins": used}).as_dict())
        self._recipe = recipe
        return existed

    def check_claim(self, recipe: Recipe) -> bool:
        """`claim`'s checks without writing anything: True if the directory holds this
        recipe's run, False if it is free; UserError if it holds something else."""
        run_dir = self.dir
        if run_dir.exists() and not run_dir.is_dir():
            raise UserError(f"{run_dir}: exists and is not a directory; choose another --run-dir")
        outer = enclosing_run(run_dir)
        if outer is not None:
            raise UserError(f"{run_dir}: inside the run directory {outer} (a run directory "
                            "holds no other run: figures, verify, report and prune would "
                            "never see it); choose a --run-dir outside it")
        path = run_dir / "recipe.toml"
        if path.exists():
            # Read as results are (a kind of a plugin not loaded keeps its name): a different
            # recipe is named as such, not as the plugin that recipe needed.
            existing = read_recipe(run_dir, any_kind=True)
            diff = differences(existing.identity(), recipe.identity())
            if diff:
                raise UserError(f"{run_dir}: holds a run of a different recipe ({diff[0]}"
                                f"{'; ...' if len(diff) > 1 else ''}); choose another --run-dir")
            return True
        # identity.json alone: a claim cut short before its recipe.toml
        if run_dir.exists() and any(p.name not in (LOCK_NAME, identity.RECORD)
                                    for p in run_dir.iterdir()):
            raise UserError(f"{run_dir}: exists and is not a perencode run directory; "
                            "choose another --run-dir")
        return False

    def start(self, device: torch.device) -> None:
        """env.json: provenance of the first start, plus one entry per (re)start."""
        path = self.dir / ENV_RECORD
        try:
            previous = read_env(path) if path.exists() else EnvRecord()
        except UserError as exc:
            # Provenance only: losing the earlier starts must not stop a run from resuming.
            os.replace(path, path.with_name("env.json.corrupt"))
            console.print(f"[yellow]note:[/] {exc}; kept aside as env.json.corrupt, the "
                          "run's provenance starts again from this start", highlight=False,
                          soft_wrap=True)
            previous = EnvRecord()
        current = environment.report(device)
        starts = [*previous.starts,
                  StartEntry(time=now(), device=current["device"],
                             git_commit=current["git_commit"], git_dirty=current["git_dirty"])]
        write_env(self.dir, EnvRecord(**current, seed=self.recipe.train.seed,
                                      start_time=starts[0].time, starts=starts))

    def resume(self, map_location: str | torch.device = "cpu") -> tuple[Path, dict] | None:
        """The newest readable checkpoint to continue from (`resume_state`), with the
        metrics rows logged after it dropped; None when there is none (the run starts over:
        every row is dropped). perencode.training.session.Session.load continues from it."""
        found = self.resume_state(map_location=map_location)
        self.truncate_metrics(found[1]["iteration"] if found is not None else 0)
        return found

    def resume_state(self, map_location: str | torch.device = "cpu"
                     ) -> tuple[Path, dict] | None:
        """The newest checkpoint of this run to resume from (the last step-K.pt, or
        resume.pt when it is later) and its state; None when there is none.

        A candidate that cannot be read is renamed NAME.corrupt, one of another run
        (`foreign_reason`: another recipe or seed) NAME.foreign; both are kept for
        inspection, out of every listing, and the next older one is tried. One line says
        what happened to each and what the run does instead.
        """
        found: tuple[Path, dict] | None = None
        aside: list[tuple[Path, str, str]] = []

        def set_aside(path: Path, suffix: str, why: str) -> None:
            os.replace(path, path.with_name(path.name + suffix))
            aside.append((path, suffix, why))

        def read(path: Path) -> dict | None:
            try:
                state = load_checkpoint(path, map_location)
            except CorruptCheckpoint as exc:
                set_aside(path, ".corrupt", str(exc).partition(": ")[2])
                return None
            except UserError as exc:  # another format or version: not this run's either
                set_aside(path, ".foreign", str(exc).partition(": ")[2])
                return None
            why = foreign_reason(state, self.recipe, path)
            if why is not None:
                set_aside(path, ".foreign", why)
                return None
            return state

        if self.resume_path.exists():
            state = read(self.resume_path)
            if state is not None:
                found = (self.resume_path, state)
        for iteration, path in reversed(self.checkpoints()):
            if found is not None and iteration <= found[1]["iteration"]:
                break
            state = read(path)
            if state is not None:
                found = (path, state)
                break
        then = (f"resuming from {found[0].name}" if found else
                "no checkpoint of this run is left: training starts over from iteration 0")
        for path, suffix, why in aside:
            console.print(f"[yellow]note:[/] {path}: {why}; kept aside as {path.name}{suffix}, "
                          f"{then}", highlight=False, soft_wrap=True)
        return found

    def save(self, session_state: dict, interrupted: bool = False) -> Path:
        """Checkpoint a training session's state (perencode.training.session.Session.state: its
        iteration, model, optimizer and random streams); returns its path.

        Periodic: step-K.pt, then resume.pt is dropped and all but the recipe's newest
        train.keep_checkpoints are deleted. `interrupted`: resume.pt, the others untouched.
        """
        iteration = session_state["iteration"]
        path = self.resume_path if interrupted else self.checkpoint_path(iteration)
        atomic_torch_save(path, whole(session_state, self.recipe))
        if not interrupted:
            self.resume_path.unlink(missing_ok=True)
            self.prune(self.recipe.checkpoints_kept())
        return path

    def prune(self, keep: int | None) -> list[Path]:
        """Delete all but the newest `keep` periodic checkpoints (None: keep all); the
        deleted paths. Called after a new one is written, so the newest always survives."""
        if keep is None:
            return []
        old = [path for _, path in self.checkpoints()[:-keep]]
        for path in old:
            path.unlink(missing_ok=True)
        return old

    def load(self, checkpoint: str | Path | None = None,
             map_location: str | torch.device = "cpu") -> tuple[Path, dict]:
        """(path, state) of the newest (or the given) checkpoint, checked to be this run's."""
        recipe = self.recipe
        newest = checkpoint is None
        if checkpoint is None:
            steps = self.checkpoints()
            if not steps and self.resume_path.is_file():
                raise UserError(f"{self.dir}: no periodic checkpoint yet, only "
                                f"{self.resume_path.name} of an interrupted run: `perencode "
                                f"train` resumes it; `--checkpoint {self.resume_path}` "
                                "scores it as it is")
            if not steps:
                raise UserError(f"{self.dir}: no checkpoints yet (train it first)")
            checkpoint = steps[-1][1]
        try:
            state = load_checkpoint(checkpoint, map_location=map_location)
        except CorruptCheckpoint as exc:
            if not newest:
                raise
            raise CorruptCheckpoint(f"{exc}; {self._instead(Path(checkpoint))}") from None
        why = foreign_reason(state, recipe, checkpoint)
        if why is not None:
            raise UserError(f"{checkpoint}: not a checkpoint of the run in {self.dir}: {why}")
        return Path(checkpoint), state

    def _instead(self, bad: Path) -> str:
        """What to run when the newest checkpoint cannot be read: a command that works."""
        older = [p for _, p in self.checkpoints() if p != bad]
        if older:
            return (f"score the older {older[-1].name} with `perencode eval {self.dir} "
                    f"--checkpoint {older[-1]}`")
        if not self.is_complete():
            return (f"`perencode train {self.dir / 'recipe.toml'} --run-dir {self.dir}` "
                    f"sets it aside and resumes from the newest readable checkpoint")
        return (f"no other checkpoint is kept: train the recipe again into a new run "
                f"directory, `perencode train {self.dir / 'recipe.toml'} --run-dir NEW_DIR`")

    def log(self, row: MetricsRow) -> None:
        """One metrics.jsonl row."""
        append_line(self.dir / "metrics.jsonl", row.line())

    def metrics(self) -> list[MetricsRow]:
        """The metrics.jsonl rows. A damaged line (bytes that are not UTF-8, not JSON, not a
        row with a whole-number step, a loss and seconds: a power loss, a writer killed
        mid-line, a hand edit) is skipped with one note naming the file and its lines; every
        valid row around it is kept."""
        path = self.dir / "metrics.jsonl"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return []
        rows, damaged = [], []
        for number, line in enumerate(data.split(b"\n"), 1):
            if not line.strip():
                continue
            row = metrics_row(line)
            if isinstance(row, str):
                damaged.append(f"{number} ({row})")
            else:
                rows.append(row)
        if damaged:
            note_once(f"{path}: skipped damaged line{'s' if len(damaged) > 1 else ''} "
                      f"{', '.join(damaged)}; kept the {len(rows)} valid rows")
        return rows

    def truncate_metrics(self, last_step: int) -> None:
        """Drop rows written after the checkpoint a run resumes from (they will be redone),
        and any damaged line (`metrics` names it)."""
        rows = [r for r in self.metrics() if r.step <= last_step]
        atomic_write_text(self.dir / "metrics.jsonl", "".join(r.line() + "\n" for r in rows))

    def newest_checkpoint(self) -> Path | None:
        """The checkpoint of the highest iteration on disk (resume.pt, when present, is newer
        than every step-K.pt: writing a step-K.pt removes it); None when there is none. By
        iteration, never by file time (a copy or a `touch` changes that)."""
        if self.resume_path.exists():
            return self.resume_path
        steps = self.checkpoints()
        return steps[-1][1] if steps else None

    def saved_iteration(self) -> int | None:
        """The iteration the run resumes from: its newest checkpoint's (resume.pt's read
        from the file, later than the last logged step; a step-K.pt's from its name), or
        None without one."""
        steps = self.checkpoints()
        if self.resume_path.exists():
            try:
                return int(load_checkpoint(self.resume_path)["iteration"])
            except UserError:  # unreadable: resuming sets it aside and takes the step-K.pt
                pass
        return steps[-1][0] if steps else None

    def write_eval(self, result: EvalRecord, name: str = "eval.json") -> Path:
        """Write `result` to `name`; eval.json of a run recorded finished also gets its
        hash recorded in status.json again (`check_eval`)."""
        path = self.dir / name
        atomic_write_json(path, result.as_dict())
        if name == "eval.json" and self.status_path.exists():
            try:
                record = read_status(self.status_path)
            except UserError:
                record = None
            if record is not None and record.state == FINISHED:
                self.write_status(record.model_copy(update={"eval_sha256": sha256_of(path)}))
        return path

    def finish(self, result: EvalRecord) -> Path:
        """eval.json of the final model, then the end time in env.json, then status.json
        (finished, with eval.json's hash)."""
        path = self.write_eval(result)
        env_path = self.dir / ENV_RECORD
        env = read_env(env_path) if env_path.exists() else EnvRecord()
        write_env(self.dir, env.model_copy(update={"end_time": now()}))
        self.record_status(FINISHED, iteration=self.recipe.train.iterations,
                           eval_sha256=sha256_of(path))
        return path

    def diverged(self, iteration: int, reason: str) -> Path | None:
        """Record that training diverged at `iteration` (`reason`: what was not finite);
        the newest checkpoint, all of whose weights are finite (train checks them before
        each save), is kept and named. Returns its path (None when there is none)."""
        steps = self.checkpoints()
        # resume.pt (an interrupt's) is newer than every step-K.pt: the next one deletes it
        last = self.resume_path if self.resume_path.exists() else \
            steps[-1][1] if steps else None
        self.record_status(DIVERGED, iteration=iteration, reason=reason,
                           checkpoint=str(last.relative_to(self.dir)) if last else None)
        return last


def check_eval(run_dir: str | Path, recipe: Recipe, status: StatusRecord | None = None
               ) -> EvalRecord | None:
    """Refuse (UserError, one line) a run's eval.json that is not the one the run wrote:
    identity fields (EVAL_IDENTITY) that are not the run recipe's (another run's file), or
    content whose SHA-256 is not the one status.json recorded when the run finished (or
    `eval` last wrote it): edited or copied in since. A run finished before the hash was
    recorded has its identity fields checked only. Returns the record (None: no eval.json,
    nothing to check)."""
    run = Run(run_dir)
    path = run.dir / "eval.json"
    if not path.is_file():
        return None
    record = read_eval(path)
    ours = eval_identity(recipe)
    differ = [f"{key} {value!r} (the run's is {ours[key]!r})"
              for key, value in record.identity().items() if value != ours[key]]
    again = run.restore_hint().replace("restore it", "restore the run's own")
    if differ:
        raise UserError(f"{path}: the result of another run ({', '.join(differ)}); {again}")
    status = run.status() if status is None else status
    recorded = status.eval_sha256
    if recorded and sha256_of(path) != recorded:
        raise UserError(f"{path}: not the eval.json this run wrote (its SHA-256 differs from "
                        f"the one {STATUS_NAME} recorded: edited, or copied from another "
                        f"run); {again}")
    return record


def env_record(run_dir: str | Path) -> EnvRecord | None:
    """RUN_DIR/env.json (None: no file, training never started); UserError naming the file
    when it cannot be read."""
    path = Path(run_dir) / ENV_RECORD
    return read_env(path) if path.is_file() else None


def write_env(run_dir: str | Path, record: EnvRecord) -> None:
    """RUN_DIR/env.json, atomically."""
    atomic_write_json(Path(run_dir) / ENV_RECORD, record.as_dict())


def sweep_record(run_dir: str | Path) -> SweepRecord | None:
    """RUN_DIR/sweep.json, or None (a run trained by hand; an unreadable file names
    nothing)."""
    path = Path(run_dir) / SWEEP_RECORD
    try:
        return read_sweep(path) if path.is_file() else None
    except UserError:
        return None


def record_sweep(run_dir: str | Path, record: dict[str, Any]) -> None:
    """RUN_DIR/sweep.json: the sweep that claimed the run (perencode.config.grid.Cell.record)."""
    atomic_write_json(Path(run_dir) / SWEEP_RECORD,
                      SweepRecord.model_validate(record).as_dict())
