"""What a sweep, the help pages and the doctor print (issue 39, point 8): Ctrl-C ends a
sweep with one line saying what stopped and how to resume; cells a stopped sweep never
began plan as new; a conflict names the field; a dry run that finds conflicts exits 2;
run names are whole off a terminal; help is wrapped once; the doctor's own runs print
nothing. Ctrl-C is a real SIGINT to a real `python -m perencode sweep`."""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import forked
import pytest
import typer.main
from conftest import PYTHON, fork_perencode_commands, run_cli, subprocess_env, tiny_toml
from conftest import flat as _flat
from typer.testing import CliRunner

from perencode.cli import app
from perencode.commands import doctor
from perencode.commands.sweep.cells import RunState, plan, prepare
from perencode.config.grid import load_grid
from perencode.store import runs

pytestmark = pytest.mark.forked_children  # the sweep's children as forks (tests/forked.py)

CELLS = ["vocab_size=8/encoding=sinusoidal/seed=111", "vocab_size=8/encoding=sinusoidal/seed=222"]


def _grid(tmp_path: Path, iterations: int = 10) -> Path:
    path = tmp_path / "g.toml"
    path.write_text(tiny_toml(optim={"lr": 1e-2, "warmup": 2},
                              train={"iterations": iterations, "checkpoint_every": iterations,
                                     "log_every": 10},
                              grid={"task.vocab_size": [8], "encoding.kind": ["sinusoidal"],
                                    "train.seed": [111, 222]}))
    return path


def _piped(*args) -> subprocess.CompletedProcess:
    """`perencode ARGS` with stdout and stderr a pipe and no COLUMNS: as in a log."""
    env = {k: v for k, v in subprocess_env().items() if k != "COLUMNS"}
    return forked.run([*args], env=env, timeout=240)  # a fork of this process: tests/forked.py


def _ctrl_c_as_in_a_terminal():
    """A child of a non-interactive shell's background job ignores SIGINT (and Python then
    installs no KeyboardInterrupt handler): give it a terminal's default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_ends_a_sweep_with_one_line_and_the_cells_it_never_began_stay_new(tmp_path):
    grid = _grid(tmp_path, iterations=1_000_000)
    out = tmp_path / "runs"
    sweep = subprocess.Popen([PYTHON, "-m", "perencode", "sweep", str(grid), "--runs", str(out),
                              "--jobs", "1", "--device", "cpu", "--no-progress"],
                             env=subprocess_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True,
                             preexec_fn=_ctrl_c_as_in_a_terminal)
    first = out / "g" / CELLS[0]
    t0 = time.time()
    while not (first / "metrics.jsonl").exists() or not runs.Run(first).metrics():
        assert sweep.poll() is None, sweep.communicate()
        assert time.time() - t0 < 120
        time.sleep(0.05)
    os.killpg(sweep.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
    output, _ = sweep.communicate(timeout=60)
    assert sweep.returncode == 130, output
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.startswith("interrupted:")]
    assert len(lines) == 1, output
    logged = runs.Run(first).metrics()[-1].step
    assert re.fullmatch(rf"interrupted: 1 run\(s\) stopped with a checkpoint \({CELLS[0]} at "
                        rf"iteration \d+\); 1 not started; 0 of 2 finished\. Run the same "
                        r"command again to resume \(finished runs are skipped\)\.",
                        lines[0]), lines
    at = re.search(r"at iteration (\d+)", lines[0])
    saved = runs.load_checkpoint(first / "checkpoints/resume.pt")["iteration"]
    # the checkpoint it resumes from, as the worker says, not its last logged step
    assert at and int(at[1]) == saved >= logged, (saved, logged)
    assert f"interrupted at iteration {saved}" in (first / "train.log").read_text()
    # The never-started cell is not listed as a problem ("new: DIR: "), only counted.
    assert not [line for line in output.splitlines() if line.startswith(("new:", "partial:"))]
    assert (first / "checkpoints/resume.pt").exists()
    # The next sweep's plan: the stopped run resumes, the other was never claimed (a cell's
    # directory is written as its run starts).
    states = {r.cell.name: r.state for r in plan(load_grid(grid), out)}
    assert states == {CELLS[0]: RunState.PARTIAL, CELLS[1]: RunState.NEW}
    assert not (out / "g" / CELLS[1]).exists()


def test_a_stopped_run_is_named_at_the_iteration_of_its_checkpoint(tmp_path):
    """A worker stopped at iteration 7 (resume.pt), its last logged row at step 0: the stop
    line names iteration 7, where it resumes; with no resume.pt, its last step-K.pt; with no
    checkpoint, its logged step."""
    from perencode.commands.sweep.board import interrupted_line
    from perencode.commands.sweep.cells import refresh_stopped
    from perencode.store.records import MetricsRow

    planned = plan(load_grid(_grid(tmp_path)), tmp_path / "runs")
    first = planned[0]
    run = runs.Run(first.dir)
    run.claim(first.cell.recipe)
    run.log(MetricsRow(step=0, loss=2.0, accuracy=0.1, lr=0.0, seconds=0.1))
    first.step = 99
    refresh_stopped(first)  # no checkpoint yet: the logged step stands
    assert first.step == 0
    run.checkpoint_dir.mkdir()
    run.checkpoint_path(5).write_bytes(b"")
    refresh_stopped(first)
    assert first.step == 5
    run.save({"iteration": 7, "model": {}}, interrupted=True)
    refresh_stopped(first)
    first.state = RunState.INTERRUPTED
    assert first.step == 7
    assert f"({first.cell.name} at iteration 7); 1 not started" in interrupted_line(planned)


def test_cells_are_claimed_as_they_start_so_a_stopped_sweep_leaves_the_others_free(tmp_path):
    from perencode.commands.sweep.cells import claim
    from perencode.commands.sweep.local import LocalExecutor

    assert LocalExecutor.claims_at_start
    grid = load_grid(_grid(tmp_path))
    out = tmp_path / "runs"
    planned = plan(grid, out)
    ready = prepare(planned, claim_now=False)  # the local executor's way
    assert len(ready) == 2 and not any(r.dir.exists() for r in planned)
    assert claim(ready[0]) and (ready[0].dir / "recipe.toml").exists()  # as it starts
    # The same cells at another learning rate (a re-used tree, no --tag): only the one
    # that was started is in the way.
    other = load_grid(_grid(tmp_path), ["optim.lr=0.02"])
    assert [r.state for r in plan(other, out)] == [RunState.CONFLICT, RunState.NEW]


def test_a_cell_claimed_but_never_trained_plans_as_new(tmp_path):
    grid = load_grid(_grid(tmp_path))
    out = tmp_path / "runs"
    planned = plan(grid, out)
    prepare(planned)  # what a sweep does before its first run starts: recipe.toml written
    assert all((r.dir / "recipe.toml").exists() for r in planned)
    assert [r.state for r in plan(grid, out)] == [RunState.NEW, RunState.NEW]
    (planned[0].dir / "env.json").write_text("{}")  # training began (Run.start)
    assert [r.state for r in plan(grid, out)] == [RunState.PARTIAL, RunState.NEW]


def _conflicting(tmp_path: Path) -> tuple[Path, Path]:
    """A grid whose first cell's directory holds a run of another learning rate."""
    grid = _grid(tmp_path)
    out = tmp_path / "runs"
    cell = load_grid(grid).cells[0]
    other = cell.recipe.model_copy(update={"optim": cell.recipe.optim.model_copy(
        update={"lr": 0.02})})
    runs.Run(out / "g" / cell.name).claim(other)
    return grid, out


def test_a_dry_run_that_finds_a_conflict_names_the_field_and_exits_2(tmp_path):
    grid, out = _conflicting(tmp_path)
    code, text = run_cli("sweep", grid, "--runs", out, "--dry-run", "--device", "cpu")
    flat = _flat(text)
    assert code == 2, text
    assert (f"{CELLS[0]}: holds a run of a different recipe (optim.lr: 0.02 there vs 0.01 in "
            "the grid); move it away or sweep into another --runs") in flat, text
    assert (f"error: 1 of 2 cell(s) conflict with the run already in their directory under "
            f"{out / 'g'} (listed above); the sweep would skip them; to sweep beside them, "
            f"name this sweep with --tag NAME (its runs go to {out / 'g'}@NAME) or give "
            "another --runs") in flat, text
    assert "1 to train" in flat  # the conflicting cell is not counted as one to train
    code, text = run_cli("sweep", grid, "--runs", out, "--dry-run", "--device", "cpu",
                         "--only", "train.seed=222")
    assert code == 0, text  # the other cell alone: no conflict


@pytest.mark.slow
def test_a_sweep_names_the_field_of_a_conflict(tmp_path):
    grid, out = _conflicting(tmp_path)
    done = _piped("sweep", grid, "--runs", out, "--device", "cpu", "--no-progress",
                  "--only", "train.seed=111")
    text = done.stdout + done.stderr
    assert done.returncode == 1, text
    assert (f"conflict: 1 of 1 cell(s) skipped, their directories under {out / 'g'} hold runs "
            f"of another recipe (first: {out / 'g' / CELLS[0]}: holds a run of a different "
            "recipe (optim.lr: 0.02 there vs 0.01 in the grid)") in _flat(text), text
    assert _flat(text).count("conflict: ") == 1 and "--tag NAME" in _flat(text)


@pytest.mark.slow
def test_run_names_are_whole_in_the_tables_printed_off_a_terminal(tmp_path):
    grid, out = _conflicting(tmp_path)
    done = _piped("sweep", grid, "--runs", out, "--dry-run", "--device", "cpu")
    rows = [line for line in done.stderr.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == CELLS, done.stderr
    # The board a sweep ends with (here: one conflict, nothing to train).
    done = _piped("sweep", grid, "--runs", out, "--device", "cpu", "--no-progress",
                  "--only", "train.seed=111")
    rows = [line for line in done.stderr.splitlines() if line.startswith("│")]
    assert [row.split("│")[1].strip() for row in rows] == CELLS[:1], done.stderr


def _commands(group, path=()) -> list[tuple[tuple[str, ...], Any]]:
    found = []
    for name, command in group.commands.items():
        found.append(((*path, name), command))
        if hasattr(command, "commands"):
            found += _commands(command, (*path, name))
    return found


COMMANDS = _commands(typer.main.get_command(app))


@pytest.mark.parametrize("path, command", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_is_wrapped_once_at_80_columns(path, command):
    """Each paragraph of a command's help is one line for rich to wrap, its first paragraph
    whole in the list of commands; at 80 columns every line of the description is as full as
    greedy wrapping makes it (a line ends early only where a paragraph does)."""
    paragraphs = command.help.split("\n\n")
    assert all("\n" not in p for p in paragraphs), command.help
    assert command.short_help == paragraphs[0]
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"},
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    end = next(i for i, line in enumerate(lines) if line.startswith("╭"))
    description = [line.strip() for line in lines[start:end]]
    for line, following in zip(description, description[1:]):
        if line and following:  # within a paragraph: the next word did not fit
            assert len(line) + 1 + len(following.split()[0]) > 78, (line, following)
    assert _flat(" ".join(description)) == _flat(" ".join(paragraphs))


def test_the_command_list_is_not_cut_without_rich():
    env = dict(subprocess_env(), COLUMNS="80", TYPER_USE_RICH="0")
    done = subprocess.run([PYTHON, "-m", "perencode", "--help"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    listing = _flat(done.stdout.partition("Commands:")[2])
    assert "..." not in listing
    for path, command in COMMANDS:
        if len(path) == 1:
            assert _flat(command.short_help) in listing, command.short_help


@pytest.mark.slow  # two CPU doctor checks in child processes (forks: tests/forked.py)
def test_the_doctors_own_runs_print_nothing(capsys, monkeypatch):
    fork_perencode_commands(monkeypatch, doctor)
    cpu = doctor.torch.device("cpu")
    recipe = doctor.small_recipe("gru", "sinusoidal", doctor.CPU_SIZE, iterations=4,
                                 checkpoint_every=2, log_every=1, keep_checkpoints="all")
    rows = doctor.guarded("resume", functools.partial(doctor.resume_check, recipe, cpu, cpu))
    assert [row.verdict for row in rows] == [doctor.PASS], rows
    printed = capsys.readouterr()
    assert printed.out == "" and printed.err == "", printed  # not "RUN: resuming from ..."


@pytest.mark.slow
def test_the_doctor_prints_its_steps_and_its_table_only(doctor_on_the_cpu):
    done, _ = doctor_on_the_cpu  # `perencode doctor --device cpu`, piped
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    stray = [line for line in lines if not (line.startswith(("doctor: ", *"┏┃┡│└"))
                                            or line.strip() == "perencode doctor")]
    assert not stray, done.stderr


class _Recording:
    """An executor of the test's own behind the sweep's interface (sweep.options.Executor):
    it trains nothing, marks each ready run done (or interrupted, when it is to stop) and
    records what it was handed."""

    name, detaches, claims_at_start, finish = "recording", False, False, True
    handed: list[tuple[str, int, str]] = []

    def __init__(self, options, grid, out, slurm) -> None:
        self.jobs, self.device = options.jobs, options.device

    def run(self, ready, planned, board, handed) -> bool:
        for run in ready:
            self.handed.append((run.cell.name, self.jobs, self.device))
            run.state = RunState.DONE if self.finish else RunState.INTERRUPTED
        return self.finish

    def stopped(self, planned) -> str | None:
        return f"recording: stopped with {len(planned)} run(s)"


@pytest.mark.parametrize("finish,code", [(True, 0), (False, 130)])
def test_an_executor_plugs_in_by_the_interface_alone(tmp_path, monkeypatch, finish, code):
    """The sweep asks its executor for everything that differs between executors: a third
    one, registered by name, runs the grid, names the board and closes a stopped sweep."""
    from perencode.commands.sweep import run as sweep

    monkeypatch.setattr(_Recording, "finish", finish)
    monkeypatch.setattr(_Recording, "handed", [])
    monkeypatch.setitem(sweep.EXECUTORS, "recording", _Recording)
    got, output = run_cli("sweep", _grid(tmp_path), "--executor", "recording", "--jobs", 3,
                          "--runs", tmp_path / "runs", "--device", "cpu", "--no-progress")
    assert got == code, output
    assert _Recording.handed == [(cell, 3, "cpu") for cell in CELLS]
    assert "(recording)" in output
    assert ("recording: stopped with 2 run(s)" in output) is not finish
    code, output = run_cli("sweep", _grid(tmp_path), "--executor", "recording", "--no-wait",
                           "--runs", tmp_path / "runs")
    assert code == 2 and "--no-wait: only with --executor slurm" in output


def test_a_sweep_off_a_terminal_says_where_it_is_at_least_every_30_seconds(tmp_path, capsys,
                                                                           monkeypatch):
    from perencode.commands.sweep import board

    planned = plan(load_grid(_grid(tmp_path)), tmp_path / "runs")
    for enabled in (True, False):  # the live table on, or --no-progress
        shown = board.Board("g", planned, enabled)
        shown.update()
        assert "[sweep] elapsed" not in capsys.readouterr().err  # not yet 30 s
        monkeypatch.setattr(board, "SUMMARY_SECONDS", 0.0)
        shown.update()
        assert capsys.readouterr().err.count("[sweep] elapsed") == 1
        monkeypatch.undo()
