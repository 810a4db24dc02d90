"""The `perencode` command line: parse, load the recipe, call one library function.

Every `UserError` becomes one red line on stderr and exit code 2.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from perencode import runs
from perencode.bench import bench as run_bench
from perencode.console import console
from perencode.device import resolve_device
from perencode.errors import UserError
from perencode.evaluate import evaluate_run
from perencode.figures import make_figures
from perencode.grid import slurm_overrides
from perencode.lm.prepare import prepare
from perencode.quickstart import run_quickstart
from perencode.recipe import load_recipe, schema_rows
from perencode.rehearsal import check as check_rehearsal
from perencode.rehearsal import write_corpus
from perencode.stability import analyse_run
from perencode.sweep import run_sweep
from perencode.train import Interrupted
from perencode.train import train as run_training
from perencode.verify import verify_runs

app = typer.Typer(
    add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Reproduce 'Positional Encoding Helps Recurrent Neural Networks Handle a Large "
         "Vocabulary' (Morita, TMLR).")

SET_HELP = "Override a recipe field: section.key=value (value as a TOML literal). Repeatable."
DEVICE_HELP = "auto (cuda if available, else cpu), cpu, cuda or cuda:N."


def fail(message: str, code: int = 2) -> None:
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def user_errors(fn):
    """Turn UserError into one line and exit 2; no traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            fail(str(exc))
    return wrapper


@app.command()
@user_errors
def train(
    recipe: Path = typer.Argument(..., help="TOML recipe, e.g. recipes/gru_vocab256.toml."),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
    out: Path | None = typer.Option(None, "--out", help="Run directory "
                                       "[default: runs/<recipe-stem>/seed-<seed>]."),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    progress: bool = typer.Option(True, help="Show a progress bar / log lines."),
) -> None:
    """Train a recipe (or resume its interrupted run, or report it complete)."""

    r = load_recipe(recipe, overrides)
    run_dir = out if out is not None else runs.default_run_dir(recipe, r.train.seed)
    already = run_dir.is_dir() and runs.is_complete(run_dir)
    try:
        result = run_training(r, run_dir, device, progress=progress)
    except Interrupted as stop:
        console.print(f"interrupted at iteration {stop.iteration}; checkpoint saved to "
                      f"{stop.path}. Run the same command again to resume.")
        raise typer.Exit(130) from None
    if already:
        console.print(f"{run_dir}: run is already complete; results in {run_dir}/eval.json")
    _print_metrics(result, run_dir / "eval.json")


def _print_metrics(result: dict, path: Path) -> None:
    table = Table(title=str(path), show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.items():
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(table)


@app.command("eval")
@user_errors
def eval_(
    run_dir: Path = typer.Argument(..., help="A run directory made by `perencode train`."),
    checkpoint: Path | None = typer.Option(None, help="Score this checkpoint instead of "
                                              "the newest."),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    per_position: bool = typer.Option(False, "--per-position",
                                      help="Language models: perplexity by token position."),
) -> None:
    """Score a run on its held-out data and write eval.json."""

    options = {"per_position": True} if per_position else {}
    result, path = evaluate_run(run_dir, device, checkpoint, **options)
    _print_metrics(result, path)


@app.command()
@user_errors
def bench(
    recipe: Path = typer.Argument(..., help="TOML recipe to time."),
    iterations: int = typer.Option(20, min=1, help="Timed iterations (after warm-up)."),
    warmup: int = typer.Option(3, min=0, help="Untimed warm-up iterations."),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    baseline: bool = typer.Option(False, help="Also time a bare PyTorch loop of the same "
                                  "shapes (GRU/LSTM) and report the ratio."),
) -> None:
    """Time the real training step; prints a table and a final JSON line."""

    r = load_recipe(recipe, overrides)
    result = run_bench(r, resolve_device(device), iterations, warmup, baseline)
    table = Table(title=f"bench {recipe}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, f"{value:.6g}" if isinstance(value, float) else str(value))
    console.print(table)
    print(json.dumps(result), flush=True)


@app.command("recipe-schema")
def recipe_schema() -> None:
    """Print every recipe field (key, type, default, meaning) as a Markdown table."""

    print("| key | type | default | description |\n|---|---|---|---|")
    for row in schema_rows():
        print("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")


@app.command()
@user_errors
def stability(
    run_dir: Path = typer.Argument(..., help="A run of the dual-frequency task "
                                   "(task.name = \"dual_frequency\"), GRU, LSTM or S4D."),
    triplets: int = typer.Option(1024, min=4, help="Triplets (x,s),(x,s'),(x',s) per "
                                 "checkpoint, drawn from the run's seed (the same at every "
                                 "checkpoint); a multiple of 4, a quarter per target x "
                                 "disturbant condition (FREQUENT/RARE)."),
    metric: str = typer.Option("weighted", help="Which metric fills the `stability` column "
                               "(all four are written as stability_<name>): weighted (the "
                               "authors' code; Fig. 5, inferred), printed (Eq. 3-4 as "
                               "printed, not normalised), mean (unweighted mean row cosine) "
                               "or frobenius (cosine of the flattened Jacobians)."),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    every: int = typer.Option(1, min=1, help="Analyse every N-th checkpoint: the 1st, "
                              "(N+1)-th, (2N+1)-th, ..."),
    batch: int = typer.Option(16, min=1, help="Triplets differentiated at once; peak memory "
                              "grows linearly with it (docs/stability.md)."),
    progress: bool = typer.Option(True, help="Show a progress bar / log lines."),
) -> None:
    """Gradient stability at every checkpoint of a dual-frequency run (Fig. 4-5;
    docs/paper-facts.md#gradient-stability).

    Writes RUN_DIR/stability.csv: one row per checkpoint, triplet and comparison.
    "target" = (x,s) vs (x,s'), as drawn in Fig. 5; "suffix" = (x,s) vs (x',s).
    Checkpoints already in the file are skipped: an interrupted analysis resumes,
    a finished one is left as it is.
    """

    path = analyse_run(run_dir, triplets=triplets, metric=metric, device=device, every=every,
              batch=batch, progress=progress)
    console.print(f"wrote {path}")


@app.command("lm-prepare")
@user_errors
def lm_prepare(
    source: str | None = typer.Option(None, help="A folder with wiki.{train,valid,test}.raw, "
                                         "a `datasets` dataset saved to disk, or a Hugging "
                                         "Face dataset name [default: wikitext-103-raw-v1]."),
    out: Path = typer.Option(Path("data/wikitext103"), help="Output folder."),
    vocab_size: int = typer.Option(32768, min=16, help="SentencePiece unigram vocabulary."),
    max_tokens: int = typer.Option(1024, min=1, help="Input tokens kept per paragraph."),
    threads: int = typer.Option(0, min=0, help="Encoding threads [0: all cores]."),
    progress: bool = typer.Option(True, help="Show progress."),
) -> None:
    """Prepare WikiText-103 for language modelling: clean, train SentencePiece, encode."""

    manifest = prepare(source=source, out=out, vocab_size=vocab_size, max_tokens=max_tokens,
                  threads=threads, progress=progress)
    console.print(f"prepared {out} ({manifest.get('status', 'done')})")


@app.command()
@user_errors
def sweep(
    grid: Path = typer.Argument(..., help="Grid file, e.g. "
                                "recipes/paper/fig02_gru_reverse.toml."),
    out: Path = typer.Option(Path("runs"), help="Root of the run directories."),
    executor: str = typer.Option("local", help="local (subprocesses) or slurm (submitit)."),
    jobs: int = typer.Option(1, min=1, help="Runs at once (local)."),
    runs_per_gpu: int = typer.Option(1, min=1, help="Runs sharing one GPU (local)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (runs, states), "
                                 "disk and device-hours at once; run nothing."),
    estimate: bool = typer.Option(False, "--estimate", help="Time 3 iterations of each "
                                  "shape not yet measured on this device (cached in "
                                  "OUT/.estimates.json), then print the plan; train nothing."),
    wait: bool = typer.Option(True, help="--no-wait (SLURM): submit and return; running the "
                              "same command again collects the jobs, never submits twice."),
    only: list[str] = typer.Option([], "--only", help="KEY=V1,V2: keep the cells whose axis "
                                   "KEY takes one of these values. Repeatable."),
    overrides: list[str] = typer.Option([], "--set", help=SET_HELP),
    device: str = typer.Option("auto", help=DEVICE_HELP),
    partition: str | None = typer.Option(None, help="SLURM partition (overrides the grid's "
                                         "\\[slurm] table)."),
    time_min: int | None = typer.Option(None, help="SLURM time limit in minutes."),
    gpus_per_job: int | None = typer.Option(None, help="SLURM GPUs per job."),
    cpus_per_job: int | None = typer.Option(None, help="SLURM CPUs per job."),
    slurm_options: list[str] = typer.Option(
        [], "--slurm", help="KEY=VALUE: any field of the grid's \\[slurm] table (value as a "
        "TOML literal), e.g. --slurm 'python=\"apptainer exec --nv perencode.sif python\"' "
        "--slurm 'qos=\"high\"'. Repeatable; docs/slurm.md lists the fields."),
    progress: bool = typer.Option(True, help="Show the live run table."),
) -> None:
    """Run every cell of a grid (skipping finished runs, resuming interrupted ones)."""

    slurm = {k: v for k, v in (("partition", partition), ("time_min", time_min),
                               ("gpus_per_job", gpus_per_job),
                               ("cpus_per_job", cpus_per_job)) if v is not None}
    slurm.update(slurm_overrides(slurm_options))
    code = run_sweep(grid, out=out, executor=executor, jobs=jobs, runs_per_gpu=runs_per_gpu,
                     dry_run=dry_run, only=only, overrides=overrides, device=device,
                     slurm=slurm, progress=progress, wait=wait, estimate=estimate)
    raise typer.Exit(code)


@app.command()
@user_errors
def quickstart(
    device: str = typer.Option("auto", help="auto: the GPU demo at the paper's shapes where a "
                               "CUDA device is present, else the CPU demo; cpu or cuda to "
                               "choose."),
    out: Path = typer.Option(Path("runs"), help="Root of the run directories."),
    figures_dir: Path = typer.Option(Path("figures"), "--figures",
                                     help="Where the figures and the claims report go."),
    jobs: int | None = typer.Option(None, min=1, help="Runs at once [default: 2 on the "
                                    "CPU, 6 sharing the GPU]."),
    progress: bool = typer.Option(True, help="Show the live run table."),
) -> None:
    """The paper's headline effect in about 15 minutes: sweep, figures, claims."""
    raise typer.Exit(run_quickstart(device, out=out, figures=figures_dir, jobs=jobs,
                                    progress=progress))


@app.command()
@user_errors
def figures(
    runs: list[Path] = typer.Argument(..., help="Run directories or folders holding them."),
    out: Path = typer.Option(Path("figures"), help="Output folder."),
) -> None:
    """Collect results into results.csv and draw every paper figure they cover."""

    written = make_figures(runs, out=out)
    for path in written:
        console.print(f"wrote {path}")


@app.command()
@user_errors
def verify(
    runs: list[Path] = typer.Argument(..., help="Run directories or folders holding them."),
    claims: str = typer.Option("paper", help="Claims file: a path, or a bundled one (paper, "
                               "quick, quick_gpu)."),
    out: Path = typer.Option(Path("figures"), help="Where verify.md and verify.json go."),
    report_only: bool = typer.Option(False, "--report-only", help="Exit 0 whatever the "
                                     "verdicts (errors still exit 2): runs too small to "
                                     "decide, as in `make rehearsal`."),
) -> None:
    """Check the paper's claims against the runs; exit 1 if an evaluated claim fails."""

    code = verify_runs(runs, claims=claims, out=out)
    raise typer.Exit(0 if report_only else code)


rehearsal_app = typer.Typer(no_args_is_help=True, help="The reviewer's path at CPU size "
                            "(`make rehearsal`): its corpus and its final check.")
app.add_typer(rehearsal_app, name="rehearsal")


@rehearsal_app.command("corpus")
@user_errors
def rehearsal_corpus(
    folder: Path = typer.Argument(..., help="Where wiki.{train,valid,test}.raw go."),
    seed: int = typer.Option(0, help="Seed of the made-up words and paragraphs."),
) -> None:
    """Write a small WikiText-103-shaped raw corpus (for `lm-prepare --source`)."""

    written = write_corpus(folder, seed)
    console.print(f"wrote {folder}: " + ", ".join(f"{split} {len(w['paragraphs'])} paragraphs"
                                                  for split, w in written.items()))


@rehearsal_app.command("check")
@user_errors
def rehearsal_check(
    figures_dir: Path = typer.Argument(..., help="The folder `figures` and `verify` wrote."),
    claims: str = typer.Option("paper", help="Claims file: a path, or a bundled one (paper, "
                               "quick, quick_gpu)."),
) -> None:
    """Check that every claim was decided or reported and every figure was drawn."""

    for line in check_rehearsal(figures_dir, claims):
        console.print(line, highlight=False, soft_wrap=True)
    console.print(f"rehearsal check passed: {figures_dir}")
