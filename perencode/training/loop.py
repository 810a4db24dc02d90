"""The training loop: one function, `train`, taking a recipe and a run directory (composition:
tasks differ by data, not by subclassing the loop), with what watches it: the stop signals
(`_Stop`, `Interrupted`), the health checks (`_check_health`, `Diverged`) and the held-out
scoring (`_evaluate`). `perencode train` (perencode.commands.train) is the command around it,
and the plugin API (perencode.api) exports it."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import traceback
from pathlib import Path

import torch
from torch import Tensor, nn

from perencode.common import defaults
from perencode.common.console import console
from perencode.common.device import (
    kernel_support,
    resolve_device,
    runs_sharing,
)
from perencode.common.errors import UserError
from perencode.common.files import WriteError
from perencode.common.processes import set_parent_death_signal
from perencode.common.progress import Reporter
from perencode.config.recipe import Recipe
from perencode.kinds.tasks import Batch, held_out_warning
from perencode.store import identity, runs
from perencode.store.lock import PARENT_ENV
from perencode.store.records import EVAL_IDENTITY, HELD_OUT, EvalRecord, MetricsRow, StatusRecord
from perencode.training import planning
from perencode.training.session import CHUNK_LOGITS, NotFinite, Session
from perencode.training.tensorboard import TensorBoardLog


def scored_outputs(batch: Batch) -> int:
    if batch.output_mask is not None:
        return int(batch.output_mask.sum())
    return batch.output_targets.numel()


def held_out_row(scores: dict) -> dict:
    """The numbers of an eval.json dict as metrics.jsonl columns: held_out_token_accuracy,
    held_out_dl_distance, ... (its identity fields and counts left out)."""
    return {HELD_OUT + key: value for key, value in scores.items()
            if isinstance(value, float) and key not in EVAL_IDENTITY}


# SIGUSR2 is SLURM's warning before a time limit (submitit's `--signal=USR2@...`): it
# reaches every process of the job, and by default it would kill training unsaved. SIGHUP
# is a dropped SSH session or a closed terminal: stopped with a checkpoint as on SIGTERM,
# unless the process was started ignoring it (`nohup`), which keeps it running.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2, signal.SIGHUP)


def _forget_parent_death_signal() -> None:
    """A sweep worker that is stopping: Linux sends the death signal the sweep asked for
    (PR_SET_PDEATHSIG) again whenever the process the worker was handed to ends too, and
    one arriving after the checkpoint would kill it before it says where it stopped."""
    set_parent_death_signal(0)


class _Stop:
    """SIGINT/SIGTERM/SIGUSR2/SIGHUP, or the death of the sweep that started this process,
    ask the loop to checkpoint and exit after the current iteration."""

    def __init__(self):
        self.signum: int | None = None
        self._old = {}
        parent = os.environ.get(PARENT_ENV, "")
        self._parent = int(parent) if parent.isdigit() else None

    def requested(self) -> bool:
        if self.signum is None and self._parent is not None and os.getppid() != self._parent:
            self.signum = signal.SIGTERM
        if self.signum is not None and self._parent is not None:
            _forget_parent_death_signal()
        return self.signum is not None

    def __enter__(self):
        for s in STOP_SIGNALS:
            if s == signal.SIGHUP and signal.getsignal(s) == signal.SIG_IGN:
                continue  # `nohup perencode train ...`: asked to outlive the terminal
            try:
                self._old[s] = signal.signal(s, self._handle)
            except ValueError:  # not the main thread: no handler, a kill loses < 1 interval
                pass
        return self

    def _handle(self, signum, frame):
        self.signum = signum
        if self._parent is not None:
            _forget_parent_death_signal()

    def __exit__(self, *exc):
        # A sweep's worker that stops is on its way out with its checkpoint: the sweep passes
        # on the stop signal its worker may have had already (a hang-up reaches both), and
        # that second signal must not cut the worker's closing line short.
        after_stop = self.signum is not None and self._parent is not None
        for s, old in self._old.items():
            signal.signal(s, signal.SIG_IGN if after_stop else old)


class Interrupted(Exception):
    """Training stopped by signal `signum` after `iteration`, checkpointed at `path`; the
    CLI exits 128 + signum (130 on Ctrl-C, 143 on SIGTERM), as a shell reports a signal."""

    def __init__(self, iteration: int, path: Path, signum: int = signal.SIGINT):
        super().__init__(f"interrupted at iteration {iteration}; checkpoint {path}")
        self.iteration, self.path, self.signum = iteration, path, int(signum)


class Diverged(Exception):
    """Training met a loss, gradient norm or weight that is not finite (`reason`) at
    `iteration` and stopped; status.json records it, the newest checkpoint (`checkpoint`,
    all of its weights finite, or None) is kept. The CLI exits runs.DIVERGED_EXIT."""

    def __init__(self, run_dir: Path, iteration: int, reason: str, checkpoint: Path | None):
        kept = (f"the last finite checkpoint is {checkpoint}" if checkpoint else
                "no checkpoint was written before it")
        super().__init__(f"{run_dir}: diverged at iteration {iteration}: {reason}; training "
                         f"stopped and {kept}. Change the recipe (optim.lr, "
                         "optim.weight_decay, optim.clip_norm) and train into a new --run-dir")
        self.iteration, self.reason, self.checkpoint = iteration, reason, checkpoint


def _check_health(run: runs.Run, pending: list[tuple[int, Tensor, Tensor | None]],
                  model: nn.Module | None = None, iteration: int = 0) -> None:
    """Raise Diverged (recorded in status.json) if a loss or gradient norm in `pending` (the
    steps since the last check), or with `model` one of its weights after `iteration`, is
    not finite; empties `pending`. Called where the loop synchronises anyway (a log step
    fetches the loss, a checkpoint copies the weights), so that a healthy step pays no
    device synchronisation of its own."""
    labels = [(k, what) for k, loss, norm in pending
              for what, value in (("loss", loss), ("gradient norm", norm)) if value is not None]
    values = [value.float() for _, loss, norm in pending for value in (loss, norm)
              if value is not None]
    pending.clear()
    if values:
        stacked = torch.stack(values)
        finite = torch.isfinite(stacked)
        if not bool(finite.all()):
            first = int((~finite).nonzero()[0, 0])
            k, what = labels[first]
            raise Diverged(run.dir, k, f"{what} is {float(stacked[first])}",
                           run.diverged(k, f"{what} is {float(stacked[first])}"))
    if model is not None:
        if not bool(torch.stack([torch.isfinite(p).all() for p in model.parameters()]).all()):
            reason = "a weight is not finite after the optimizer step"
            raise Diverged(run.dir, iteration, reason, run.diverged(iteration, reason))


def train(recipe: Recipe, run_dir: str | Path, device: str | torch.device = defaults.DEVICE,
          progress: bool = True, tensorboard: bool = False, force: bool = False,
          accept_code_change: bool = False, accept_data_change: bool = False) -> dict:
    """Train (or resume, or report complete) the run of `recipe` in `run_dir`.

    Returns the eval.json dict (that of the earlier training when the run was already
    complete: `runs.Run.is_complete` tells the two apart beforehand). A killed run resumes
    from its newest readable checkpoint and ends bit-identical on CPU to an uninterrupted
    one: model, optimizer, schedule position and the batch generator's state are all in
    the checkpoint. `tensorboard` also writes the log steps as TensorBoard event files.

    Before anything is written, a recipe that cannot fit in the device's memory is refused
    (perencode.training.planning; `force` skips that), and the task and model are built (a missing
    data file fails there): a run directory is claimed (recipe.toml) only by a recipe that
    passed every check that can fail before the first step, so fixing it and running again
    is never refused as "a different recipe". The run directory is locked from its claim
    to its eval.json (perencode.store.lock): a second `train` of it fails at once. An existing
    run's recipe.toml, data and code must be those it was made with (perencode.store.identity;
    `accept_code_change` accepts other code, `accept_data_change` other data content, and
    records it). A write the
    filesystem refuses (full disk, quota, read-only) ends it with a UserError naming the
    file and the newest complete checkpoint (by iteration).
    """
    run_dir = Path(run_dir)
    board = TensorBoardLog(run_dir, enabled=tensorboard)
    device = resolve_device(device) if isinstance(device, str) else device
    unsupported = kernel_support(device)
    if unsupported:
        console.print(f"[yellow]warning:[/] {unsupported}", highlight=False, soft_wrap=True)
    if not force and not runs.Run(run_dir).is_complete():
        planning.check_memory(recipe, device, CHUNK_LOGITS, runs_sharing())
    new_dir = not run_dir.exists()
    claimed = False
    try:
        with runs.Run.open(run_dir, "train", creating=True,
                           accept_code_change=accept_code_change,
                           accept_data_change=accept_data_change) as run:
            try:
                existed = run.check_claim(recipe)
                status = run.status() if existed else StatusRecord(state=runs.UNFINISHED)
                if status.state == runs.FINISHED:
                    if status.missing:  # never trained again: its model is its result
                        raise UserError(f"{run.dir}: finished at iteration "
                                        f"{status.iteration}, but its "
                                        f"{status.missing} is missing; not trained again: "
                                        f"{run.restore_hint()}")
                    runs.check_eval(run.dir, recipe, status)
                    return runs.read_eval(run.dir / "eval.json").result()
                if status.state == runs.DIVERGED:
                    kept = status.checkpoint
                    raise Diverged(run.dir, int(status.iteration or 0),
                                   status.reason or "not finite",
                                   run.dir / kept if kept else None)
                session = Session(recipe, device)
                note = held_out_warning(session.task, recipe.train.batch_size)
                if note:
                    console.print(f"[yellow]warning:[/] {note}", highlight=False)
                run.claim(recipe)
                claimed = True
                return _train(run, session, progress, existed, board)
            except WriteError as exc:
                raise WriteError(f"{exc}; {_kept(run)}") from None
    finally:
        if new_dir and not claimed:  # refused before its claim: leave no empty folder
            try:
                run_dir.rmdir()
            except OSError:
                pass


@contextlib.contextmanager
def _naming_plugins(run: runs.Run, session: Session):
    """An exception raised in a plugin's code while training becomes one line naming the
    plugin, the iteration and the checkpoint to resume from, not a traceback through
    perencode's loop; any other exception is left as it is (a bug of perencode's)."""
    try:
        yield
    except (UserError, Interrupted, Diverged):
        raise
    except Exception as exc:
        files = identity.plugin_files(run.recipe)
        frames = [os.path.realpath(frame.filename) for frame in traceback.extract_tb(
            exc.__traceback__)]
        culprit = next((files[f] for f in reversed(frames) if f in files), None)
        if culprit is None:
            raise
        text = str(exc).strip().splitlines()
        raise UserError(f"{run.dir}: plugin {culprit} raised {type(exc).__name__}"
                        f"{': ' + text[-1] if text else ''} at iteration "
                        f"{session.iteration + 1}; {_kept(run)} once the plugin is fixed") \
            from None


def _evaluate(run: runs.Run, session: Session) -> dict:
    """The session's held-out scores; logits or a metric that are not finite are a
    divergence at evaluation (Diverged, recorded in status.json): nothing is scored."""
    try:
        return session.evaluate()
    except NotFinite as exc:
        reason = f"{exc.what} at evaluation"
        raise Diverged(run.dir, exc.iteration, reason,
                       run.diverged(exc.iteration, reason)) from None


# A run's length is estimated after its first TIMED_STEPS iterations and every TIMED_SECONDS
# of training, from the rate so far, until one estimate is longer than LONG_SECONDS: that is
# said once (a first estimate may be short of it on a machine that gets busier).
TIMED_STEPS, TIMED_SECONDS, LONG_SECONDS = 20, 10.0, 3600.0


def _warn_if_long(run: runs.Run, device: torch.device, at: int, steps: int,
                  seconds: float) -> bool:
    """One line when the rest of the run will take more than an hour at the rate measured
    so far (a paper-size recipe on a CPU: thousands of hours, said at once, not found out)."""
    total = run.recipe.train.iterations
    left = total - at
    if steps <= 0 or seconds <= 0 or left <= 0:
        return False
    estimate = left * seconds / steps
    if estimate <= LONG_SECONDS:
        return False
    hours = estimate / 3600
    spelt = f"{hours:.1f} hours" if hours < 48 else f"{hours / 24:.0f} days"
    console.print(f"[yellow]warning:[/] {run.dir}: about {spelt} more on {device} at "
                  f"{steps / seconds:.3g} iterations/s ({left:,} of {total:,} iterations "
                  "left); Ctrl-C stops it with a checkpoint (the same command resumes), "
                  "--set train.iterations=N shortens it", highlight=False, soft_wrap=True)
    return True


def _kept(run: runs.Run) -> str:
    """What a run stopped by a refused write keeps, and how to go on."""
    last = run.newest_checkpoint()
    if last is None:
        return "no checkpoint yet: run the same command again to start over"
    return f"the last complete checkpoint is {last}: run the same command again to resume"


def _train(run: runs.Run, session: Session, progress: bool, existed: bool,
           board: TensorBoardLog) -> dict:
    """`train` inside the claimed, locked run directory, with the recipe's session."""
    recipe, tc, model = run.recipe, run.recipe.train, session.model
    run.start(session.device)
    found = run.resume(session.device) if existed else None
    if found is not None:
        session.load(*found)
    start = session.iteration
    if start:
        # On the terminal and in a sweep's train.log alike (its stdout goes there).
        console.print(f"{run.dir}: resuming from iteration {start} of {tc.iterations}",
                      highlight=False, soft_wrap=True)

    t0 = time.perf_counter()
    model.train()
    reporter = Reporter("train", tc.iterations, completed=start, log_every=tc.log_every,
                        enabled=progress)
    pending: list[tuple[int, Tensor, Tensor | None]] = []  # steps since the last health check
    scores = None  # the held-out scores of the last periodic evaluation (train.eval_every)
    timed, warned = t0, False  # when the run's length was last estimated (_warn_if_long)
    with reporter, _Stop() as stop, board.resumed_at(start, tc.batch_size, recipe.to_toml()), \
            _naming_plugins(run, session):
        for k in range(start + 1, tc.iterations + 1):
            log = k % tc.log_every == 0 or k == tc.iterations
            step = session.step(count_hits=log)
            loss, hits = step.loss, step.hits
            pending.append((k, loss.detach(), step.norm))
            shown = {}
            if log:
                assert hits is not None  # counted on the steps that log
                _check_health(run, pending)  # before the row: metrics.jsonl holds numbers only
                acc = int(hits) / max(scored_outputs(step.batch), 1)
                held_out = {}
                if tc.eval_every is not None and k % tc.eval_every == 0:
                    scores = _evaluate(run, session)
                    held_out = held_out_row(scores)
                # The gradient norm before clipping, already checked finite (None without
                # clipping: the step does not compute it then).
                norm = None if step.norm is None else float(step.norm)
                row = MetricsRow(step=k, loss=float(loss.detach()), accuracy=acc, lr=step.lr,
                                 grad_norm=norm, seconds=round(time.perf_counter() - t0, 3),
                                 **held_out)
                run.log(row)
                board.log(row)
                shown = {"loss": row.loss, "acc": acc}
            reporter.advance(1, **shown)
            now = time.perf_counter()
            if not warned and (k - start == TIMED_STEPS or now - timed >= TIMED_SECONDS):
                timed = now
                warned = _warn_if_long(run, session.device, k, k - start, now - t0)
            saved = None
            if k % tc.checkpoint_every == 0 or k == tc.iterations:
                _check_health(run, pending, model, k)  # every checkpoint kept is finite
                saved = run.save(session.state())
            if stop.requested() and k < tc.iterations:
                # Checked once: a signal arriving between two checks still finds a checkpoint.
                if saved is None:
                    _check_health(run, pending, model, k)
                    saved = run.save(session.state(), interrupted=True)
                raise Interrupted(k, saved, stop.signum)

    # The last step's periodic scores are the final ones: the same model, not scored twice.
    last_scored = tc.eval_every is not None and tc.iterations % tc.eval_every == 0
    with _naming_plugins(run, session):
        result = scores if last_scored and scores is not None else _evaluate(run, session)
    record = EvalRecord(**result, iteration=tc.iterations)
    run.finish(record)
    return record.result()
