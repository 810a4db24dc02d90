"""The `perencode` command line: parse, load the recipe, call one library function.

Every `UserError` becomes one red line on stderr and exit code 2. Each
command imports what it runs inside its function, so `perencode --help`, `--version` and
shell completion start without loading torch, pandas, matplotlib or submitit (and on any
platform: the POSIX-only modules are reached only by the commands that use them).

One declaration style: every parameter is `Annotated[type, typer.Option/Argument(...)]` with
its default after `=`. An option several commands take is declared once below (an alias, or a
function of the help that differs between them); the sweep's own options are declared beside
SweepOptions (perencode.commands.sweep.options), which they fill.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import shlex
import signal
from importlib import metadata
from os import environ
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from perencode import __version__
from perencode.commands.sweep import options as sweep_options
from perencode.common import defaults
from perencode.common.console import SAID, console, guard_output, guard_stdout, results
from perencode.common.errors import UserError, refused_write
from perencode.config import registry


class _PlainArgument(typer.core.TyperArgument):
    """An argument spelt as click spells it: RECIPE, RUNS..., [OPTIONAL] (typer 0.29 writes
    `{recipe}` in the usage line and `<list[Path]>` beside it)."""

    def get_usage_pieces(self, ctx) -> list[str]:
        name = (self.metavar or self.name or "").upper() + ("..." if self.nargs != 1 else "")
        return [name if self.required else f"[{name}]"]

    def display_type_rich(self, ctx) -> str | None:
        shown = super().display_type_rich(ctx)
        return re.sub(r"<list\[(\w+)\]>", lambda m: f"<{m[1].lower()}>...", shown) \
            if shown else shown


def _unwrapped(text: str | None) -> str | None:
    """A docstring with each paragraph on one line: typer keeps its single line breaks and
    rich wraps the lines again at the terminal's width, so at 80 columns a sentence broke
    where the source line ended ("... each\nmodel,")."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


def _plain(argument: typer.core.TyperArgument) -> _PlainArgument:
    """`argument` as a _PlainArgument, through the constructor typer itself calls: typer has
    no `cls=` for a parameter, as click.argument has. (No argument here declares its own
    shell completion, which this would have to carry over too.)"""
    envvar = argument.envvar
    return _PlainArgument(
        param_decls=[argument.name or ""], type_descriptor=argument.type_descriptor,
        required=argument.required, default=argument.default, callback=argument.callback,
        nargs=argument.nargs, metavar=argument.metavar, expose_value=argument.expose_value,
        is_eager=argument.is_eager, show_default=argument.show_default,
        envvar=envvar if envvar is None or isinstance(envvar, str) else list(envvar),
        show_choices=argument.show_choices, show_envvar=argument.show_envvar,
        help=argument.help, hidden=argument.hidden, min=argument.min, max=argument.max,
        rich_help_panel=argument.rich_help_panel)


class _PlainHelp:
    """Help without typer 0.29's `<bool>` beside every flag (a flag takes no value), its
    arguments spelt as click spells them (_PlainArgument), its paragraphs wrapped once
    (_unwrapped)."""

    def __init__(self, *args, **kwargs):
        kwargs["help"] = _unwrapped(kwargs.get("help"))
        if kwargs["help"] and not kwargs.get("short_help"):
            # The whole first paragraph in a list of commands: click would cut it at 45
            # characters ("...") where typer renders without rich (TYPER_USE_RICH=0).
            kwargs["short_help"] = kwargs["help"].split("\n\n")[0].removeprefix("\b")
        kwargs["params"] = [_plain(param) if isinstance(param, typer.core.TyperArgument)
                            else param for param in kwargs.get("params") or []]
        super().__init__(*args, **kwargs)

    def get_params(self, ctx) -> list:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:  # --help among them, which click adds here
            if isinstance(param, typer.core.TyperOption) and param.is_flag:
                param.metavar = ""
        return params


class _PlainCommand(_PlainHelp, typer.core.TyperCommand):
    def parse_args(self, ctx, args: list[str]) -> list[str]:
        """An option of `perencode` itself given after the command (`eval RUN --plugin X`)
        says where it goes."""
        given = list(args)  # the parser consumes `args`
        try:
            return super().parse_args(ctx, args)
        except Exception as exc:  # click's NoSuchOption (typer vendors its own click)
            spaced = _spaced_set(given)
            if spaced and "extra argument" in str(getattr(exc, "message", "")):
                exc.message = (f"--set {spaced[0]} {spaced[1]}: write --set "  # type: ignore[attr-defined]
                               f"{spaced[0]}={spaced[1]} (KEY=VALUE, one word)")
                raise
            name = getattr(exc, "option_name", None)
            group = ctx.parent.command if ctx.parent else None
            own = {opt: param for param in getattr(group, "params", []) for opt in param.opts}
            if type(exc).__name__ != "NoSuchOption" or name not in own:
                raise
            value = f" {own[name].metavar}" if own[name].metavar else ""
            message = (f"No such option: {name}: it is an option of perencode itself, "
                       f"given before the command: perencode {name}{value} {ctx.info_name} ...")
            exc.message = message  # type: ignore[attr-defined]
            raise


def _spaced_set(args: list[str]) -> tuple[str, str] | None:
    """(key, value) of a `--set section.key value` written with a space for the '='."""
    for option, key, value in zip(args, args[1:], args[2:]):
        if option == "--set" and "=" not in key and not value.startswith("-"):
            return key, value
    return None


class _PlainGroup(_PlainHelp, typer.core.TyperGroup):
    pass


class _App(typer.Typer):
    """A Typer whose commands (including those added later) render plain help."""

    def __init__(self, **kwargs):
        super().__init__(cls=_PlainGroup, **kwargs)

    def command(self, *args, **kwargs):
        kwargs.setdefault("cls", _PlainCommand)
        return super().command(*args, **kwargs)


app = _App(
    add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Reproduce 'Positional Encoding Helps Recurrent Neural Networks Handle a Large "
         "Vocabulary' (Morita, TMLR).")

SET_HELP = ("Override a recipe field: section.key=value. The value is read as a TOML literal "
            "(64, 1e-3, true, [0.9, 0.999], \"x\"); a bare word that is not TOML (lstm) is "
            "a string. Repeatable.")
DEVICE_HELP = "auto (cuda if available, else cpu), cpu, cuda or cuda:N."
ACCEPT_HELP = ("Use the code loaded now although a kind's code differs from the code that "
               "made the run (as its identity.json records); the output says so.")


# The options several commands share, declared once: an alias where the help is the same
# everywhere, a function of what differs (the command's own note) where it is not. Their
# defaults are perencode.common.defaults, the library's own.
def out_folder(holding: str = "", **kwargs: Any) -> Any:
    """The --out option of a command that writes `holding` into a folder."""
    return typer.Option("--out", help="Output folder" + (f": {holding}." if holding else "."),
                        **kwargs)


def device_option(help: str = DEVICE_HELP) -> Any:
    """The --device option; `help` where a command takes other devices or says more."""
    return typer.Option("--device", help=help)


def progress_option(help: str = "Show a progress bar / log lines.") -> Any:
    """The --progress/--no-progress switch; `help`: what it shows."""
    return typer.Option("--progress/--no-progress", help=help)


def json_flag(help: str) -> Any:
    """The --json flag: `help` says which record goes to stdout, instead of what."""
    return typer.Option("--json", help=help)


def force_flag(help: str) -> Any:
    """The --force flag: `help` says which check it skips."""
    return typer.Option("--force", help=help)


def dry_run_flag(help: str) -> Any:
    """The --dry-run flag: `help` says what is shown instead of done."""
    return typer.Option("--dry-run", help=help)


Overrides = Annotated[list[str] | None, typer.Option("--set", metavar="KEY=VALUE",
                                                     help=SET_HELP)]
Device = Annotated[str, device_option()]
AcceptCode = Annotated[bool, typer.Option("--accept-code", help=ACCEPT_HELP)]
AcceptData = Annotated[bool, typer.Option(
    "--accept-data", help="Use the prepared data there now although its content differs "
    "from the data that made the run (as its identity.json records); recorded.")]
Claims = Annotated[str, typer.Option("--claims", help="Claims file: a path, or a bundled one "
                                                    "(paper, quick, quick_gpu).")]
RunsRoot = Annotated[Path | None, typer.Option(
    "--runs", help="Root of the run directories: a grid's runs go in a folder named after it.",
    show_default=str(defaults.RUNS))]
OldOut = Annotated[Path | None, typer.Option("--out", hidden=True)]  # the old spelling
RunPaths = Annotated[list[Path], typer.Argument(help="Run directories or folders holding "
                                                     "them.")]
Progress = Annotated[bool, progress_option()]
LiveTable = Annotated[bool, progress_option("Show the live run table.")]


def fail(message: str, code: int = 2) -> None:
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code)


def user_errors(fn):
    """Turn UserError, and a write the filesystem refuses (read-only, full, no permission,
    no locks) wherever it happens, into one line naming the path and exit 2; no traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        SAID.clear()  # a note is said once per command (perencode.common.console.note_once)
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            fail(str(exc))
        except OSError as exc:
            message = refused_write(exc)
            if message is None:
                raise
            fail(message)
    return wrapper


def renamed(value, old_value, new: str, old: str):
    """The value of an option whose old spelling still works, with a one-line note."""
    if old_value is None:
        return value
    if value is not None:
        raise UserError(f"{old} is the old spelling of {new}; give one of them")
    console.print(f"note: {old} is now {new}; the old spelling still works for now",
                  highlight=False)
    return old_value


def _version(value: bool) -> None:
    if value:
        print(f"perencode {__version__}")
        raise typer.Exit()


Version = Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")]
Plugins = Annotated[list[str] | None, typer.Option(
    "--plugin", metavar="PLUGIN", help="Load a plugin's tasks, models or encodings: a "
    "Python file or an importable module (docs/extending.md). Repeatable; also "
    "PERENCODE_PLUGINS (a path-separated list). Installed plugins (entry points "
    "perencode.kinds) load by themselves, unless PERENCODE_DISABLE_PLUGIN_AUTOLOAD=1. A sweep "
    "hands them to its workers and jobs.")]


@app.callback()
def main(version: Version = False, plugin: Plugins = None) -> None:
    """Options of `perencode` itself (the commands have their own)."""
    guard_stdout()
    # Without a plugin nothing is imported: commands that need no kinds start without torch.
    installed = registry.autoload() and metadata.entry_points(group="perencode.kinds")
    if plugin or environ.get("PERENCODE_PLUGINS") or installed:
        from perencode.config.plugins import activate

        try:
            activate(plugin or [])
        except UserError as exc:
            fail(str(exc))


@app.command()
@user_errors
def train(
    recipe: Annotated[Path, typer.Argument(help="TOML recipe, e.g. "
                                               "recipes/gru_vocab256.toml.")],
    overrides: Overrides = None,
    run_dir: Annotated[Path | None, typer.Option(
        "--run-dir", help="Run directory.",
        show_default=f"{defaults.RUNS}/<recipe>/seed=<seed>")] = None,
    old_out: OldOut = None,
    device: Device = defaults.DEVICE,
    progress: Progress = True,
    tensorboard: Annotated[bool, typer.Option(
        "--tensorboard", help="Also write loss, accuracy, learning rate and throughput as "
        "TensorBoard event files in RUN_DIR/tensorboard (needs "
        "`pip install perencode\\[tensorboard]`).")] = False,
    force: Annotated[bool, force_flag("Skip the memory check (a recipe estimated not to fit "
                                      "in the device's memory is refused).")] = False,
    accept_code_change: AcceptCode = False,
    accept_data_change: AcceptData = False,
) -> None:
    """Train a recipe (or resume its interrupted run, or report it complete)."""
    from perencode.commands.train import train_recipe
    from perencode.config.recipe import load_recipe
    from perencode.store.runs import DIVERGED_EXIT, recipe_check
    from perencode.training.loop import STOP_SIGNALS, Diverged, Interrupted

    guard_output()
    r = load_recipe(recipe, overrides, recipe_check(recipe))
    run_dir = renamed(run_dir, old_out, "--run-dir", "--out")
    try:
        result, run_dir, already = train_recipe(
            recipe, r, run_dir, device, progress=progress, tensorboard=tensorboard,
            force=force, accept_code_change=accept_code_change,
            accept_data_change=accept_data_change)
    except Interrupted as stop:
        for s in STOP_SIGNALS:  # a second stop signal must not cut the closing line short
            signal.signal(s, signal.SIG_IGN)
        console.print(f"interrupted at iteration {stop.iteration}; checkpoint saved to "
                      f"{stop.path}. Run the same command again to resume.")
        raise typer.Exit(128 + stop.signum) from None
    except Diverged as exc:
        fail(str(exc), DIVERGED_EXIT)
    if already:
        console.print(f"{run_dir}: run is already complete; results in {run_dir}/eval.json")
    _print_metrics(result, run_dir / "eval.json")


def _print_metrics(result: dict, path: Path, as_json: bool = False) -> None:
    """A run's scores on stdout: a table for people, or eval.json's object (--json)."""
    if as_json:
        print(json.dumps(result, indent=2), flush=True)
        return
    table = Table(title=str(path), show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in result.items():
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    results.print(table)


@app.command("eval")
@user_errors
def eval_(
    run_dir: Annotated[Path, typer.Argument(help="A run directory made by `perencode "
                                                "train`.")],
    checkpoint: Annotated[Path | None, typer.Option(
        "--checkpoint", help="Score this checkpoint instead of the newest.")] = None,
    device: Device = defaults.DEVICE,
    per_position: Annotated[bool, typer.Option(
        "--per-position", help="Language models: perplexity by token position.")] = False,
    accept_code_change: AcceptCode = False,
    accept_data_change: AcceptData = False,
    as_json: Annotated[bool, json_flag("Print eval.json's object on stdout instead of the "
                                       "table.")] = False,
) -> None:
    """Score a run on its held-out data and write eval.json (the scores on stdout)."""
    from perencode.commands.evaluate import evaluate_run
    from perencode.store.runs import DIVERGED_EXIT
    from perencode.training.session import NotFinite

    options = {"per_position": True} if per_position else {}
    try:
        result, path = evaluate_run(run_dir, device, checkpoint, accept_code_change,
                                    accept_data_change, **options)
    except NotFinite as exc:  # a divergence at evaluation: the exit status of one
        fail(str(exc), DIVERGED_EXIT)
    _print_metrics(result, path, as_json)


@app.command()
@user_errors
def bench(
    recipe: Annotated[Path, typer.Argument(help="TOML recipe to time.")],
    iterations: Annotated[int, typer.Option(
        "--iterations", min=1, help="Timed iterations (after warm-up).")
    ] = defaults.BENCH_ITERATIONS,
    warmup: Annotated[int, typer.Option("--warmup", min=0,
                                        help="Untimed warm-up iterations.")
                      ] = defaults.BENCH_WARMUP,
    overrides: Overrides = None,
    device: Device = defaults.DEVICE,
    baseline: Annotated[bool, typer.Option(
        "--baseline/--no-baseline", help="Also time a bare PyTorch loop of the same shapes "
        "(GRU/LSTM) and report the ratio.")] = False,
    sampling: Annotated[bool, typer.Option(
        "--sampling", help="Also time drawing one batch alone with held-out sets of about 0, "
        "50%, 99% and all but a batch of the task's sequences (a small task.length and "
        "vocab_size), each as a ratio to the first.")] = False,
) -> None:
    """Time the real training step; prints a table and a final JSON line."""
    from perencode.commands.bench import bench as run_bench
    from perencode.commands.bench import sampling as run_sampling
    from perencode.common.device import resolve_device
    from perencode.config.recipe import load_recipe
    from perencode.store.runs import recipe_check

    r = load_recipe(recipe, overrides, recipe_check(recipe))
    result: dict = run_bench(r, resolve_device(device), iterations, warmup, baseline)
    table = Table(title=f"bench {recipe}")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in result.items():
        table.add_row(key, f"{value:.6g}" if isinstance(value, float) else str(value))
    results.print(table)
    if sampling:
        result["sampling"] = run_sampling(r, resolve_device(device), iterations, warmup)
        table = Table(title="drawing one batch, by held-out density")
        for column in ("held out", "rows", "share of draws", "seconds", "ratio"):
            table.add_column(column, justify="left" if column == "held out" else "right")
        for row in result["sampling"]:
            table.add_row(row["density"], str(row["held_out"]), f"{row['share']:.4f}",
                          f"{row['seconds_per_batch']:.3g}", f"{row['ratio']:.2f}")
        results.print(table)
    print(json.dumps(result), flush=True)


@app.command()
@user_errors
def show(
    recipe: Annotated[Path, typer.Argument(help="TOML recipe, e.g. recipes/gru_vocab256.toml, "
                                               "or a run directory.")],
    overrides: Overrides = None,
    as_json: Annotated[bool, json_flag("JSON instead of TOML.")] = False,
) -> None:
    """Print the recipe a run would use, overrides applied and every default filled in.

    An unset field is a comment in TOML, null in JSON. For a run directory, before its
    recipe: its state, results, training, device and duration, its fingerprint with where
    its code and data came from (RUN_DIR/identity.json), and a warning where its files no
    longer match that record; a plugin's run is read without its plugin.
    """
    from perencode.config.recipe import load_recipe

    if recipe.is_dir() and not overrides:
        from perencode.store.summary import story_lines, summarise

        r, story = summarise(recipe)
        for line in story["mismatches"]:
            console.print(f"[yellow]warning:[/] {recipe}: {escape(line)}", highlight=False,
                          soft_wrap=True)
        if as_json:
            from perencode.store import identity

            print(json.dumps({**story, "recipe": r.model_dump(mode="json"),
                              "identity": (entry.as_dict() if (entry := identity.read(recipe))
                                           else None)}, indent=2))
            return
        print("".join(f"# {line}\n" for line in story_lines(story))
              + r.to_toml_every_field().rstrip("\n"))
        return
    path = recipe / "recipe.toml" if recipe.is_dir() else recipe
    check = None
    if path.name == "recipe.toml":  # a run's, maybe: the plugins it needs (the store reads)
        from perencode.store.runs import recipe_check

        check = recipe_check(path)
    r = load_recipe(path, overrides, check)
    if as_json:
        print(json.dumps(r.model_dump(mode="json"), indent=2))
        return
    print(r.to_toml_every_field().rstrip("\n"))


@app.command("recipe-schema")
def recipe_schema(
    as_json: Annotated[bool, json_flag("The JSON Schema of a recipe (for editors and "
                                       "validators) instead of the Markdown table.")] = False,
) -> None:
    """Print every recipe field (key, type, default, meaning) as a Markdown table."""
    from perencode.config.schema import json_schema, schema_rows

    if as_json:
        print(json.dumps(json_schema(), indent=2))
        return
    print("| key | type | default | description |\n|---|---|---|---|")
    for row in schema_rows():
        print("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")


@app.command("claims-schema")
def claims_schema(
    as_json: Annotated[bool, json_flag("The JSON Schema of a claims file (for editors and "
                                       "validators) instead of the Markdown table.")] = False,
) -> None:
    """Print every field of a claims file's claim tables as a Markdown table
    (docs/claims.md)."""
    from perencode.analysis.verdicts import Claim
    from perencode.analysis.verdicts import claims_schema as schema
    from perencode.config.schema import model_rows

    if as_json:
        print(json.dumps(schema(), indent=2))
        return
    print("| key | type | default | description |\n|---|---|---|---|")
    for row in model_rows(Claim):
        print("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")


@app.command()
@user_errors
def env(
    device: Device = defaults.DEVICE,
    as_json: Annotated[bool, json_flag("One JSON object (what each run records in "
                                       "env.json).")] = False,
) -> None:
    """Print the environment: versions, git commit, device, threads (for a bug report).

    perencode and its git commit, Python, platform, torch, CUDA and cuDNN, the device(s),
    threads and the packages results depend on: what each run records in env.json.
    """
    from perencode.common.device import resolve_device
    from perencode.store.environment import format_report, report

    found = report(resolve_device(device))
    print(json.dumps(found, indent=2) if as_json else format_report(found))


@app.command()
@user_errors
def doctor(
    device: Annotated[str, device_option(DEVICE_HELP + " The device checks run on a CUDA "
                                         "device only.")] = defaults.DEVICE,
    runs: Annotated[Path, typer.Option(
        "--runs", help="Where the speed check caches its timings for `sweep --dry-run` "
        "(.estimates.json).")] = defaults.RUNS,
) -> None:
    """Is this package right and fast on this machine? Checks in about two minutes on a GPU.

    The stack, then, against the CPU: equivalence of a few training steps of each model,
    determinism, resume across devices, the memory estimate and the speed of the Fig. 2 GRU
    step with the device-hours of each paper grid. One row per check; exit 1 if one fails.
    """
    from perencode.commands.doctor import FAIL, INFO, PASS
    from perencode.commands.doctor import doctor as run_doctor
    from perencode.common.device import resolve_device

    rows, seconds = run_doctor(resolve_device(device), runs,
                               say=lambda step: console.print(f"doctor: {step}",
                                                              highlight=False))
    table = Table(title="perencode doctor")
    for column in ("check", "measured", "expected", "verdict"):
        table.add_column(column, overflow="fold")
    colour = {PASS: "green", FAIL: "bold red", INFO: "cyan"}
    for row in rows:
        table.add_row(escape(row.name), escape(row.measured), escape(row.expected),
                      f"[{colour.get(row.verdict, 'yellow')}]{escape(row.verdict)}[/]")
    console.print(table)
    failed = sum(row.failed for row in rows)
    console.print(f"doctor: {failed} failed, {sum(r.verdict == PASS for r in rows)} passed, "
                  f"{sum(r.verdict.startswith('not run') for r in rows)} not run "
                  f"({seconds:.0f} s)", highlight=False)
    raise typer.Exit(1 if failed else 0)


@app.command()
@user_errors
def stability(
    run_dir: Annotated[Path, typer.Argument(help="A run of the dual-frequency task (task.name "
                                                "= \"dual_frequency\"), GRU, LSTM or S4D.")],
    triplets: Annotated[int, typer.Option(
        "--triplets", min=4, help="Triplets (x,s),(x,s'),(x',s) per checkpoint, drawn from the "
        "run's seed (the same at every checkpoint); a multiple of 4, a quarter per target x "
        "disturbant condition (FREQUENT/RARE).")] = defaults.STABILITY_TRIPLETS,
    metric: Annotated[str, typer.Option(
        "--metric", help="Which metric fills the `stability` column (all four are written as "
        "stability_<name>): weighted (the authors' code; Fig. 5, inferred), printed (Eq. 3-4 "
        "as printed, not normalised), mean (unweighted mean row cosine) or frobenius (cosine "
        "of the flattened Jacobians).")] = defaults.STABILITY_METRIC,
    device: Device = defaults.DEVICE,
    every: Annotated[int, typer.Option(
        "--every", min=1, help="Analyse every N-th checkpoint: the 1st, (N+1)-th, (2N+1)-th, "
        "...")] = defaults.STABILITY_EVERY,
    batch: Annotated[int, typer.Option(
        "--batch", min=1, help="Triplets differentiated at once; peak memory grows linearly "
        "with it (docs/stability.md).")] = defaults.STABILITY_BATCH,
    progress: Progress = True,
    accept_code_change: AcceptCode = False,
    accept_data_change: AcceptData = False,
) -> None:
    """Gradient stability at every checkpoint of a dual-frequency run (Fig. 4-5).

    The metric: docs/paper-facts.md#gradient-stability.
    Writes RUN_DIR/stability.csv: one row per checkpoint, triplet and comparison.
    "target" = (x,s) vs (x,s'), as drawn in Fig. 5; "suffix" = (x,s) vs (x',s).
    Checkpoints already in the file are skipped: an interrupted analysis resumes,
    a finished one is left as it is.
    """
    from perencode.commands.stability import analyse_run

    analyse_run(run_dir, triplets=triplets, metric=metric, device=device, every=every,
                batch=batch, progress=progress, accept_code_change=accept_code_change,
                accept_data_change=accept_data_change)  # it says what it wrote or kept


@app.command("lm-prepare")
@user_errors
def lm_prepare(
    source: Annotated[str | None, typer.Option(
        "--source", help="A folder with wiki.train.raw, wiki.valid.raw and wiki.test.raw, a "
        "`datasets` dataset saved to disk, or a Hugging Face dataset name.",
        show_default=defaults.LM_SOURCE)] = None,
    out: Annotated[Path, out_folder()] = defaults.LM_DATA,
    vocab_size: Annotated[int, typer.Option("--vocab-size", min=16,
                                            help="SentencePiece unigram vocabulary.")
                          ] = defaults.LM_VOCAB_SIZE,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1,
                                            help="Input tokens kept per paragraph.")
                          ] = defaults.LM_MAX_TOKENS,
    threads: Annotated[int, typer.Option(
        "--threads", min=0, help="SentencePiece's training and encoding threads (0: the cores "
        "this process may use; the authors' run used 16).")] = defaults.LM_THREADS,
    force: Annotated[bool, force_flag("Skip the memory check (SentencePiece needs about 20 "
                                      "times the training text's size).")] = False,
    sample_sentences: Annotated[int, typer.Option(
        "--sample", min=0, help="Train the vocabulary on this many random paragraphs (0: all, "
        "as the authors did; a sample departs from their vocabulary but needs less memory).")
    ] = defaults.LM_SAMPLE,
    progress: Annotated[bool, progress_option("Show progress.")] = True,
) -> None:
    """Prepare WikiText-103 for language modelling: clean, train SentencePiece, encode."""
    from perencode.commands.lm_prepare import prepare

    try:
        manifest = prepare(source=source, out=out, vocab_size=vocab_size,
                           max_tokens=max_tokens, threads=threads, progress=progress,
                           force=force, sample_sentences=sample_sentences)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM / SIGHUP (prepare.Stopped)
        console.print(f"interrupted; the unfinished build was removed ({out} is as it was)")
        raise typer.Exit(128 + getattr(exc, "signum", 2)) from None
    results.print(f"prepared {out} ({manifest.get('status', 'done')})")


@app.command()
@user_errors
def sweep(
    grid: Annotated[Path, typer.Argument(help="Grid file, e.g. recipes/paper/fig02_gru_reverse"
                                              ".toml, or a recipe with --axis.")],
    axes: sweep_options.Axes = None,
    tag: sweep_options.Tag = None,
    runs: RunsRoot = None,
    old_out: OldOut = None,
    executor: sweep_options.ExecutorName = defaults.SWEEP_EXECUTOR,
    jobs: sweep_options.Jobs = defaults.SWEEP_JOBS,
    runs_per_gpu: sweep_options.RunsPerGpu = defaults.SWEEP_RUNS_PER_GPU,
    dry_run: sweep_options.DryRun = False,
    explain: sweep_options.Explain = False,
    estimate: sweep_options.Estimate = False,
    wait: sweep_options.Wait = True,
    only: sweep_options.Only = None,
    overrides: Overrides = None,
    device: Device = defaults.DEVICE,
    partition: sweep_options.Partition = None,
    time_min: sweep_options.TimeMin = None,
    gpus_per_job: sweep_options.GpusPerJob = None,
    cpus_per_job: sweep_options.CpusPerJob = None,
    slurm_options: sweep_options.SlurmFields = None,
    tensorboard: sweep_options.Tensorboard = False,
    progress: LiveTable = True,
) -> None:
    """Run every cell of a grid (skipping finished runs, resuming interrupted ones)."""
    from perencode.commands.sweep.run import run_sweep
    from perencode.config.grid import slurm_overrides

    guard_output()
    slurm = {k: v for k, v in (("partition", partition), ("time_min", time_min),
                               ("gpus_per_job", gpus_per_job),
                               ("cpus_per_job", cpus_per_job)) if v is not None}
    slurm.update(slurm_overrides(slurm_options or []))
    runs = renamed(runs, old_out, "--runs", "--out") or defaults.RUNS
    options = sweep_options.SweepOptions(
        executor=executor, jobs=jobs, runs_per_gpu=runs_per_gpu, device=device,
        only=only or [], overrides=overrides or [], axes=axes or [], tag=tag, slurm=slurm,
        dry_run=dry_run, explain=explain, estimate=estimate, tensorboard=tensorboard,
        progress=progress, wait=wait)
    code = run_sweep(grid, out=runs, options=options)
    raise typer.Exit(code)


@app.command()
@user_errors
def quickstart(
    device: Annotated[str, device_option(
        "auto: the GPU demo at the paper's shapes where a CUDA device is present, else the CPU "
        "demo; cpu or cuda to choose.")] = defaults.DEVICE,
    runs: RunsRoot = None,
    out: Annotated[Path | None, out_folder("the figures and the claims report",
                                           show_default=str(defaults.FIGURES))] = None,
    old_figures: Annotated[Path | None, typer.Option("--figures", hidden=True)] = None,
    jobs: Annotated[int | None, typer.Option("--jobs", min=1, help="Runs at once.",
                                             show_default="2 on the CPU, 6 sharing the GPU")
                    ] = None,
    progress: LiveTable = True,
) -> None:
    """The paper's headline effect in about 15 minutes: sweep, figures, claims."""
    from perencode.quickstart import quickstart as run_quickstart

    if old_figures is not None:  # the old spelling `[--out RUNS] --figures FIGURES`
        if runs is not None:
            raise UserError("--figures is the old spelling of --out; use --runs and --out")
        runs, out = out, renamed(None, old_figures, "--out (and the old --out is --runs)",
                                 "--figures")
    raise typer.Exit(run_quickstart(device, runs or defaults.RUNS, out or defaults.FIGURES,
                                    jobs, progress))


@app.command()
@user_errors
def figures(
    runs: RunPaths,
    out: Annotated[Path, out_folder()] = defaults.FIGURES,
    accept_code_change: AcceptCode = False,
) -> None:
    """Collect results into results.csv and draw every paper figure they cover."""
    from perencode.commands.figures import make_figures

    written = make_figures(runs, out=out, accept_code_change=accept_code_change)
    for path in written:
        results.print(f"wrote {path}")


@app.command()
@user_errors
def prune(
    runs: RunPaths,
    dry_run: Annotated[bool, dry_run_flag("Say what would be deleted and kept; delete "
                                          "nothing.")] = False,
    without_stability: Annotated[bool, typer.Option(
        "--without-stability", help="Also delete the checkpoints of dual-frequency runs that "
        "stability.csv does not cover yet (their gradient stability can then not be "
        "computed).")] = False,
) -> None:
    """Free the space of finished runs: delete their checkpoints, keep what others read.

    Every file figures, verify and report read is kept. Unfinished and diverged runs are
    left as they are.
    """
    from perencode.commands.prune import KEPT
    from perencode.commands.prune import prune as run_prune

    done = run_prune(runs, dry_run=dry_run, without_stability=without_stability)
    for found in done:
        results.print(found.line(dry_run), highlight=False, soft_wrap=True)
    freed = sum(found.size for found in done)
    pruned = sum(bool(found.deleted) for found in done)
    results.print(f"{'would free' if dry_run else 'freed'} {freed / 2**20:.1f} MB in {pruned} "
                  f"of {len(done)} run(s). Kept, where present: "
                  + "; ".join(f"{name}: {why}" for name, why in KEPT.items()),
                  highlight=False, soft_wrap=True)


@app.command()
@user_errors
def verify(
    runs: RunPaths,
    claims: Claims = defaults.CLAIMS,
    out: Annotated[Path | None, out_folder(
        "verify.md and verify.json", show_default=f"{defaults.FIGURES}, or "
        f"{defaults.FIGURES}/<name> for a claims file <name>.toml not bundled")] = None,
    report_only: Annotated[bool, typer.Option(
        "--report-only", help="Exit 0 whatever the verdicts (errors still exit 2): runs too "
        "small to decide, as in `make rehearsal`.")] = False,
    as_json: Annotated[bool, json_flag("Print verify.json (every field of every claim) on "
                                       "stdout instead of the tables.")] = False,
    accept_code_change: AcceptCode = False,
    plan: Annotated[Path | None, typer.Option(
        "--plan", help="A plan.json of `perencode plan --budget --write`: the claims it left "
        "out are shown as not run (outside the plan).")] = None,
) -> None:
    """Check the paper's claims against the runs; exit 1 if an evaluated claim fails."""
    from perencode.commands.verify import verify_runs

    code = verify_runs(runs, claims=claims, out=out, as_json=as_json,
                       accept_code_change=accept_code_change, plan=plan)
    raise typer.Exit(0 if report_only else code)


@app.command("plan")
@user_errors
def plan_(
    grids: Annotated[list[Path], typer.Argument(help="Grid files, or folders of them: "
                                                     "recipes/paper is the whole paper.")],
    claims: Claims = defaults.CLAIMS,
    gpu: Annotated[str | None, typer.Option(
        "--gpu", help="The GPU the jobs will get: a100 (80 GB), a100-40gb, h100, l40s, v100, "
        "rtx4090 (default: the GPU present; never this machine's CPU).")] = None,
    budget: Annotated[float | None, typer.Option(
        "--budget", metavar="HOURS", help="GPU-hours to spend: the claims, headline first, "
        "whose cells fit, and those left out.")] = None,
    seeds: Annotated[int | None, typer.Option(
        "--seeds", help="--budget: seeds a cell (default: the grid's, the paper's five).")
    ] = None,
    effect: Annotated[float | None, typer.Option(
        "--effect", metavar="SD", help="--budget: the effect each claim is to be decided at, "
        "in standard deviations of the seeds: each claim gets the seeds a one-sided Welch t at "
        "95% needs for 80% power.")] = None,
    write: Annotated[Path | None, typer.Option(
        "--write", metavar="DIR", help="--budget: write the plan's grid files (for `perencode "
        "sweep`) and plan.json (for `verify --plan`) into DIR.")] = None,
    executor: Annotated[str, typer.Option(
        "--executor", help="local or slurm: the wall time, or the SLURM jobs, time limits and "
        "requeues.")] = "local",
    gpus: Annotated[int, typer.Option("--gpus", min=1,
                                      help="GPUs the local executor has.")] = 1,
    runs_per_gpu: sweep_options.RunsPerGpu = defaults.SWEEP_RUNS_PER_GPU,
    slurm_options: Annotated[list[str] | None, typer.Option(
        "--slurm", metavar="KEY=VALUE", help="Any field of the grids' \\[slurm] tables, e.g. "
        "--slurm time_min=720. Repeatable.")] = None,
    runs: RunsRoot = None,
    observed: Annotated[list[Path] | None, typer.Option(
        "--observed", metavar="RUNS", help="--budget: finished runs whose effect sizes and "
        "spreads set the seeds each claim needs (others: --effect or --seeds). Repeatable.")
    ] = None,
    order: Annotated[str, typer.Option(
        "--order", help="--budget: priority (the claims file's priority, Fig. 2 first, then "
        "the claims decided per GPU-hour) or file (the claims file's order, yours).")
    ] = "priority",
    stages: Annotated[int, typer.Option(
        "--stages", help="--budget: 1 (one look) or 2 (this plan is a first stage; `verify "
        "--plan` spends alpha across the looks, Lan-DeMets Pocock-type).")] = 1,
    top_up: Annotated[Path | None, typer.Option(
        "--top-up", metavar="PLAN", help="--budget: the plan.json of a first stage (--stages "
        "2) whose runs --observed gives: its claims decided at the first look are settled, "
        "the rest planned again from their observed effects at the second look.")] = None,
    as_json: Annotated[bool, json_flag("Print the plan as JSON.")] = False,
) -> None:
    """What grids cost in GPU-hours on a GPU, and which claims a budget decides."""
    from perencode.commands.plan import plan
    from perencode.config.grid import slurm_overrides

    plan(grids, gpu, claims=claims, budget=budget, seeds=seeds, effect=effect,
         executor=executor, gpus=gpus, runs_per_gpu=runs_per_gpu,
         slurm=slurm_overrides(slurm_options or []), runs_root=runs or defaults.RUNS,
         write=write, as_json=as_json, observed=observed or [], order=order, stages=stages,
         top_up=top_up)


@app.command()
@user_errors
def crosscheck(
    authors_repo: Annotated[Path, typer.Argument(
        help="A clone of the authors' repository (github.com/tkc-morita/position-encoded_rnn; "
        "this check was written against commit 3e98213). It is your own download: its "
        "modules are imported from there while the command runs, and nothing of it is "
        "copied.")],
    out: Annotated[Path, out_folder("crosscheck.md and crosscheck.json")] = Path(
        "crosscheck"),
    train: Annotated[bool, typer.Option(
        "--train", help="Also train both implementations (SEEDS seeds each) and compare their "
        "held-out accuracies by an equivalence test (TOST): equivalent, different, or "
        "undecided with the seeds needed; the time is measured on the first seed.")] = False,
    margin: Annotated[float | None, typer.Option(
        "--margin", help="--train's equivalence margin: the largest difference of mean "
        "held-out token accuracies taken as equivalent (default: the shape's, printed).")
    ] = None,
    train_shape: Annotated[str, typer.Option(
        "--train-shape", help="cpu (small, minutes on a laptop) or paper (E = H = 512, L = 64, "
        "batch 512, K = 256; for a GPU).")] = defaults.CROSSCHECK_SHAPE,
    seeds: Annotated[int, typer.Option("--seeds", min=2,
                                       help="Seeds per implementation for --train.")
                     ] = defaults.CROSSCHECK_SEEDS,
    iterations: Annotated[int | None, typer.Option(
        "--iterations", min=1, help="Training iterations for --train (default: the shape's, "
        "1,000 on cpu, 2,000 for paper).")] = None,
    device: Annotated[str, device_option(DEVICE_HELP.rstrip(".") + " (--train only).")
                      ] = defaults.DEVICE,
    progress: Annotated[bool, progress_option("Show progress lines.")] = True,
    as_json: Annotated[bool, json_flag("Also print crosscheck.json (every check, its numbers "
                                       "and verdict) on stdout.")] = False,
) -> None:
    """Check perencode against the authors' own code on identical inputs and weights.

    Encodings, schedule, tasks and scoring, forward logits, Adam steps, gradient stability
    (REPRODUCE.md, "Check the implementation against the authors' code"). Exit 1 if a
    check disagrees, 3 if a central one (schedule, Adam, loop, chunked loss, resume) could
    not run: pip install --no-deps timm==0.9.12; another commit than 3e98213 is checked
    too, with a warning.
    """
    from perencode.commands.crosscheck import run_crosscheck

    code = run_crosscheck(authors_repo, out, train=train, train_shape=train_shape, seeds=seeds,
                          iterations=iterations, device=device, progress=progress,
                          margin=margin)
    if as_json:  # the file it has just written: one record, two readers
        print((out / "crosscheck.json").read_text(encoding="utf-8"), flush=True)
    raise typer.Exit(code)


@app.command()
@user_errors
def report(
    runs: RunPaths,
    claims: Claims = defaults.CLAIMS,
    out: Annotated[Path, out_folder("the figures and report.html")] = defaults.FIGURES,
    accept_code_change: AcceptCode = False,
    title: Annotated[str | None, typer.Option(
        "--title", help="The page's heading, for a study of one's own.",
        show_default="the paper's reproduction report")] = None,
) -> None:
    """Draw the figures and write report.html, one offline page.

    Each figure with its claims' verdicts and the runs behind it, and why the other claims
    were not run.
    """
    from perencode.commands.report import make_report

    page = make_report(runs, claims=claims, out=out, accept_code_change=accept_code_change,
                       title=title)
    results.print(f"wrote {page}")


rehearsal_app = _App(no_args_is_help=True, help="The reviewer's path at CPU size "
                            "(`make rehearsal`): its corpus and its final check.")
app.add_typer(rehearsal_app, name="rehearsal")


@rehearsal_app.command("corpus")
@user_errors
def rehearsal_corpus(
    folder: Annotated[Path, typer.Argument(help="Where wiki.{train,valid,test}.raw go.")],
    seed: Annotated[int, typer.Option("--seed",
                                      help="Seed of the made-up words and paragraphs.")] = 0,
) -> None:
    """Write a small WikiText-103-shaped raw corpus (for `lm-prepare --source`)."""

    from perencode.commands.rehearsal import write_corpus

    written = write_corpus(folder, seed)
    results.print(f"wrote {folder}: " + ", ".join(f"{split} {len(w['paragraphs'])} paragraphs"
                                                  for split, w in written.items()))


@rehearsal_app.command("check")
@user_errors
def rehearsal_check(
    figures_dir: Annotated[Path, typer.Argument(help="The folder `figures` and `verify` "
                                                     "wrote.")],
    claims: Claims = defaults.CLAIMS,
    verdicts: Annotated[Path | None, typer.Option(
        "--verdicts", help="verify.json of the rehearsal's own claims (`verify RUNS --claims "
        "rehearsal`): every verdict path must be decided there, pass or fail.")] = None,
    plan: Annotated[Path | None, typer.Option(
        "--plan", help="The plan.json of a rehearsed plan: the verdict paths required are "
        "those of the claims it decides.")] = None,
) -> None:
    """Check that every claim was decided or reported, every figure drawn, and (--verdicts)
    every verdict path decided by the rehearsal's claims."""

    from perencode.commands.rehearsal import check_outputs, check_paths, required_paths

    lines = check_outputs(figures_dir, claims, plan)
    if verdicts is not None:
        lines += check_paths(verdicts, required_paths(plan, claims), both=plan is None)
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)
    results.print(f"rehearsal check passed: {figures_dir}")


@app.command("tensorboard")
@user_errors
def tensorboard_(
    runs: Annotated[list[Path], typer.Argument(help="Run directories or folders holding them "
                                                    "(a sweep's root shows all its runs).")],
    port: Annotated[int, typer.Option("--port", help="Port TensorBoard serves on.")
                    ] = defaults.TENSORBOARD_PORT,
    dry_run: Annotated[bool, dry_run_flag("Print the tensorboard command, start nothing.")
                       ] = False,
) -> None:
    """Start TensorBoard on runs side by side, whether or not trained with --tensorboard.

    A run trained without it is shown from its metrics.jsonl (event files written to
    RUN_DIR/tensorboard-from-metrics). Each run is named by its path below the folder the
    runs share: a sweep's axis values and seed. Stop it with Ctrl-C.
    """
    from perencode.store.runs import find_runs
    from perencode.training.tensorboard import launch, tensorboard_command

    command = tensorboard_command(find_runs(runs), port)
    if dry_run:
        print(shlex.join(command))
        return
    raise typer.Exit(launch(command))
