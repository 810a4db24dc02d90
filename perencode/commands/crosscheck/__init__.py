"""`perencode crosscheck`: perencode against the authors' own code, on identical inputs and
weights (REPRODUCE.md, "Check the implementation against the authors' code").

`run_crosscheck(repo, out)` imports the authors' modules from the user's clone
(authors.py), runs every group of checks, prints one line per check and writes crosscheck.md
(the detail) and crosscheck.json. Exit codes: 0 every check agrees, or one outside CENTRAL
could not run (with its reason); 1 a check disagrees; 2 nothing could be compared (their
code does not run); 3 incomplete: a CENTRAL check could not run (the summary line says so
first and names what to install), so "agree" would not cover every path `train` runs. A
folder that is not their repository, or an --out that cannot be written, is a UserError
(exit 2).
"""

from __future__ import annotations

import functools
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from perencode import __version__
from perencode.commands.crosscheck import (
    gradient_stability,
    initial_weights,
    lm,
    loop,
    loss,
    models,
    recipes,
    resume,
    schedule,
    tasks,
    training,
)
from perencode.commands.crosscheck.authors import (
    KNOWN_COMMIT,
    Authors,
    NotRun,
    authors_code,
    locate,
)
from perencode.commands.crosscheck.report import (
    DISAGREE,
    NOT_RUN,
    UNDECIDED,
    Comparison,
    lines,
    write,
)
from perencode.commands.crosscheck.seeds import check_seeds, check_stream
from perencode.common import defaults
from perencode.common.console import console
from perencode.common.device import resolve_device
from perencode.common.errors import UserError
from perencode.common.files import WriteError

__all__ = ["CENTRAL", "GROUPS", "INCOMPLETE", "KNOWN_COMMIT", "lines", "run_crosscheck"]

# Exit status when a central check could not run (apart from 1, a disagreement).
INCOMPLETE = 3

# (group, what it compares, what of theirs it runs, the function)
GROUPS: tuple[tuple[str, str, str, Callable[[Authors], list[Comparison]]], ...] = (
    ("encoding", "positional encodings", "model.time_encoding", models.check_encodings),
    ("schedule", "learning-rate schedule", "timm CosineLRScheduler", schedule.check_schedule),
    ("forward", "forward logits", "model.rnn.RNN, model.ssm.SSM", models.check_forward),
    ("initialisation", "initial parameters of fresh models", "model.rnn.RNN, model.ssm.SSM",
     initial_weights.check_init),
    ("Adam trajectory", "parameters after Adam steps", "train_palindrome[_ssm].Learner",
     models.check_trajectory),
    ("training loop", "lr, loss and parameters at every iteration of perencode's loop",
     "utils.training_template.Learner.train", loop.check_loop),
    ("chunked loss", "the loss, hits and gradients with a forced small chunk_logits",
     "train_palindrome[_variable-length].Learner.train_per_iteration",
     loss.check_chunked_loss),
    ("resume", "an interrupted and resumed run against the uninterrupted one",
     "utils.training_template.Learner.save_model, retrieve_model, train",
     resume.check_resume),
    ("fixed-length tasks", "reverse, sort, reverse_add", "data.dataset, their tests",
     tasks.check_fixed_length),
    ("variable_length", "variable-length reverse", "data.dataset, their test",
     tasks.check_variable_length),
    ("seeds", "held-out sets and training streams per seed", "data.dataset, data.dataloader",
     check_seeds),
    ("training stream", "the first batches a run trains on, through Session.step",
     "train_palindrome.Learner.__call__", check_stream),
    ("predecessor", "predecessor query", "data.dataset, their test", tasks.check_predecessor),
    ("dual_frequency", "dual-frequency reverse", "data.dataset, their test",
     tasks.check_dual_frequency),
    ("stability", "gradient stability", "model.jacobian_analysis",
     gradient_stability.check_stability),
    ("stability triplets", "the S4D's triplets with a prefix", "test_jacobian_palindrome_ssm",
     gradient_stability.check_triplets),
    ("language model", "vocabulary layout, batches, perplexity", "train_lm.py", lm.check_lm),
    ("language model preparation", "lm-prepare's paragraphs and the pieces kept of each",
     "preprocess_wikitext.py, train_lm.py", lm.check_preparation),
    ("recipes", "defaults and paper grids against their command lines",
     "replication.sh, their argparse defaults", recipes.check_recipes),
)
# The groups that see every loss, optimizer, clipping, schedule and head fault of the step
# `perencode train` runs: without them an "agree" says little, so their "not run" makes the
# whole crosscheck incomplete (exit INCOMPLETE), not a pass.
CENTRAL = ("schedule", "Adam trajectory", "training loop", "chunked loss", "resume")


def _run(group: str, compared: str, theirs: str,
         fn: Callable[[], list[Comparison]]) -> list[Comparison]:
    try:
        return fn()
    except NotRun as exc:
        return [Comparison(group, compared, theirs, verdict=NOT_RUN, reason=str(exc))]
    except UserError:
        raise
    except SyntaxError as exc:  # their code does not even compile: nothing was compared
        where = f"{exc.filename}:{exc.lineno}" if exc.filename else str(exc)
        return [Comparison(group, compared, theirs, verdict=NOT_RUN,
                           reason=f"could not run the authors' code: SyntaxError at {where}")]
    except Exception as exc:  # a crash on either side is a disagreement, never a pass
        return [Comparison(group, compared, theirs, verdict=DISAGREE,
                           reason=f"could not compare: {type(exc).__name__}: {exc}")]


def run_crosscheck(repo_path: str | Path, out: str | Path, train: bool = False,
                   train_shape: str = defaults.CROSSCHECK_SHAPE,
                   seeds: int = defaults.CROSSCHECK_SEEDS, iterations: int | None = None,
                   device: str = defaults.DEVICE, progress: bool = True,
                   margin: float | None = None) -> int:
    """Run every check (and the training comparison with `train`, its equivalence margin
    `margin`, None: the shape's); returns the exit code."""
    repo = locate(repo_path)
    if train_shape not in training.SHAPES:
        raise UserError(f"--train-shape {train_shape}: must be one of "
                        f"{', '.join(training.SHAPES)}")
    out = Path(out)
    _check_writable(out)
    if repo.note:
        console.print(repo.note, highlight=False, markup=False)
    shape = training.SHAPES[train_shape]
    if margin is not None and not 0 < margin < 1:
        raise UserError(f"--margin {margin}: must be between 0 and 1 (token accuracy)")
    if iterations is not None:
        shape = training.Shape(**{**shape.__dict__, "iterations": iterations,
                                  "warmup": min(shape.warmup, max(1, iterations // 10))})
    dev = resolve_device(device)
    started = time.perf_counter()
    checks: list[Comparison] = []
    missing: dict[str, str] = {}  # central group -> why it did not run
    with authors_code(repo) as authors:
        for i, (group, compared, theirs, fn) in enumerate(GROUPS, start=1):
            if progress:
                console.print(f"[{i}/{len(GROUPS)}] {group}", highlight=False)
            found = _run(group, compared, theirs, functools.partial(fn, authors))
            why = [c.reason for c in found if c.verdict == NOT_RUN]
            if group in CENTRAL and why:
                missing[group] = why[0]
            checks += found
        if train:
            checks += _run("training", "held-out accuracy after training", "their Learner",
                           lambda: training.check_training(authors, shape, seeds, dev,
                                                           progress, margin))
    wall = time.perf_counter() - started
    commit = repo.commit or f"unknown (no .git; written against {KNOWN_COMMIT})"
    failed = sum(c.verdict == DISAGREE for c in checks)
    skipped = sum(c.verdict == NOT_RUN for c in checks)
    undecided = sum(c.verdict == UNDECIDED for c in checks)
    counts = (f"{len(checks) - failed - skipped - undecided} agree, {failed} disagree, "
              f"{skipped} not run" + (f", {undecided} undecided (more seeds: see its row)"
                                      if undecided else ""))
    incomplete = (f"INCOMPLETE: central checks not run: {', '.join(missing)} ("
                  f"{next(iter(missing.values()))})" if missing else "")
    header = [f"- authors' repository: `{repo.root}`, commit {commit}",
              f"- perencode {__version__}, torch {torch.__version__}, Python "
              f"{platform.python_version()}, device {dev}",
              f"- wall time {wall:.1f} s",
              f"- {incomplete + '; ' if incomplete else ''}{counts}",
              "- verdicts: agree (within the tolerance, or the documented difference exactly), "
              "disagree, not run (with the reason); --train: agree = equivalent by TOST "
              "within the stated margin, disagree = different, undecided = more seeds "
              "needed"]
    if repo.note:
        header.append(f"- {repo.note}")
    for line in lines(checks, console.width):
        console.print(line, highlight=False, overflow="ellipsis", no_wrap=True, crop=True)
    try:
        write(out, checks, header, {"repository": str(repo.root), "commit": repo.commit,
                                    "written_against": KNOWN_COMMIT, "note": repo.note,
                                    "perencode": __version__, "torch": torch.__version__,
                                    "device": str(dev), "wall_seconds": round(wall, 2),
                                    "complete": not missing, "central_not_run": missing})
    except (OSError, WriteError) as exc:  # WriteError may name the temporary file
        reason = exc.strerror if isinstance(exc, OSError) else str(exc).split(": ")[-1]
        raise UserError(f"--out {out}: cannot write crosscheck.md and crosscheck.json there "
                        f"({reason or exc})") from None
    # The summary: incompleteness first (it changes what "agree" means), then the counts.
    console.print(f"{incomplete + '; ' if incomplete else ''}{counts}; {wall:.0f} s; detail "
                  f"in {out / 'crosscheck.md'}", highlight=False, markup=False)
    if failed:
        return 1
    if skipped == len(checks):
        console.print("crosscheck: nothing could be compared (every check: not run)",
                      highlight=False)
        return 2
    return INCOMPLETE if missing else 0


def _check_writable(out: Path) -> None:
    """--out is checked before any work: a folder that cannot be written fails at once, in
    one line naming it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write there ({exc.strerror or exc}); give a "
                        "folder you can write") from None
