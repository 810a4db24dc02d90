"""Grids of runs and the sweep that trains them (`perencode sweep`).

A grid file (`recipes/paper/*.toml`) is a recipe plus axes:

    base = "../gru_vocab256.toml"      # optional: a recipe or another grid, relative to this
                                       # file; the tables below override it key by key
    description = "Fig. 2 (GRU) ..."

    [grid]                             # dotted recipe keys -> lists; the cells are the product
    "task.vocab_size" = [32, 64, 128, 256]
    "encoding.kind" = ["none", "sinusoidal"]
    "train.seed" = [111, 222, 333, 444, 555]

    [slurm]                            # optional: SlurmConfig (partition, time_min, ...)
    [sweep]                            # optional: after = ["stability"]

Every cell is validated as a Recipe and runs in `OUT/<grid file stem>/<axis>=<value>/...`,
axes in file order with short keys (`vocab_size=256/encoding=none/seed=111`), so the same
grid always maps to the same directories: finished runs are skipped, interrupted ones
resume (`perencode train` does both), and a cell whose exact recipe already finished in
another grid under OUT is linked to that run instead of trained twice.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import submitit
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.live import Live
from rich.table import Table
from rich.text import Text

from perencode import runs
from perencode.errors import UserError
from perencode.progress import console
from perencode.recipe import SECTIONS, Recipe, apply_overrides, parse_value, read_toml, validate


class SlurmConfig(BaseModel):
    """The grid's `[slurm]` table (or the CLI's --partition/--time-min/... options)."""

    model_config = ConfigDict(extra="forbid")
    cluster: Literal["slurm", "local", "debug"] = Field(
        "slurm", description="submitit executor: slurm, or local/debug to try the path on "
        "this machine.")
    partition: str | None = Field(None, description="SLURM partition (cluster default if unset).")
    time_min: int = Field(1440, ge=1, description="Time limit of one job; a run that needs "
                          "longer is requeued and resumes from its checkpoint.")
    gpus_per_job: int = Field(1, ge=0, description="GPUs per job (one run per job).")
    cpus_per_job: int = Field(4, ge=1, description="CPU cores per job (also its torch threads).")
    mem_gb: float | None = Field(None, gt=0, description="Memory per job (cluster default).")
    array_parallelism: int = Field(64, ge=1, description="Jobs of the array running at once.")
    max_requeues: int = Field(30, ge=0, description="Time-outs after which a job is not "
                              "requeued again (preemptions do not count).")


class SweepConfig(BaseModel):
    """The grid's `[sweep]` table."""

    model_config = ConfigDict(extra="forbid")
    after: list[Literal["stability"]] = Field(
        [], description="Analyses run on each finished run (`perencode stability RUN`).")


@dataclass
class Cell:
    name: str                 # the run directory below OUT/<grid>: "vocab_size=32/seed=111"
    coords: dict[str, Any]    # axis (dotted key) -> value
    recipe: Recipe


@dataclass
class Grid:
    path: Path
    name: str
    description: str
    cells: list[Cell]
    slurm: SlurmConfig
    sweep: SweepConfig


# --------------------------------------------------------------------------------------
# Grid files
# --------------------------------------------------------------------------------------

def short_key(key: str) -> str:
    """`task.vocab_size` -> `vocab_size`; `encoding.kind` -> `encoding`; `task.name` -> `task`."""
    section, _, name = key.rpartition(".")
    return section if name in ("kind", "name") and section else name


def short_names(keys) -> dict[str, str]:
    """Short names for dotted keys; keys whose short names collide keep their dotted form."""
    short = {k: short_key(k) for k in keys}
    counts = Counter(short.values())
    return {k: s if counts[s] == 1 else k for k, s in short.items()}


def format_value(value: Any) -> str:
    """An axis value as it appears in a directory name (stable, no path separators)."""
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, (list, tuple)):
        text = ",".join(format_value(v) for v in value)
    else:
        text = str(value)  # floats: shortest repr, 1e-3 -> 0.001
    return text.replace(os.sep, "-").replace(" ", "_")


def _merge(base: dict, top: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _read_layers(path: Path, chain: tuple[Path, ...] = ()) -> dict:
    """The file's TOML merged over its `base` chain."""
    path = path.resolve()
    if path in chain:
        raise UserError(f"{chain[-1]}: `base` leads back to {path} (a loop)")
    data = read_toml(path)
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise UserError(f"{path}: base: expected a path string, got {base!r}")
    return _merge(_read_layers(path.parent / base, (*chain, path)), data)


def _table(model: type[BaseModel], data: Any, source: str, table: str) -> BaseModel:
    if not isinstance(data, dict):
        raise UserError(f"{source}: [{table}] must be a table, got {data!r}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            msg = f"unknown key (allowed: {', '.join(model.model_fields)})"
        else:
            msg = f"{err['msg']} (got {err.get('input')!r})"
        raise UserError(f"{source}: [{table}] {where}: {msg}") from None


def _check_axis(key: str, values: Any, source: str) -> None:
    section, _, name = key.partition(".")
    if section not in SECTIONS or not name or "." in name:
        raise UserError(f"{source}: [grid] '{key}': axes are section.key with section one of "
                        f"{', '.join(SECTIONS)}")
    if not isinstance(values, list) or not values:
        raise UserError(f"{source}: [grid] '{key}': must be a non-empty list of values, got "
                        f"{values!r}")
    shown = [format_value(v) for v in values]
    repeated = [v for v, n in Counter(shown).items() if n > 1]
    if repeated:
        raise UserError(f"{source}: [grid] '{key}': value {repeated[0]} appears twice")


def _set(data: dict, key: str, value: Any) -> None:
    section, _, name = key.partition(".")
    table = data.setdefault(section, {})
    if not isinstance(table, dict):
        raise UserError(f"[{section}] is not a table")
    table[name] = copy.deepcopy(value)


def _select(cells: list[Cell], axes: dict[str, list], only: list[str], source: str) -> list[Cell]:
    """Keep the cells matching every `--only KEY=V1,V2` (KEY: dotted or short axis name)."""
    names = short_names(axes)
    by_name = {**{v: k for k, v in names.items()}, **{k: k for k in axes}}
    for item in only:
        key, sep, values = item.partition("=")
        axis = by_name.get(key.strip())
        if not sep or axis is None:
            raise UserError(f"--only '{item}': expected AXIS=V1,V2 with AXIS one of "
                            f"{', '.join(names.values())} (axes of {source})")
        wanted = {format_value(parse_value(v.strip())) for v in values.split(",")}
        known = {format_value(v) for v in axes[axis]}
        unknown = sorted(wanted - known)
        if unknown:
            raise UserError(f"--only '{item}': {unknown[0]} is not a value of {axis} "
                            f"(values: {', '.join(sorted(known))})")
        cells = [c for c in cells if format_value(c.coords[axis]) in wanted]
    return cells


def load_grid(path: str | Path, overrides: list[str] | None = None,
              only: list[str] | None = None) -> Grid:
    """Read, expand and validate a grid file; UserError (one line) on any mistake."""
    path = Path(path)
    source = str(path)
    data = _read_layers(path)
    axes = data.pop("grid", None)
    if not isinstance(axes, dict) or not axes:
        raise UserError(f"{source}: no [grid] table of axes (dotted keys -> lists); a single "
                        "recipe runs with `perencode train`")
    slurm = _table(SlurmConfig, data.pop("slurm", {}), source, "slurm")
    sweep = _table(SweepConfig, data.pop("sweep", {}), source, "sweep")
    description = data.pop("description", "")
    for key, values in axes.items():
        _check_axis(key, values, source)
    if overrides:
        for item in overrides:
            key = item.partition("=")[0].strip()
            if key in axes:
                raise UserError(f"--set {item}: {key} is an axis of {source}; pick its values "
                                "with --only")
        data = apply_overrides(data, overrides)
    names = short_names(axes)
    cells = []
    for combo in itertools.product(*axes.values()):
        coords = dict(zip(axes, combo))
        name = "/".join(f"{names[k]}={format_value(v)}" for k, v in coords.items())
        cell_data = copy.deepcopy(data)
        for key, value in coords.items():
            _set(cell_data, key, value)
        # Stable and independent of the free-text description: editing that text must not
        # turn finished runs into "a different recipe".
        cell_data["description"] = f"{path.stem}: {name}"
        cells.append(Cell(name, coords, validate(cell_data, f"{source} [grid] {name}")))
    return Grid(path, path.stem, description, _select(cells, axes, only or [], source), slurm,
                sweep)


# --------------------------------------------------------------------------------------
# The state of each run
# --------------------------------------------------------------------------------------

def recipe_key(recipe: Recipe) -> str:
    """What makes two runs the same run: the recipe without its description."""
    data = recipe.to_dict()
    data.pop("description", None)
    return json.dumps(data, sort_keys=True)


def completed_runs(out: Path) -> dict[str, Path]:
    """recipe_key -> directory of every finished run under `out` (symlinks not followed)."""
    found: dict[str, Path] = {}
    if not out.is_dir():
        return found
    for folder, dirs, files in os.walk(out):
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # .submitit logs and pickles
        if "recipe.toml" not in files:
            continue
        dirs.clear()  # a run directory holds no other run
        run_dir = Path(folder)
        try:
            if runs.is_complete(run_dir):
                found.setdefault(recipe_key(runs.read_recipe(run_dir)), run_dir)
        except UserError:
            continue  # not a readable run: the sweep of its own grid reports it
    return found


def stability_done(run_dir: Path) -> bool:
    """stability.csv covers every checkpoint (the analysis resumes where it stopped)."""
    import pandas as pd

    path = run_dir / "stability.csv"
    if not path.exists():
        return False
    done = set(pd.read_csv(path, usecols=["iteration"])["iteration"].unique())
    return {k for k, _ in runs.list_checkpoints(run_dir)} <= done


@dataclass
class Run:
    cell: Cell
    dir: Path
    state: str                      # new, partial, done, reuse, conflict; then running, failed
    step: int = 0
    message: str = ""
    accuracy: float | None = None
    eta_s: float | None = None
    twin: Path | None = None         # a finished run of the same recipe elsewhere under OUT
    commands: list[list[str]] = field(default_factory=list)  # perencode commands, no --device
    proc: subprocess.Popen | None = None
    log: Any = None
    gpu: str | None = None

    @property
    def iterations(self) -> int:
        return self.cell.recipe.train.iterations


def _last_rows(run_dir: Path, n: int = 2) -> list[dict]:
    """The last `n` rows of metrics.jsonl, reading only the file's tail."""
    path = run_dir / "metrics.jsonl"
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except FileNotFoundError:
        return []
    rows = []
    for line in lines[-n - 1:]:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # the first line of the tail is usually cut
    return rows[-n:]


def _refresh(run: Run) -> None:
    """Step, training accuracy and ETA of a run from its metrics.jsonl."""
    rows = _last_rows(run.twin or run.dir)
    if not rows:
        return
    last = rows[-1]
    run.step, run.accuracy = int(last.get("step", 0)), last.get("accuracy")
    if len(rows) == 2 and last["seconds"] > rows[0]["seconds"]:
        rate = (last["step"] - rows[0]["step"]) / (last["seconds"] - rows[0]["seconds"])
        run.eta_s = (run.iterations - run.step) / rate if rate > 0 else None


def plan(grid: Grid, out: Path) -> list[Run]:
    """One Run per cell with its state and the commands still to run (nothing is written)."""
    finished = None
    planned = []
    for cell in grid.cells:
        run_dir = out / grid.name / cell.name
        run = Run(cell, run_dir, "new")
        planned.append(run)
        if (run_dir / "recipe.toml").exists():
            try:
                same = recipe_key(runs.read_recipe(run_dir)) == recipe_key(cell.recipe)
            except UserError as exc:
                same, run.message = False, str(exc)
            if not same:
                run.state = "conflict"
                run.message = run.message or (f"{run_dir}: holds a run of a different recipe; "
                                              "move it away or sweep into another --out")
                continue
            run.state = "done" if runs.is_complete(run_dir) else "partial"
        else:
            finished = completed_runs(out) if finished is None else finished
            run.twin = finished.get(recipe_key(cell.recipe))
            if run.twin is not None:
                run.state, run.message = "reuse", f"same recipe as {run.twin}"
        _refresh(run)
        if run.state in ("new", "partial"):
            run.commands.append(["train", str(run_dir / "recipe.toml"), "--out", str(run_dir)])
        if "stability" in grid.sweep.after and not (
                run.state in ("done", "reuse") and stability_done(run.twin or run_dir)):
            run.commands.append(["stability", str(run_dir)])
    return planned


# --------------------------------------------------------------------------------------
# Launching `perencode` subprocesses
# --------------------------------------------------------------------------------------

def launch(command: list[str], run_dir: Path, env: dict[str, str]) -> tuple[subprocess.Popen, Any]:
    """Start `python -m perencode COMMAND...`, appending its output to RUN_DIR/train.log."""
    argv = [sys.executable, "-m", "perencode", *command]
    log = open(run_dir / "train.log", "a", encoding="utf-8")  # noqa: SIM115 - closed by caller
    log.write(f"# {runs.now()} {' '.join(argv)}\n")
    log.flush()
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env), log


def thread_env(threads: int, gpu: str | None = None) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               PYTHONUNBUFFERED="1")
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def prepare(todo: list[Run]) -> list[Run]:
    """Claim each run directory (writes recipe.toml) or link it to its finished twin; the
    runs that still have commands to run."""
    ready = []
    for run in todo:
        try:
            if run.state == "reuse":
                run.dir.parent.mkdir(parents=True, exist_ok=True)
                run.dir.symlink_to(os.path.relpath(run.twin, run.dir.parent),
                                   target_is_directory=True)
            elif run.state != "done":  # a finished run may only lack its analyses
                runs.claim(run.dir, run.cell.recipe)
        except (UserError, OSError) as exc:
            run.state, run.message = "failed", str(exc)
            continue
        if run.commands:
            ready.append(run)
    return ready


class TrainJob(submitit.helpers.Checkpointable):
    """One run's commands as a SLURM job (submitit). On a time-out or preemption submitit
    calls `checkpoint`: the child `perencode train` gets SIGTERM, saves checkpoints/resume.pt
    and exits; the requeued job starts the commands again and training resumes."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def __call__(self, run_dir: str, commands: list[list[str]], device: str,
                 threads: int) -> str:
        for command in commands:
            if command[0] == "train" and runs.is_complete(run_dir):
                continue  # a requeued job whose training had finished
            self.proc, log = launch([*command, "--device", device], Path(run_dir),
                                    thread_env(threads))
            try:
                code = self.proc.wait()
            finally:
                log.close()
            if code != 0:
                raise RuntimeError(f"perencode {command[0]} exited with code {code}; log: "
                                   f"{Path(run_dir) / 'train.log'}")
        return run_dir

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait()
        # A fresh callable: the Popen of this attempt cannot be pickled.
        return submitit.helpers.DelayedSubmission(TrainJob(), *args, **kwargs)


# --------------------------------------------------------------------------------------
# The live board
# --------------------------------------------------------------------------------------

def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else \
        f"{seconds // 60}m{seconds % 60:02d}s"


STYLE = {"done": "green", "failed": "bold red", "conflict": "bold red", "running": "cyan",
         "reuse": "green"}
QUIET = ("done", "reuse", "new", "partial")  # left out of the live view of a big grid


class Board:
    """A live table on a terminal; plain log lines (state changes, a summary a minute)."""

    def __init__(self, title: str, all_runs: list[Run], enabled: bool):
        self.title, self.runs = title, all_runs
        self.live = Live(console=console, auto_refresh=False) \
            if enabled and console.is_terminal else None
        self.enabled = enabled
        self._seen = {id(r): r.state for r in all_runs}
        self._last_summary = time.monotonic()

    def table(self, every_run: bool = True) -> Table:
        """All runs, or (a live view of a big grid) those not yet finished or waiting."""
        shown = [r for r in self.runs if every_run or r.state not in QUIET]
        counts = Counter(r.state for r in self.runs)
        table = Table(title=self.title, caption=", ".join(f"{n} {state}" for state, n in
                                                          sorted(counts.items())))
        for col in ("run", "state", "step", "train acc", "ETA"):
            table.add_column(col, justify="left" if col in ("run", "state") else "right")
        for r in shown:
            state = r.state + (f" (gpu {r.gpu})" if r.gpu is not None and r.proc else "")
            acc = f"{r.accuracy:.3f}" if r.accuracy is not None else ""
            eta = _duration(r.eta_s) if r.state == "running" else ""
            table.add_row(r.cell.name, Text(state, style=STYLE.get(r.state, "")),
                          f"{r.step}/{r.iterations}", acc, eta)
        return table

    def __enter__(self) -> Board:
        if self.live is not None:
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()

    def update(self) -> None:
        if self.live is not None:
            fits = len(self.runs) + 8 <= console.height
            self.live.update(self.table(every_run=fits), refresh=True)
            return
        if not self.enabled:
            return
        for r in self.runs:
            if self._seen[id(r)] != r.state:
                self._seen[id(r)] = r.state
                note = f" - {r.message}" if r.message else ""
                print(f"[sweep] {r.cell.name}: {r.state}{note}", file=sys.stderr, flush=True)
        if time.monotonic() - self._last_summary > 60:
            self._last_summary = time.monotonic()
            for r in self.runs:
                if r.state == "running":
                    acc = f" acc {r.accuracy:.3f}" if r.accuracy is not None else ""
                    print(f"[sweep] {r.cell.name}: step {r.step}/{r.iterations}{acc} ETA "
                          f"{_duration(r.eta_s)}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Executors
# --------------------------------------------------------------------------------------

def visible_gpus(device: str) -> list[str]:
    """GPU ids to spread runs over: none for cpu or an explicit cuda:N."""
    if device not in ("auto", "cuda"):
        return []
    import torch

    if not torch.cuda.is_available():
        if device == "cuda":
            raise UserError("--device cuda: no CUDA device is available (use cpu or auto)")
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed:
        return [g.strip() for g in listed.split(",") if g.strip()]
    return [str(i) for i in range(torch.cuda.device_count())]


def run_local(ready: list[Run], board: Board, jobs: int, runs_per_gpu: int,
              device: str) -> bool:
    """Up to `jobs` runs at once as subprocesses, GPUs round-robin; False if interrupted."""
    gpus = visible_gpus(device)
    slots = min(jobs, len(gpus) * runs_per_gpu) if gpus else jobs
    threads = max(1, available_cores() // max(1, min(slots, len(ready))))
    queue, active = list(ready), []

    def start(run: Run) -> None:
        # With a GPU of its own (CUDA_VISIBLE_DEVICES) a run sees it as device 0.
        command = [*run.commands.pop(0), "--device", "cuda" if gpus else device]
        run.proc, run.log = launch(command, run.dir, thread_env(threads, run.gpu))
        run.state = "running"

    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        while queue or active:
            for run in list(active):
                code = run.proc.poll()
                _refresh(run)
                if code is None:
                    continue
                run.log.close()
                if code == 0 and run.commands:
                    start(run)
                    continue
                active.remove(run)
                run.proc, run.eta_s = None, None
                if code == 0:
                    run.state = "done"
                else:
                    run.state = "failed"
                    run.message = f"exit code {code}; log: {run.dir / 'train.log'}"
            while queue and len(active) < slots:
                run = queue.pop(0)
                if gpus:
                    load = Counter(r.gpu for r in active)
                    run.gpu = min(gpus, key=lambda g: load[g])
                start(run)
                active.append(run)
            board.update()
            time.sleep(0.5)
    except KeyboardInterrupt:
        for run in active:
            if run.proc.poll() is None:
                run.proc.send_signal(signal.SIGINT)  # train checkpoints and exits
        for run in active:
            run.proc.wait()
            run.log.close()
            run.state, run.message = "interrupted", "rerun the sweep to resume"
        board.update()
        return False
    finally:
        signal.signal(signal.SIGTERM, previous)
    return True


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def run_slurm(ready: list[Run], board: Board, grid: Grid, out: Path, options: SlurmConfig,
              device: str) -> bool:
    """One job per run, submitted as a job array through submitit; waits for them."""
    executor = submitit.AutoExecutor(folder=out / grid.name / ".submitit",
                                     cluster=options.cluster,
                                     slurm_max_num_timeout=options.max_requeues)
    params: dict[str, Any] = dict(name=f"perencode-{grid.name}", timeout_min=options.time_min,
                                  gpus_per_node=options.gpus_per_job,
                                  cpus_per_task=options.cpus_per_job,
                                  slurm_array_parallelism=options.array_parallelism)
    if options.partition:
        params["slurm_partition"] = options.partition
    if options.mem_gb:
        params["mem_gb"] = options.mem_gb
    executor.update_parameters(**params)
    submitted = executor.map_array(TrainJob(), [str(r.dir) for r in ready],
                                   [r.commands for r in ready], [device] * len(ready),
                                   [options.cpus_per_job] * len(ready))
    for run, job in zip(ready, submitted):
        run.state, run.message = "submitted", f"job {job.job_id}"
    poll = 1.0 if options.cluster != "slurm" else 30.0  # sacct is not to be hammered
    pending = list(zip(ready, submitted))
    try:
        while pending:
            waiting = []
            for run, job in pending:
                _refresh(run)
                if not job.done():
                    run.state = "running" if job.state == "RUNNING" else run.state
                    waiting.append((run, job))
                elif job.exception() is None:
                    run.state = "done"
                else:
                    last = str(job.exception()).strip().splitlines()[-1][:200]
                    run.state = "failed"
                    run.message = f"{last}; log: {run.dir / 'train.log'}, job log: " \
                                  f"{job.paths.stderr}"
            pending = waiting
            board.update()
            if pending:
                time.sleep(poll)
    except KeyboardInterrupt:
        ids = ", ".join(str(job.job_id) for _, job in pending)
        console.print(f"stopped watching; jobs {ids} go on. Rerun the sweep once they end to "
                      "see their results.")
        return False
    return True


# --------------------------------------------------------------------------------------
# Dry run
# --------------------------------------------------------------------------------------

COSTLESS_TRAIN_FIELDS = {"seed", "iterations", "checkpoint_every", "log_every", "eval_batch_size"}


def shape_key(recipe: Recipe) -> str:
    """What sets the cost of an iteration: the recipe less seed, length of training, logging."""
    data = recipe.to_dict()
    data.pop("description", None)
    data["train"] = {k: v for k, v in data["train"].items() if k not in COSTLESS_TRAIN_FIELDS}
    return json.dumps(data, sort_keys=True)


def estimate_cost(grid: Grid, planned: list[Run], device: str, jobs: int) -> None:
    """Print the run table and the compute cost from a 3-iteration bench of each shape."""
    import torch

    from perencode.bench import bench
    from perencode.train import resolve_device

    dev = resolve_device(device)
    threads = max(1, available_cores() // jobs) if dev.type == "cpu" else torch.get_num_threads()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    seconds: dict[str, float | str] = {}
    try:
        for run in planned:
            key = shape_key(run.cell.recipe)
            if key in seconds:
                continue
            console.print(f"bench {len(seconds) + 1}: {run.cell.name} on {dev}", highlight=False)
            try:
                seconds[key] = bench(run.cell.recipe, dev, iterations=3, warmup=1)[
                    "seconds_per_iteration"]
            except (UserError, NotImplementedError, OSError, RuntimeError) as exc:
                seconds[key] = str(exc).strip().splitlines()[0][:60] or type(exc).__name__
    finally:
        torch.set_num_threads(previous)

    table = Table(title=f"{grid.path}: {len(planned)} runs, device {dev}"
                  + (f", {threads} thread(s) a run" if dev.type == "cpu" else ""))
    for col in ("run", "state", "to run", "s/it", "device-h"):
        table.add_column(col, justify="left" if col in ("run", "state") else "right")
    total = remaining = 0.0
    unknown = 0
    for run in planned:
        s = seconds[shape_key(run.cell.recipe)]
        todo = 0 if run.state in ("done", "reuse") else run.iterations - run.step
        if isinstance(s, float):
            hours = run.iterations * s / 3600
            total += hours
            remaining += todo * s / 3600
            cost = f"{s:.4g}", _hours(hours)
        else:
            unknown += 1
            cost = "n/a", s
        table.add_row(run.cell.name, run.state, f"{todo}/{run.iterations}", *cost)
    console.print(table)
    for run in planned:
        if run.message:
            console.print(f"{run.cell.name}: {run.message}", highlight=False, soft_wrap=True)
    note = f"; {unknown} run(s) could not be benched" if unknown else ""
    console.print(f"estimated cost on {dev}: {_hours(total)} device-hours in all, "
                  f"{_hours(remaining)} still to run (about {_hours(remaining / jobs)} h "
                  f"wall-clock with --jobs {jobs}){note}. Analyses "
                  f"({', '.join(grid.sweep.after) or 'none'}) are not included.",
                  highlight=False)


def _hours(hours: float) -> str:
    return f"{hours:,.0f}" if hours >= 100 else f"{hours:.3g}"


# --------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------

def run_sweep(grid: str | Path, out: str | Path = "runs", executor: str = "local", jobs: int = 1,
              runs_per_gpu: int = 1, dry_run: bool = False, only: list[str] | None = None,
              overrides: list[str] | None = None, device: str = "auto",
              slurm: dict | None = None, progress: bool = True) -> int:
    """Run every cell of a grid; 0 when all runs finished, 1 if one failed, 130 if stopped."""
    if executor not in ("local", "slurm"):
        raise UserError(f"--executor '{executor}': expected local or slurm")
    g = load_grid(grid, overrides, only)
    out = Path(out)
    options = _table(SlurmConfig, {**g.slurm.model_dump(exclude_unset=True), **(slurm or {})},
                     "--slurm options", "slurm")
    if not g.cells:
        raise UserError(f"{grid}: --only leaves no cell to run")
    planned = plan(g, out)
    if dry_run:
        estimate_cost(g, planned, device, jobs)
        return 0
    title = f"{g.path} -> {out / g.name} ({executor})"
    with Board(title, planned, progress) as board:
        ready = prepare([r for r in planned if r.commands or r.state == "reuse"])
        board.update()
        if not ready:
            finished = True
        elif executor == "local":
            finished = run_local(ready, board, jobs, runs_per_gpu, device)
        else:
            finished = run_slurm(ready, board, g, out, options, device)
        board.update()
    if not (progress and console.is_terminal):
        console.print(board.table())
    bad = [r for r in planned if r.state not in ("done", "reuse")]
    for r in bad:
        console.print(f"[bold red]{r.state}:[/] {r.dir}: {r.message}", highlight=False,
                      soft_wrap=True)
    if not finished:
        return 130
    return 1 if bad else 0
