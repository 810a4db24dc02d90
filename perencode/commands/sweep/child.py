"""A run's `perencode` command as a child process, for both executors, and the SLURM job
that starts it (TrainJob).

Light on purpose: a SLURM job unpickles its TrainJob, and so imports this module, before it
starts its run's `perencode` command, which loads torch itself; the job's own process loads
no torch, pandas or matplotlib (tests/test_layout.py holds this module to it), a few seconds
of CPU less for every run of a grid. The local executor's workers die with the sweep: on
Linux the kernel sends each one SIGTERM when its parent ends (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import submitit

from perencode.common.errors import UserError
from perencode.common.processes import perencode_command, set_parent_death_signal
from perencode.config import plugins
from perencode.store.lock import PARENT_ENV
from perencode.store.records import FINISHED, now, read_status


def _die_with(parent: int):
    """A preexec_fn for Popen that makes the child receive SIGTERM when `parent` dies
    (Linux; None elsewhere, where the worker polls its parent instead)."""
    if not sys.platform.startswith("linux"):
        return None

    def preexec() -> None:
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != parent:  # the sweep died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)
    return preexec


def launch(command: list[str], run_dir: Path, env: dict[str, str]) -> tuple[subprocess.Popen, Any]:
    """Start `perencode COMMAND...`, appending its output to RUN_DIR/train.log; the child
    stops (checkpointed) when this process dies."""
    argv = [*perencode_command(), *command]
    log = open(run_dir / "train.log", "a", encoding="utf-8")  # noqa: SIM115 - closed by caller
    log.write(f"# {now()} {' '.join(argv)}\n")
    log.flush()
    me = os.getpid()
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                            env={**env, PARENT_ENV: str(me)}, preexec_fn=_die_with(me)), log


def thread_env(threads: int, gpu: str | None = None,
               handed: list[str] | None = None) -> dict[str, str]:
    """A child's environment: its threads, its GPU, and the plugins it is handed
    (PERENCODE_PLUGINS, perencode.config.plugins.handed_on)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               PYTHONUNBUFFERED="1", **plugins.environment(handed or []))
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def recorded_finished(run_dir: str | Path) -> bool:
    """The run's status.json says it finished. (Any other state, or a status.json missing
    or unreadable, is `perencode train`'s to judge: it trains an unfinished run on and leaves
    a finished one as it is.)"""
    try:
        return read_status(Path(run_dir) / "status.json").state == FINISHED
    except (OSError, UserError):
        return False


class TrainJob(submitit.helpers.Checkpointable):
    """One run's commands as a SLURM job (submitit). On a time-out or preemption submitit
    calls `checkpoint`: the child `perencode train` gets SIGTERM, saves checkpoints/resume.pt
    and exits; the requeued job starts the commands again and training resumes."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def __call__(self, run_dir: str, commands: list[list[str]], device: str,
                 threads: int, handed: list[str] | None = None) -> str:
        # `handed`: the sweep's plugins, given to each command (not left to the job's
        # inherited environment, which a cluster may not pass on: sbatch --export=NONE).
        for command in commands:
            if command[0] == "train" and recorded_finished(run_dir):
                continue  # a requeued job whose training had finished
            self.proc, log = launch([*command, "--device", device], Path(run_dir),
                                    thread_env(threads, None, handed))
            try:
                code = self._wait(self.proc)
            finally:
                log.close()
            if code != 0:
                raise RuntimeError(f"perencode {command[0]} exited with code {code}; log: "
                                   f"{Path(run_dir) / 'train.log'}")
        return run_dir

    @staticmethod
    def _wait(proc: subprocess.Popen) -> int:
        # Polling, not Popen.wait(): SLURM's signal runs `checkpoint` in this thread, inside
        # this loop, and a Popen.wait() interrupted there would still hold the Popen's lock
        # that `checkpoint` needs (a deadlock a real scheduler exposed).
        while (code := proc.poll()) is None:
            time.sleep(0.2)
        return code

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self._wait(self.proc)
        # A fresh callable: the Popen of this attempt cannot be pickled.
        return submitit.helpers.DelayedSubmission(TrainJob(), *args, **kwargs)
