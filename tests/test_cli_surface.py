"""What the command line shows a new user: every `--help` in plain words (no typer
placeholders, no old flag names), and the one-line answers of the commands to the mistakes
and questions a first session runs into."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer.main
from conftest import ROOT, tiny_toml
from fake_runs import fake_run
from typer.testing import CliRunner

from perencode.cli import app
from perencode.commands.sweep.board import Board
from perencode.commands.sweep.cells import RunState
from perencode.config.recipe import tomllib

# Old spellings that still work (hidden) but must not be advertised, per command.
OLD_FLAGS = {"train": ["--out"], "sweep": ["--out"], "quickstart": ["--figures"]}


def _every_command(group=None, path=()) -> list[tuple[str, ...]]:
    """The path of every command and group, subcommands included: ("rehearsal", "check")."""
    group = group or typer.main.get_command(app)
    found = [path]
    for name, command in getattr(group, "commands", {}).items():
        found += _every_command(command, (*path, name))
    return found


def _help(*path: str) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], prog_name="perencode",
                                env={"COLUMNS": "200"}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("path", _every_command(), ids=lambda p: " ".join(p) or "perencode")
def test_every_help_is_plain(path):
    text = _help(*path)
    assert "Usage: perencode" in text
    assert "<bool>" not in text and "<list[" not in text, text
    assert not re.search(r"\{\w+\}", text), text  # typer's `{recipe}` placeholder
    for flag in OLD_FLAGS.get(path[-1] if path else "", []):
        assert not re.search(rf"{flag}\b", text), (path, flag)


def test_usage_names_arguments_as_click_does():
    def usage(*path):
        return next(line.strip() for line in _help(*path).splitlines() if "Usage:" in line)

    assert usage("train") == "Usage: perencode train [OPTIONS] RECIPE"
    assert usage("figures") == "Usage: perencode figures [OPTIONS] RUNS..."
    assert usage("rehearsal", "check") == "Usage: perencode rehearsal check [OPTIONS] FIGURES_DIR"
    assert "<path>..." in _help("figures")


def test_messages_and_docs_name_the_current_flags(cli, tmp_path):
    other = fake_run(tmp_path, "other", vocab=32)  # a run of another recipe
    code, text = cli("train", ROOT / "recipes/gru_vocab256.toml", "--run-dir", other,
                     "--device", "cpu")
    assert code == 2 and "holds a run of a different recipe" in text
    assert "choose another --run-dir" in " ".join(text.split())
    # Prose and examples: `train`/`sweep` take --run-dir/--runs; --out is their old spelling.
    for doc in [ROOT / "README.md", ROOT / "REPRODUCE.md", *(ROOT / "docs").glob("*.md"),
                *(ROOT / "recipes").rglob("*.toml")]:
        for line in doc.read_text(encoding="utf-8").splitlines():
            if "older spellings" in line:
                continue
            assert not re.search(r"perencode (train|sweep)\b[^`]*--out\b", line), (doc, line)
            assert "same `--out`" not in line and "another `--out`" not in line, (doc, line)
            assert not line.startswith("# --out are linked"), (doc, line)
    for module in (ROOT / "perencode").rglob("*.py"):
        text = module.read_text(encoding="utf-8")
        assert "choose another --out" not in text or module.name == "lm_prepare.py", module
        assert "sweep into another --out" not in text, module


def test_training_a_grid_says_to_sweep_it(cli):
    grid = ROOT / "recipes/paper/fig02_gru_reverse.toml"
    code, text = cli("train", grid)
    assert code == 2
    assert " ".join(text.split()) == (f"error: {grid}: this is a grid (it has base, grid, "
                                      f"slurm), not a recipe: run its cells with `perencode "
                                      f"sweep {grid}`")


def test_recipe_schema_types_are_readable(cli):
    code, text = cli("recipe-schema")
    assert code == 0
    assert "<class" not in text and "typing." not in text and "NoneType" not in text
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:3]
            for line in text.splitlines()[2:]}
    assert rows["train.keep_checkpoints"] == ["int \\| 'all' \\| unset", "unset"]
    assert rows["optim.betas"] == ["[float, float]", "[0.9, 0.98]"]
    assert rows["task.min_length"] == ["int \\| unset", "unset"]


def test_two_betas_are_asked_for_in_one_line(cli):
    code, text = cli("show", ROOT / "recipes/gru_vocab256.toml", "--set", "optim.betas=[0.9]")
    assert code == 2
    assert "optim.betas: expects two numbers [beta1, beta2], e.g. [0.9, 0.98] (got [0.9])" \
        in " ".join(text.split())
    assert "Field required" not in text and "betas.1" not in text


def test_show_shows_every_field(cli):
    recipe = ROOT / "recipes/gru_vocab256.toml"
    code, text = cli("show", recipe)
    assert code == 0
    assert "# keep_checkpoints = unset" in text.split("[train]", 1)[1]
    assert "keep_checkpoints" not in tomllib.loads(text)["train"]  # still valid TOML
    code, text = cli("show", recipe, "--json")
    assert code == 0 and json.loads(text)["train"]["keep_checkpoints"] is None


def _logged_run(root: Path, name: str, events: bool) -> Path:
    run = fake_run(root, name, metrics={"token_accuracy": 0.5, "dl_distance": 1.0})
    if events:
        (run / "tensorboard").mkdir()
        (run / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"")
    return run


def test_tensorboard_dry_run_shows_runs_without_events_from_their_metrics(cli, tmp_path):
    _logged_run(tmp_path / "runs", "a", events=True)
    _logged_run(tmp_path / "runs", "b", events=False)
    (tmp_path / "runs" / "c").mkdir()
    (tmp_path / "runs" / "c" / "recipe.toml").write_text(
        (tmp_path / "runs" / "b" / "recipe.toml").read_text())  # claimed, no step logged
    code, text = cli("tensorboard", tmp_path / "runs", "--dry-run")
    text = " ".join(text.split())
    assert code == 0, text
    assert "2 of 3 runs shown; 1 from their metrics.jsonl" in text
    assert "1 left out (no step logged yet)" in text
    assert "a:" in text and "/runs/a/tensorboard " in text.replace(",", " ")
    assert "/runs/b/tensorboard-from-metrics" in text and "/runs/c/" not in text


def test_tensorboard_without_any_logged_step_is_an_error(cli, tmp_path):
    run = _logged_run(tmp_path / "runs", "a", events=False)
    (run / "metrics.jsonl").unlink()
    code, text = cli("tensorboard", tmp_path / "runs", "--dry-run")
    assert code == 2
    assert "none of the 1 run(s) has logged a training step yet" in " ".join(text.split())


TINY_GRID = tiny_toml(grid={"task.vocab_size": [128, 256, 32, 64]})


def test_sweep_dry_run_of_a_tiny_grid_prints_real_units(cli, tmp_path):
    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY_GRID)
    code, text = cli("sweep", grid, "--runs", tmp_path / "runs", "--dry-run", "--device", "cpu")
    text = " ".join(text.split())
    assert code == 0, text
    assert "0 PFLOP" not in text and not re.search(r"SXM, the paper's GPU: [\d.]+ \(", text)
    assert re.search(r"4 to train; \d[\d.]* (MFLOP|GFLOP) of training", text), text
    assert re.search(r"the paper's GPU: [\d.e-]+ (s|min) modelled", text), text


def test_axis_values_are_listed_in_numeric_order(cli, tmp_path):
    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY_GRID)
    code, text = cli("sweep", grid, "--runs", tmp_path / "runs", "--dry-run",
                     "--only", "vocab_size=48")
    assert code == 2
    assert "(values: 32, 64, 128, 256)" in " ".join(text.split())


def test_the_board_shows_the_sweeps_elapsed_time_and_eta():
    def run(state, step, iterations=100):
        return SimpleNamespace(state=state, step=step, iterations=iterations)

    runs = [run(RunState.DONE, 100), run(RunState.RUNNING, 0), run(RunState.NEW, 0),
            run(RunState.FAILED, 10)]
    board = Board("tiny", runs, enabled=False)
    assert board.overall(now=board._t0 + 5) == \
        "elapsed 0m05s, ETA unknown until a run logs its first steps"
    runs[1].step = 50  # 50 iterations in 100 s; 150 left (the failed run's are not)
    assert board.overall(now=board._t0 + 100) == "elapsed 1m40s, ETA 5m00s"
    runs[1].state, runs[1].step, runs[2].state, runs[2].step = RunState.DONE, 100, \
        RunState.DONE, 100
    assert board.overall(now=board._t0 + 400) == "elapsed 6m40s, ETA 0m00s"


def test_the_license_is_an_spdx_string_setuptools_takes_without_a_warning():
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert [str(w.message) for w in caught] == []
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["license"] == "MIT"
    # PEP 639 strings need setuptools 77; the py3.10 / torch 2.1.1 pins must build with it.
    assert "setuptools>=77" in pyproject["build-system"]["requires"]
    pins = (ROOT / "constraints/py310-torch2.1.1.txt").read_text(encoding="utf-8")
    version = re.search(r"^setuptools==(\d+)", pins, flags=re.M)
    assert version and int(version.group(1)) >= 77


# Each default the CLI shows, and the library function's it passes it to: one value.
CLI_DEFAULTS = [
    ("stability", "perencode.commands.stability:analyse_run", "triplets metric device every batch"),
    ("lm-prepare", "perencode.commands.lm_prepare:prepare",
     "out vocab_size max_tokens threads sample_sentences"),
    ("bench", "perencode.commands.bench:bench", "iterations warmup"),
    ("bench", "perencode.commands.bench:sampling", "iterations warmup"),
    ("crosscheck", "perencode.commands.crosscheck:run_crosscheck", "train_shape seeds device"),
    ("tensorboard", "perencode.training.tensorboard:tensorboard_command", "port"),
    ("sweep", "perencode.commands.sweep.options:SweepOptions", "executor jobs runs_per_gpu device"),
    ("eval", "perencode.commands.evaluate:evaluate_run", "device"),
    ("quickstart", "perencode.quickstart:start", "device"),
    ("doctor", "perencode.commands.doctor:doctor", "runs=runs_root"),
    ("figures", "perencode.commands.figures:make_figures", "out"),
    ("verify", "perencode.commands.verify:verify_runs", "claims out"),
    ("report", "perencode.commands.report:make_report", "claims out"),
]


@pytest.mark.parametrize("command,function,options", CLI_DEFAULTS,
                         ids=[f"{c}-{f.split(':')[1]}" for c, f, _ in CLI_DEFAULTS])
def test_the_cli_shows_the_library_functions_defaults(command, function, options):
    import importlib
    import inspect

    module, name = function.split(":")
    parameters = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    shown = {p.name: p.default for p in group.commands[command].params}
    pairs = [option.partition("=")[::2] for option in options.split()]  # CLI name=library's
    assert {cli: shown[cli] for cli, _ in pairs} == \
        {cli: parameters[lib or cli].default for cli, lib in pairs}


def test_an_unknown_executor_is_named_with_the_known_ones(cli, tmp_path):
    code, text = cli("sweep", ROOT / "recipes/quick/quickstart.toml", "--executor", "ray",
                     "--runs", tmp_path)
    assert code == 2 and "--executor 'ray': expected local or slurm" in text
