"""The local executor: up to --jobs runs at once as `perencode` subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from perencode import plugins, runs
from perencode.device import available_cores, visible_gpus
from perencode.sweep.board import Board
from perencode.sweep.plan import Run, RunState, refresh


def perencode_command() -> list[str]:
    """How children run the perencode this process runs: the console script beside the
    interpreter, else `python -m perencode`. The script puts its own folder first on
    sys.path, where `-m` puts the working directory: a checkout there (a container started
    with it mounted at /work) would otherwise run instead of the installed package."""
    script = Path(sys.executable).with_name("perencode")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "perencode"]


def launch(command: list[str], run_dir: Path, env: dict[str, str]) -> tuple[subprocess.Popen, Any]:
    """Start `perencode COMMAND...`, appending its output to RUN_DIR/train.log."""
    argv = [*perencode_command(), *command]
    log = open(run_dir / "train.log", "a", encoding="utf-8")  # noqa: SIM115 - closed by caller
    log.write(f"# {runs.now()} {' '.join(argv)}\n")
    log.flush()
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env), log


def thread_env(threads: int, gpu: str | None = None,
               handed: list[str] | None = None) -> dict[str, str]:
    """A child's environment: its threads, its GPU, and the plugins it is handed
    (PERENCODE_PLUGINS, perencode.plugins.handed_on)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               PYTHONUNBUFFERED="1", **plugins.environment(handed or []))
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def run_local(ready: list[Run], board: Board, jobs: int, runs_per_gpu: int,
              device: str, handed: list[str] | None = None) -> bool:
    """Up to `jobs` runs at once as subprocesses, GPUs round-robin, each handed the plugins
    `handed`; False if interrupted."""
    gpus = visible_gpus(device)
    slots = min(jobs, len(gpus) * runs_per_gpu) if gpus else jobs
    threads = max(1, available_cores() // max(1, min(slots, len(ready))))
    queue, active = list(ready), []

    def start(run: Run) -> None:
        # With a GPU of its own (CUDA_VISIBLE_DEVICES) a run sees it as device 0.
        command = [*run.commands.pop(0), "--device", "cuda" if gpus else device]
        run.proc, run.log = launch(command, run.dir, thread_env(threads, run.gpu, handed))
        run.state = RunState.RUNNING

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        while queue or active:
            for run in list(active):
                code = run.proc.poll()
                refresh(run)
                if code is None:
                    continue
                run.log.close()
                if code == 0 and run.commands:
                    start(run)
                    continue
                active.remove(run)
                run.proc, run.eta_s = None, None
                if code == 0:
                    run.state = RunState.DONE
                else:
                    run.state = RunState.FAILED
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
            run.state, run.message = RunState.INTERRUPTED, "rerun the sweep to resume"
        board.update()
        return False
    finally:
        signal.signal(signal.SIGTERM, previous)
    return True
