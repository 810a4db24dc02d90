"""The SLURM executor: one job per run, a grid's runs submitted as one job array through
submitit. A sweep can submit and leave (`--no-wait`): the job ids are recorded in
OUT/<grid>/.submitit/jobs.json, and the next sweep of the grid collects them instead of
submitting again."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import submitit
from submitit.slurm.slurm import _convert_mem, _make_sbatch_string

from perencode.commands.sweep.board import Board
from perencode.commands.sweep.cells import PlannedRun, RunState, live_jobs, record_jobs, refresh
from perencode.commands.sweep.child import TrainJob
from perencode.commands.sweep.options import SweepOptions
from perencode.common.console import console
from perencode.common.errors import UserError
from perencode.config.grid import Grid, SlurmConfig
from perencode.store import runs
from perencode.training.planning import slurm_jobs


def parameters(name: str, options: SlurmConfig, dependency: list[str] | None = None
               ) -> dict[str, Any]:
    """The `[slurm]` options as submitit's AutoExecutor parameters (update_parameters)."""
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
    return params


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
    ex.update_parameters(**parameters(name, options, dependency))
    return ex


# AutoExecutor's generic names -> submitit's SlurmExecutor's (what _make_sbatch_string takes)
GENERIC = {"name": "job_name", "timeout_min": "time", "cpus_per_task": "cpus_per_task",
           "gpus_per_node": "gpus_per_node", "mem_gb": "mem"}


def job_python(options: SlurmConfig) -> str:
    """The command that starts Python in a job: `[slurm] python`, else this interpreter."""
    return options.python or shlex.quote(sys.executable)


def sbatch_script(folder: Path, name: str, options: SlurmConfig, count: int,
                  dependency: list[str] | None = None) -> str:
    """The sbatch file submitit writes for a job array of `count` runs with these options
    (its own renderer, so that the dry run shows what `submit` would hand to sbatch)."""
    params: dict[str, Any] = {}
    for key, value in parameters(name, options, dependency).items():
        if key in GENERIC:
            params[GENERIC[key]] = _convert_mem(value) if key == "mem_gb" else value
        else:
            params[key.removeprefix("slurm_")] = value
    params["additional_parameters"] = params.pop("additional_parameters", None)
    command = f"{job_python(options)} -u -m submitit.core._submit {shlex.quote(str(folder))}"
    return _make_sbatch_string(command=command, folder=folder, map_count=count, **params)


def partition_limits(run: Callable[[list[str]], str] | None = None
                     ) -> dict[str, int | None]:
    """Each partition's time limit in minutes (None: infinite) from `sinfo -h -o '%P %l'`,
    the default partition's also under '*' and its name under '*name'; {} where there is
    no sinfo or it fails. `run`: how to run sinfo (tests)."""
    if run is None:
        if shutil.which("sinfo") is None:
            return {}

        def run(args: list[str]) -> str:
            return subprocess.run(args, capture_output=True, text=True, timeout=20,
                                  check=True).stdout
    try:
        text = run(["sinfo", "-h", "-o", "%P %l"])
    except (OSError, subprocess.SubprocessError):
        return {}
    limits: dict[str, int | None] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        name, limit = parts
        minutes = slurm_minutes(limit)
        if name.endswith("*"):
            name = name[:-1]
            limits["*"], limits["*name"] = minutes, name  # type: ignore[assignment]
        limits[name] = minutes
    return limits


def slurm_minutes(text: str) -> int | None:
    """SLURM's time format in minutes: 'infinite' / 'UNLIMITED' -> None, 'D-HH:MM:SS',
    'HH:MM:SS', 'MM:SS', 'MM'; anything else -> None."""
    if text.lower() in ("infinite", "unlimited", "n/a"):
        return None
    days, _, rest = text.rpartition("-")
    try:
        fields = [int(f) for f in rest.split(":")]
        whole = int(days) if days else 0
    except ValueError:
        return None
    if len(fields) == 3:
        hours, minutes, seconds = fields
    elif len(fields) == 2:
        hours, (minutes, seconds) = 0, fields
        if days:  # D-HH:MM
            hours, minutes, seconds = fields[0], fields[1], 0
    elif len(fields) == 1:
        hours, minutes, seconds = (fields[0], 0, 0) if days else (0, fields[0], 0)
    else:
        return None
    return whole * 1440 + hours * 60 + minutes + (seconds > 0)


# Where sinfo cannot say: the limit most GPU partitions have (one day); above it, a job is
# refused ("Requested time limit is invalid") or pends forever on many clusters.
COMMON_LIMIT_MIN = 1440


def warnings_for(options: SlurmConfig, limits: dict[str, int | None]) -> list[str]:
    """One line per setting that may make the cluster refuse or misplace the array: no
    partition, no account, a time limit above the partition's (sinfo) or above a day."""
    if options.cluster != "slurm":
        return []
    lines = []
    if not options.partition:
        lines.append("warning: no partition: the jobs go to the cluster's default partition "
                     f"({_default(limits)}), often not a GPU one; --partition NAME")
    if not options.account:
        lines.append("warning: no account: a cluster that charges an account refuses the "
                     "array or charges your default; --slurm 'account=\"NAME\"' if yours does")
    key = options.partition or "*"
    if key in limits:
        limit = limits[key]
        if limit is not None and options.time_min > limit:
            lines.append(f"warning: time limit {options.time_min:,} min is above partition "
                         f"{options.partition or 'default'}'s {limit:,} min (sinfo): sbatch "
                         f"refuses it; --time-min {limit}")
    elif options.time_min > COMMON_LIMIT_MIN:
        lines.append(f"warning: time limit {options.time_min:,} min is above a day, the most "
                     "many GPU partitions allow (sinfo -o '%P %l' shows yours); a run that "
                     "needs longer is requeued from its checkpoint, so --time-min "
                     f"{COMMON_LIMIT_MIN} loses nothing")
    else:
        lines.append(f"time limit {options.time_min:,} min a job: no sinfo here to check it "
                     "against the partition's (sinfo -o '%P %l' on the login node)")
    return lines


def _default(limits: dict) -> str:
    return str(limits["*name"]) if "*name" in limits else "unknown here: no sinfo"


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

    def submission(self, planned: list[PlannedRun],
                   limits: dict[str, int | None] | None = None) -> list[str]:
        """`--dry-run`: what `run` would submit: one line per setting the cluster may refuse,
        the sbatch file of the array (submitit's own rendering), and the command each job
        runs. Nothing about this machine: the jobs run elsewhere."""
        todo = [r for r in planned if r.commands and r.state != RunState.REUSE]
        if not todo:
            return ["slurm: nothing to submit (every run finished, linked or in the queue)"]
        limits = partition_limits() if limits is None else limits
        twins = sorted({r.twin_job for r in todo if r.twin_job})
        folder = self.out / self.grid.name / ".submitit"
        first = todo[0]
        command = [*first.commands[0], "--device", self.device]
        inside = (f"inside `{self.options.python}`" if self.options.python else
                  f"with this machine's Python ({sys.executable}): on the cluster it must "
                  "exist on the compute nodes, or set --slurm 'python=\"apptainer exec --nv "
                  "perencode.sif python\"'")
        lines = warnings_for(self.options, limits)
        lines.append(f"slurm: sbatch would get this file for the array of {len(todo)} run(s) "
                     f"of {self.grid.name} (submitit {submitit.__version__}; the job ids and "
                     f"%A/%a are filled in by SLURM):")
        lines += ["  " + line for line in sbatch_script(
            folder, self.grid.name, self.options, len(todo), twins or None).splitlines()
            if line.strip()]
        if twins:
            lines.append(f"  (after the jobs still running of the runs it links: "
                         f"{', '.join(twins)}; those ended by the submit are left out)")
        then = ", ".join(f"perencode {c[0]}" for c in first.commands[1:])
        lines.append(f"each job runs, {inside}: perencode {shlex.join(command)}"
                     + (f" and then {then}" if then else "")
                     + f" (task 0; the others their own run directory under "
                     f"{self.out / self.grid.name})")
        return lines

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
