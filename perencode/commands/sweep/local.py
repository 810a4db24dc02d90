"""The local executor: up to --jobs runs at once as `perencode` subprocesses.

The workers die with the sweep: on Linux the kernel sends each one SIGTERM when the sweep
ends however it ends (PR_SET_PDEATHSIG), elsewhere each worker notices at its next iteration
that its parent is gone (perencode.store.lock.PARENT_ENV); either way it checkpoints and exits as
on SIGTERM. A run still locked by a live worker of an earlier sweep (killed in the instant
before its workers stop) is waited for, counted against --jobs, and then resumed.
"""

from __future__ import annotations

import math
import signal
import time
from collections import Counter
from pathlib import Path

from perencode.commands.sweep.board import Board, interrupted_line
from perencode.commands.sweep.cells import (
    PlannedRun,
    RunState,
    claim,
    claim_at_start,
    refresh,
    refresh_stopped,
    twin_busy,
)
from perencode.commands.sweep.child import launch, thread_env
from perencode.commands.sweep.options import SweepOptions
from perencode.common.device import RUNS_SHARING_ENV, visible_gpus
from perencode.common.host import available_cores
from perencode.config.grid import Grid, SlurmConfig
from perencode.store import runs
from perencode.store.lock import describe, live_holder
from perencode.training.planning import local_wall_hours


def raise_interrupt(signum, frame):
    raise KeyboardInterrupt


class LocalExecutor:
    """`--executor local`: the runs as subprocesses of the sweep (run_local)."""

    name = "local"
    detaches = False  # the workers die with the sweep
    claims_at_start = True  # a sweep stopped early leaves the cells it never started free

    def __init__(self, options: SweepOptions, grid: Grid, out: Path, slurm: SlurmConfig) -> None:
        self.jobs, self.runs_per_gpu, self.device = options.jobs, options.runs_per_gpu, \
            options.device
        self.out = out

    def run(self, ready: list[PlannedRun], planned: list[PlannedRun], board: Board,
            handed: list[str]) -> bool:
        if not ready:
            return True
        return run_local(ready, board, self.jobs, self.runs_per_gpu, self.device, handed,
                         self.out)

    def timing(self, hours: list[float]) -> str:
        gpus = max(1, math.ceil(self.jobs / self.runs_per_gpu))
        wall = local_wall_hours(hours, gpus, self.runs_per_gpu)
        return (f"local: {self.jobs} run(s) at once, {self.runs_per_gpu} a GPU: about "
                f"{wall:,.3g} h wall-clock on {gpus} GPU(s) (runs sharing a GPU share its "
                "throughput)")

    def submission(self, planned: list[PlannedRun]) -> list[str]:
        return []  # the runs start here: nothing is handed to a scheduler

    def stopped(self, planned: list[PlannedRun]) -> str | None:
        return interrupted_line(planned)


def run_local(ready: list[PlannedRun], board: Board, jobs: int, runs_per_gpu: int,
              device: str, handed: list[str] | None = None, out: Path | None = None) -> bool:
    """Up to `jobs` runs at once as subprocesses, GPUs round-robin, each handed the plugins
    `handed`; False if interrupted. With `out` (the runs root), a cell is matched against
    the runs other sweeps claimed there since the plan as it starts (`claim_at_start`)."""
    gpus = visible_gpus(device)
    slots = min(jobs, len(gpus) * runs_per_gpu) if gpus else jobs
    threads = max(1, available_cores() // max(1, min(slots, len(ready))))
    queue, active = list(ready), list[PlannedRun]()

    def start(run: PlannedRun, sharing: int = 1) -> bool:
        """Launch the run's next command (claiming its directory first); False when the
        claim is refused (the run FAILED)."""
        holder = live_holder(run.dir)
        if holder is not None:  # a worker of an earlier sweep: wait for it in its slot
            run.proc, run.state = None, RunState.RUNNING
            run.message = (f"still held by {describe(holder)}, a worker of an earlier "
                           f"sweep; waiting for it")
            return True
        if not (claim(run) if out is None else claim_at_start(run, out)):
            return False
        busy = None if out is None else twin_busy(run, out)
        if busy is not None:  # linked to a run another sweep trains: wait for it in its slot
            run.proc, run.state = None, RunState.RUNNING
            run.message = f"same recipe as {run.twin}, which {busy} trains; waiting for it"
            return True
        # With a GPU of its own (CUDA_VISIBLE_DEVICES) a run sees it as device 0.
        command = [*run.commands.pop(0), "--device", "cuda" if gpus else device]
        env = thread_env(threads, run.gpu, handed)
        env[RUNS_SHARING_ENV] = str(sharing)
        run.proc, run.log = launch(command, run.dir, env)
        run.state, run.message = RunState.RUNNING, ""
        return True

    # SIGTERM and SIGHUP (a dropped SSH session) stop the sweep as Ctrl-C does; under
    # `nohup` SIGHUP stays ignored, and so it does in the workers, which inherit that.
    stops = [signal.SIGTERM] + ([signal.SIGHUP] if signal.getsignal(signal.SIGHUP)
                                != signal.SIG_IGN else [])
    previous = {s: signal.signal(s, raise_interrupt) for s in stops}
    try:
        while queue or active:
            for run in list(active):
                if run.proc is None:  # waiting for an earlier sweep's worker, or another
                    refresh(run)      # sweep's run of the same recipe
                    if live_holder(run.dir) is None and not start(run):
                        active.remove(run)
                    continue
                code = run.proc.poll()
                refresh(run)
                if code is None:
                    continue
                run.log.close()
                if code == 0 and run.commands:
                    if not start(run):
                        active.remove(run)
                    continue
                active.remove(run)
                run.proc, run.eta_s = None, None
                if code == 0:
                    run.state = RunState.DONE
                elif code == runs.DIVERGED_EXIT:
                    run.state = RunState.DIVERGED
                    run.message = f"a loss or weight was not finite (log: " \
                                  f"{run.dir / 'train.log'})"
                elif code in (128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP):
                    # Stopped from outside with a checkpoint (train's exit on a stop signal).
                    run.state = RunState.INTERRUPTED
                    refresh_stopped(run)
                    run.message = f"stopped by a signal; rerun the sweep to resume (log: " \
                                  f"{run.dir / 'train.log'})"
                else:
                    run.state = RunState.FAILED
                    run.message = f"exit code {code}; log: {run.dir / 'train.log'}"
            while queue and len(active) < slots:
                run = queue.pop(0)
                sharing = 1
                if gpus:
                    load = Counter(r.gpu for r in active)
                    run.gpu = min(gpus, key=lambda g: load[g])
                    # The first run on a GPU checks its memory for all the runs that will
                    # share it (perencode.training.planning); the next ones see its memory taken.
                    if load[run.gpu] == 0:
                        sharing = min(runs_per_gpu, len(queue) + 1, -(-slots // len(gpus)))
                if start(run, sharing):
                    active.append(run)
            board.update()
            time.sleep(0.5)
    except KeyboardInterrupt:
        mine = [run for run in active if run.proc is not None]
        for run in mine:
            if run.proc.poll() is None:
                run.proc.send_signal(signal.SIGINT)  # train checkpoints and exits
        for run in mine:
            code = run.proc.wait()
            run.log.close()
            run.eta_s = None
            if code == 0 and not run.commands:  # it finished as the signal came
                refresh(run)
                run.state, run.message = RunState.DONE, ""
            else:
                refresh_stopped(run)
                run.state, run.message = RunState.INTERRUPTED, "rerun the sweep to resume"
        for run in active:
            if run.proc is None:  # an earlier sweep's worker held it: this one never began
                run.state, run.message = RunState.PARTIAL, ""
        board.update()
        return False
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return True
