"""The sweep that trains a grid's runs (`perencode sweep`): plan, executors, live board.

Grid files and their cells are `perencode.grid`. Every cell runs in
`OUT/<grid file stem>/<axis>=<value>/...`, so the same grid always maps to the same
directories: finished runs are skipped, interrupted ones resume (`perencode train` does
both), and a cell whose exact recipe already finished in another grid under OUT is linked
to that run instead of trained twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import submitit
from rich.live import Live
from rich.table import Table
from rich.text import Text

from perencode import runs
from perencode.bench import estimate_cost
from perencode.console import console
from perencode.device import available_cores, visible_gpus
from perencode.errors import UserError
from perencode.grid import Cell, Grid, SlurmConfig, load_grid
from perencode.recipe import run_key, validate_table

# --------------------------------------------------------------------------------------
# The state of each run
# --------------------------------------------------------------------------------------

def completed_runs(out: Path) -> dict[str, Path]:
    """run_key -> directory of every finished run under `out`."""
    found: dict[str, Path] = {}
    if not out.is_dir():
        return found
    for run_dir in runs.find_runs([out]):
        try:
            if runs.is_complete(run_dir):
                found.setdefault(run_key(runs.read_recipe(run_dir)), run_dir.resolve())
        except UserError:
            continue  # not a readable run: the sweep of its own grid reports it
    return found


def stability_done(run_dir: Path) -> bool:
    """stability.csv covers every checkpoint (the analysis resumes where it stopped)."""
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
                same = run_key(runs.read_recipe(run_dir)) == run_key(cell.recipe)
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
            run.twin = finished.get(run_key(cell.recipe))
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
                code = self._wait()
            finally:
                log.close()
            if code != 0:
                raise RuntimeError(f"perencode {command[0]} exited with code {code}; log: "
                                   f"{Path(run_dir) / 'train.log'}")
        return run_dir

    def _wait(self) -> int:
        # Polling, not Popen.wait(): SLURM's signal runs `checkpoint` in this thread, inside
        # this loop, and a Popen.wait() interrupted there would still hold the Popen's lock
        # that `checkpoint` needs (a deadlock a real scheduler exposed).
        while (code := self.proc.poll()) is None:
            time.sleep(0.2)
        return code

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self._wait()
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
                                  cpus_per_task=options.cpus_per_job,
                                  slurm_array_parallelism=options.array_parallelism)
    if options.gpus_per_job:  # --gpus-per-node=0 is refused where no GPU GRES is set up
        params["gpus_per_node"] = options.gpus_per_job
    if options.cluster == "slurm":
        params["slurm_signal_delay_s"] = options.signal_delay_s
        # Requeuing a job that checkpointed is refused where the cluster has JobRequeue=0.
        params["slurm_additional_parameters"] = {"requeue": True}
    if options.partition:
        params["slurm_partition"] = options.partition
    if options.account:
        params["slurm_account"] = options.account
    if options.mem_gb:
        params["mem_gb"] = options.mem_gb
    executor.update_parameters(**params)
    submitted = executor.map_array(TrainJob(), [str(r.dir) for r in ready],
                                   [r.commands for r in ready], [device] * len(ready),
                                   [options.cpus_per_job] * len(ready))
    for run, job in zip(ready, submitted):
        run.state, run.message = "submitted", f"job {job.job_id}"
    poll = 1.0 if options.cluster != "slurm" else options.poll_s  # sacct: not to be hammered
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
    options = validate_table(SlurmConfig, {**g.slurm.model_dump(exclude_unset=True),
                                           **(slurm or {})}, "--slurm options", "slurm")
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
