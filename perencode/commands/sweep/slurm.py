"""The SLURM executor: one job per run, a grid's runs submitted as one job array through
submitit. A sweep can submit and leave (`--no-wait`): the job ids are recorded in
OUT/<grid>/.submitit/jobs.json, and the next sweep of the grid collects them instead of
submitting again."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import submitit

from perencode.analysis.cost import slurm_jobs
from perencode.commands.sweep.board import Board
from perencode.commands.sweep.local import launch, thread_env
from perencode.commands.sweep.options import SweepOptions
from perencode.commands.sweep.plan import PlannedRun, RunState, live_jobs, record_jobs, refresh
from perencode.common.console import console
from perencode.common.errors import UserError
from perencode.config.grid import Grid, SlurmConfig
from perencode.store import runs


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
            if command[0] == "train" and runs.Run(run_dir).is_complete():
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


def executor(folder: Path, name: str, options: SlurmConfig,
             dependency: list[str] | None = None) -> submitit.AutoExecutor:
    """A submitit executor with the `[slurm]` options; `dependency`: job ids to wait for."""
    init: dict[str, Any] = {"slurm_max_num_timeout": options.max_requeues}
    if options.python:
        init["slurm_python"] = options.python  # e.g. the container's python (issue 20)
    try:
        ex = submitit.AutoExecutor(folder=folder, cluster=options.cluster, **init)
    except RuntimeError as exc:  # submitit finds no srun
        raise UserError(f"--executor slurm: no SLURM here ({exc}); run the sweep on the "
                        "cluster's login node, or [slurm] cluster = \"local\" to try the path "
                        "on this machine") from None
    params: dict[str, Any] = dict(name=f"perencode-{name}", timeout_min=options.time_min,
                                  cpus_per_task=options.cpus_per_job,
                                  slurm_array_parallelism=options.array_parallelism)
    if options.gpus_per_job:  # --gpus-per-node=0 is refused where no GPU GRES is set up
        params["gpus_per_node"] = options.gpus_per_job
    if options.mem_gb:
        params["mem_gb"] = options.mem_gb
    if options.cluster == "slurm":
        params["slurm_signal_delay_s"] = options.signal_delay_s
        # Requeuing a job that checkpointed is refused where the cluster has JobRequeue=0.
        params["slurm_additional_parameters"] = {"requeue": True, **options.additional}
        for key in ("partition", "account", "qos", "constraint", "exclude"):
            if getattr(options, key):
                params[f"slurm_{key}"] = getattr(options, key)
        if options.setup:
            params["slurm_setup"] = list(options.setup)
        if dependency:
            params["slurm_dependency"] = "afterany:" + ":".join(dependency)
    ex.update_parameters(**params)
    return ex


def submit(ready: list[PlannedRun], grid: Grid, out: Path, options: SlurmConfig, device: str,
           dependency: list[str], handed: list[str] | None = None) -> list:
    """Submit the runs as one job array, handing each the plugins `handed`; records their
    job ids. Returns submitit's jobs."""
    ex = executor(out / grid.name / ".submitit", grid.name, options, dependency)
    jobs = ex.map_array(TrainJob(), [str(r.dir) for r in ready], [r.commands for r in ready],
                        [device] * len(ready), [options.cpus_per_job] * len(ready),
                        [list(handed or [])] * len(ready))
    for run, job in zip(ready, jobs):
        run.state, run.job, run.message = RunState.SUBMITTED, str(job.job_id), \
            f"job {job.job_id}"
    if options.cluster == "slurm":
        record_jobs(out, grid.name, {r.cell.name: str(j.job_id) for r, j in zip(ready, jobs)})
    return jobs


def wait(pairs: list[tuple[PlannedRun, Any]], board: Board, options: SlurmConfig) -> bool:
    """Watch (run, submitit job) pairs until every job ended; False if interrupted."""
    poll = 1.0 if options.cluster != "slurm" else options.poll_s  # sacct: not to be hammered
    pending = list(pairs)
    try:
        while pending:
            waiting = []
            for run, job in pending:
                refresh(run)
                if not job.done():
                    if job.state == "RUNNING":
                        run.state = RunState.RUNNING
                    waiting.append((run, job))
                elif job.exception() is None:
                    run.state = RunState.DONE
                else:
                    last = str(job.exception()).strip().splitlines()[-1][:200]
                    diverged = runs.Run(run.dir).status().state == runs.DIVERGED
                    run.state = RunState.DIVERGED if diverged else RunState.FAILED
                    run.message = f"{last}; log: {run.dir / 'train.log'}, job log: " \
                                  f"{job.paths.stderr}"
            pending = waiting
            board.update()
            if pending:
                time.sleep(poll)
    except KeyboardInterrupt:
        ids = ", ".join(str(job.job_id) for _, job in pending)
        console.print(f"stopped watching; jobs {ids} go on. Rerun the sweep to collect them.")
        return False
    return True


def reattach(run: PlannedRun, out: Path, grid: Grid) -> submitit.SlurmJob:
    """The submitit job of a run submitted by an earlier sweep."""
    assert run.job is not None, run.dir  # a queued or running run was marked by its job
    return submitit.SlurmJob(folder=out / grid.name / ".submitit", job_id=run.job)


class SlurmExecutor:
    """`--executor slurm`: the runs as a job array (submit), followed until they ended
    (wait) unless the sweep leaves them (--no-wait)."""

    name = "slurm"

    def __init__(self, options: SweepOptions, grid: Grid, out: Path, slurm: SlurmConfig) -> None:
        self.grid, self.out, self.options = grid, out, slurm
        self.device, self.wait = options.device, options.wait
        self.detaches = slurm.cluster == "slurm"  # submitit's local cluster ends with us
        self.claims_at_start = False  # a job array starts its runs later, elsewhere

    def timing(self, hours: list[float]) -> str:
        jobs = slurm_jobs(hours, self.options)
        return (f"slurm: {jobs['jobs']} job(s) in one array (one run each, at most "
                f"{self.options.array_parallelism} at once), {jobs['gpus_per_job']} GPU(s) and "
                f"{jobs['time_limit_min']} min a job; {jobs['over_limit']} run(s) exceed the "
                f"limit and rely on requeue ({jobs['requeues']} requeue(s) expected, at most "
                f"{jobs['most_requeues']} for one run; max_requeues {jobs['max_requeues']}); "
                f"about {jobs['wall_hours']:,.3g} h wall-clock")

    def run(self, ready: list[PlannedRun], planned: list[PlannedRun], board: Board,
            handed: list[str]) -> bool:
        """Submit what is ready (after the twins' jobs, where a cell is another grid's run
        still training), then wait for those and for the jobs of earlier sweeps."""
        pairs = []
        if ready:
            dependency = sorted({r.twin_job for r in ready if r.twin_job})
            if dependency:
                live = live_jobs(dependency) if self.options.cluster == "slurm" else {}
                dependency = [j for j in dependency if j in live]
            jobs = submit(ready, self.grid, self.out, self.options, self.device, dependency,
                          handed)
            pairs += list(zip(ready, jobs))
        if not self.wait:
            return True
        pairs += [(r, reattach(r, self.out, self.grid)) for r in planned
                  if r.state in (RunState.QUEUED, RunState.RUNNING)]
        return wait(pairs, board, self.options)

    def stopped(self, planned: list[PlannedRun]) -> str | None:
        return None  # the jobs go on: wait() said so
