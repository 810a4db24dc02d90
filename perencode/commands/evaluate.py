"""Score a trained model on its task's held-out data and write eval.json."""

from __future__ import annotations

from pathlib import Path

from perencode.common import defaults
from perencode.common.console import console
from perencode.common.device import resolve_device
from perencode.common.errors import UserError
from perencode.store import checkpoints, runs
from perencode.store.records import EvalRecord
from perencode.training.session import NotFinite, Session


def _say_what_is_scored(run: runs.Run) -> None:
    """On an unfinished run, one line: where it stands and which checkpoint is scored (the
    newest periodic one; an interrupt's resume.pt only when asked for)."""
    steps = run.checkpoints()
    total = run.recipe.train.iterations
    if not steps or steps[-1][0] == total:
        return
    newest = steps[-1][0]
    resumed = None
    if run.resume_path.exists():
        try:
            resumed = checkpoints.load(run.resume_path)["iteration"]
        except UserError:
            resumed = None  # unreadable: `train` sets it aside; nothing to offer here
    at = max(newest, resumed or 0)
    line = (f"{run.dir}: unfinished run at iteration {at} of {total}; scoring "
            f"{steps[-1][1].name} (iteration {newest})")
    if resumed is not None and resumed > newest:
        line += (f"; the newer {run.resume_path.name} (iteration {resumed}, saved when "
                 f"training was stopped) is scored only with --checkpoint {run.resume_path}")
    console.print(f"[yellow]note:[/] {line}", highlight=False, soft_wrap=True)


def session_source(run: runs.Run, checkpoint: str | Path | None) -> str:
    """The checkpoint scored, by name."""
    if checkpoint is not None:
        return Path(checkpoint).name
    steps = run.checkpoints()
    return steps[-1][1].name if steps else "no checkpoint"


def _refuse_without_model(run: runs.Run) -> None:
    """A diverged run's final model is not a result, and a finished run whose checkpoints
    were deleted has no model to score: one line each, eval.json left as it is."""
    status = run.status()
    if status.state == runs.DIVERGED:
        kept = status.checkpoint
        raise UserError(f"{run.dir}: diverged at iteration {status.iteration} "
                        f"({status.reason or 'not finite'}): its final model is not a "
                        "result and is not scored"
                        + (f"; score the last finite checkpoint with --checkpoint "
                           f"{run.dir / kept}" if kept else ""))
    if status.state == runs.FINISHED and not run.checkpoints():
        raise UserError(f"{run.dir}: the run is finished but its model was deleted (no "
                        f"checkpoints left{'; pruned' if status.pruned else ''}); "
                        f"its eval.json is kept as it is")


def evaluate_run(run_dir: str | Path, device: str = defaults.DEVICE,
                 checkpoint: str | Path | None = None, accept_code_change: bool = False,
                 accept_data_change: bool = False, **options) -> tuple[dict, Path]:
    """Evaluate a run; the final model goes to eval.json, another checkpoint to eval-step-K.json.

    The run directory is locked meanwhile (perencode.store.lock): not beside a `train` of it.
    Its recipe.toml, data and code must be those it was made with (perencode.store.identity);
    code accepted with `accept_code_change` (data, `accept_data_change`) is named in the
    result (code_changes_accepted)."""
    dev = resolve_device(device)
    with runs.Run.open(run_dir, "eval", accept_code_change=accept_code_change,
                       accept_data_change=accept_data_change) as run:
        recipe = run.recipe
        if checkpoint is None:
            _refuse_without_model(run)
            _say_what_is_scored(run)
        session = Session.of_checkpoint(recipe, dev, *run.load(checkpoint, map_location=dev))
        try:
            scores = session.evaluate(**options)
        except NotFinite as exc:  # nothing written: a finite eval.json stays as it is
            raise NotFinite(exc.iteration, f"{exc.what} ({run.dir}, "
                            f"{session_source(run, checkpoint)}); its files are left as "
                            "they are") from None
        iteration = session.iteration
        record = EvalRecord(**scores, iteration=iteration,
                            code_changes_accepted=run.accepted or None)
        final = iteration == recipe.train.iterations
        name = "eval.json" if final else f"eval-step-{iteration}.json"
        path = run.write_eval(record, name)
    return record.result(), path
