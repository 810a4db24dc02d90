"""Grids and sweeps (perencode.commands.sweep): a tiny grid (2 vocabularies x 2 encodings x 2 seeds)
through the local executor, a rerun that skips everything, submitit's local executor,
failures, linked twins, the dry run, then figures and verify on the real runs. Grid files
themselves are tests/test_grid.py."""

from __future__ import annotations

import json
import signal
import threading
import time

import forked
import pandas as pd
import pytest
import torch
from conftest import (
    ROOT,
    assert_scores_consistent,
    fork_perencode_commands,
    subprocess_env,
    tiny_toml,
    unfinish,
)
from matplotlib.image import imread
from typer.testing import CliRunner

import perencode.commands.sweep.estimates as cost_module
import perencode.training.session as session_module
from perencode.cli import app
from perencode.commands.sweep.child import TrainJob
from perencode.commands.sweep.options import SweepOptions
from perencode.commands.sweep.run import run_sweep
from perencode.config.grid import load_grid
from perencode.store import runs
from perencode.training import planning

TINY = tiny_toml(optim={"lr": 1e-2, "warmup": 2}, train={"checkpoint_every": 10})
AXES = """
[grid]
"task.vocab_size" = [8, 16]
"encoding.kind" = ["none", "sinusoidal"]
"train.seed" = [111, 222]
"""
# The children are forks (tests/forked.py) but where the child itself is tested.
pytestmark = pytest.mark.forked_children
CELLS = [f"vocab_size={k}/encoding={e}/seed={s}" for k in (8, 16)
         for e in ("none", "sinusoidal") for s in (111, 222)]


def sweep(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["sweep", *map(str, args), "--device", "cpu",
                                      "--no-progress"], catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    grid = root / "tiny.toml"
    grid.write_text(TINY + AXES)
    code, output = sweep(grid, "--runs", root / "runs", "--jobs", "2")
    return grid, root / "runs", code, output


@pytest.mark.slow
@pytest.mark.compat
def test_a_one_cell_sweep_trains_and_scores_its_run(tmp_path):
    """The fast set's sweep: one tiny cell trained by the local executor's child process."""
    grid = tmp_path / "one.toml"
    grid.write_text(TINY + '[grid]\n"train.seed" = [111]\n')
    code, output = sweep(grid, "--runs", tmp_path / "runs")
    assert code == 0, output
    [run] = runs.find_runs([tmp_path / "runs"])
    assert runs.Run(run).is_complete()
    assert_scores_consistent(json.loads((run / "eval.json").read_text()))


@pytest.mark.slow
def test_local_sweep_trains_every_cell(swept):
    grid, out, code, output = swept
    assert code == 0, output
    for cell in CELLS:
        run = out / "tiny" / cell
        assert runs.Run(run).is_complete(), output
        log = (run / "train.log").read_text()
        assert log.startswith("# ") and "perencode train" in log
        assert runs.read_recipe(run).description == f"tiny: {cell}"


@pytest.mark.slow
def test_rerun_skips_finished_and_resumes_unfinished(swept):
    grid, out, _, _ = swept
    logs = {c: (out / "tiny" / c / "train.log").read_text() for c in CELLS}
    unfinished = out / "tiny" / CELLS[0]
    unfinish(unfinished)
    (unfinished / "checkpoints" / "step-10.pt").unlink()
    code, output = sweep(grid, "--runs", out, "--jobs", "2")
    assert code == 0, output
    assert runs.Run(unfinished).is_complete()
    for cell in CELLS[1:]:
        assert (out / "tiny" / cell / "train.log").read_text() == logs[cell]
    assert (unfinished / "train.log").read_text().count("perencode train") == 2


@pytest.mark.slow
def test_submitit_local_executor(swept, tmp_path):
    grid, _, _, _ = swept
    out = tmp_path / "runs"
    options = SweepOptions(executor="slurm", device="cpu", progress=False,
                           only=["seed=111", "vocab_size=8"],
                           slurm={"cluster": "local", "gpus_per_job": 0, "cpus_per_job": 1})
    code = run_sweep(grid, out=out, options=options)
    assert code == 0
    done = sorted(p.parent.relative_to(out / "tiny").as_posix()
                  for p in out.glob("tiny/**/eval.json"))
    assert done == ["vocab_size=8/encoding=none/seed=111",
                    "vocab_size=8/encoding=sinusoidal/seed=111"]
    assert any((out / "tiny" / ".submitit").iterdir())


@pytest.mark.slow
def test_failed_run_is_reported_and_the_sweep_goes_on(tmp_path):
    grid = tmp_path / "mixed.toml"
    grid.write_text(TINY.replace('name = "reverse"', 'name = "reverse"\ndata = "nowhere"')
                    + '[grid]\n"task.name" = ["lm", "reverse"]\n')
    code, output = sweep(grid, "--runs", tmp_path / "runs")
    assert code == 1
    failed = tmp_path / "runs" / "mixed" / "task=lm"
    assert f"log: {failed / 'train.log'}" in output.replace("\n", "")
    assert "no manifest.json" in (failed / "train.log").read_text()
    assert runs.Run(tmp_path / "runs" / "mixed" / "task=reverse").is_complete()


@pytest.mark.slow
def test_identical_recipes_are_linked_not_retrained(swept):
    grid, out, _, _ = swept
    twin = grid.with_name("twin.toml")
    twin.write_text(grid.read_text())
    code, output = sweep(twin, "--runs", out, "--only", "seed=111")
    assert code == 0, output
    for cell in CELLS:
        if "seed=111" in cell:
            linked = out / "twin" / cell
            assert linked.is_symlink() and linked.resolve() == (out / "tiny" / cell).resolve()
    assert "reuse" in output


@pytest.mark.slow
def test_analyses_run_after_training_until_their_output_is_complete(swept):
    from perencode.commands.sweep.cells import plan

    grid, out, _, _ = swept
    after = grid.with_name("after.toml")
    after.write_text(f'base = "{grid.name}"\n[sweep]\nafter = ["stability"]\n')
    planned = plan(load_grid(after, only=["seed=222"]), out)
    assert [r.state for r in planned] == ["reuse"] * 4
    assert all(r.commands == [["stability", str(r.dir)]] for r in planned)
    twin = planned[0].twin
    assert twin is not None
    csv = twin / "stability.csv"
    csv.write_text("iteration,stability\n10,1.0\n")  # covers the run's one checkpoint
    try:
        again = plan(load_grid(after, only=["seed=222"]), out)
    finally:
        csv.unlink()
    assert again[0].commands == [] and all(r.commands for r in again[1:])


def test_dry_run_trains_nothing_and_writes_nothing(tmp_path, monkeypatch):
    """No training step, no bench, no file: the plan, disk and (unmeasured) device-hours."""
    def forbidden(*args, **kwargs):
        raise AssertionError("--dry-run ran a training step")

    monkeypatch.setattr(session_module, "train_step", forbidden)
    monkeypatch.setattr(cost_module.subprocess, "run", forbidden)  # `perencode bench`, a child
    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY + AXES)
    code, output = sweep(grid, "--runs", tmp_path / "fresh", "--dry-run")
    assert code == 0, output
    assert "8 runs (8 new); 8 to train" in output
    # Not timed on this machine (its CPU says nothing of a GPU), modelled for the paper's GPU
    # as `perencode plan` models it: the same figure, twice the same.
    assert "device time on cpu" in output and "not measured yet" in output
    assert "on NVIDIA A100 80GB SXM, the paper's GPU" in output and "modelled" in output
    assert sweep(grid, "--runs", tmp_path / "fresh", "--dry-run")[1] == output
    assert not (tmp_path / "fresh").exists()


def test_disk_estimate_is_the_size_of_the_kept_checkpoints(tmp_path):
    """Exact for the parameters: 12 bytes each (weights, Adam's two moments) plus the
    bookkeeping, times the checkpoints kept; and the LSTM of Fig. 2 at K = 16,384."""
    from perencode.training.session import build

    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY + AXES)
    recipe = load_grid(grid).cells[0].recipe
    _, model = build(recipe, torch.device("cpu"))
    assert planning.parameter_count(recipe) == sum(p.numel() for p in model.parameters())
    big = load_grid(ROOT / "recipes/paper/fig02_lstm_reverse.toml",
                    only=["vocab_size=16384", "encoding=sinusoidal", "seed=111"]).cells[0]
    assert planning.checkpoint_bytes(big.recipe) == pytest.approx(239e6, rel=0.01)
    assert planning.checkpoints_on_disk(big.recipe) == 1
    stability = load_grid(ROOT / "recipes/paper/fig03_lstm_dual_frequency.toml").cells[0]
    assert planning.checkpoints_on_disk(stability.recipe) == 60  # 300,000 / 5,000


@pytest.mark.slow
def test_estimate_measures_each_shape_once_and_the_dry_run_reuses_it(tmp_path, monkeypatch):
    # Its `perencode bench` children are forks: what is tested is what the sweep makes of
    # their timings (bench and its JSON line: tests/test_cli.py).
    fork_perencode_commands(monkeypatch, cost_module)
    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY + AXES)
    out = tmp_path / "runs"
    code, output = sweep(grid, "--runs", out, "--estimate", "--only", "vocab_size=8",
                         "--only", "encoding=none")
    assert code == 0, output
    cache = json.loads((out / ".estimates.json").read_text())
    (entries,) = cache.values()
    assert len(entries) == 1
    (entry,) = entries.values()  # the median of the repeats, with their spread
    low, high = entry["spread"]
    assert 0 < low <= entry["seconds_per_iteration"] <= high
    assert not (out / "tiny").exists()  # timed, not trained
    code, output = sweep(grid, "--runs", out, "--dry-run")
    assert code == 0, output
    # One shape measured; the other GRU shapes are extrapolated by their FLOPs (~).
    assert "~" in output and "extrapolated by FLOPs" in output and "?" not in output


@pytest.mark.slow
def test_figures_and_verify_on_the_swept_runs(swept, tmp_path):
    _, out, _, _ = swept
    runner = CliRunner()
    result = runner.invoke(app, ["figures", str(out / "tiny"), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "results.csv")
    assert len(table) == 8
    assert {"vocab_size", "encoding", "seed", "token_accuracy", "dl_distance"} <= set(table)
    image = imread(tmp_path / "fig02_reverse_vocabulary__nonpaper.png")  # tiny settings
    assert image.ndim == 3 and image.shape[0] > 100
    assert (tmp_path / "fig02_reverse_vocabulary__nonpaper.pdf").stat().st_size > 0

    claims = tmp_path / "claims.toml"
    true = ('[[claim]]\nid = "trained"\nstatement = "every cell has an accuracy in [0, 1]"\n'
            'where = { "task.name" = "reverse" }\nmetric = "token_accuracy"\n'
            'by = ["task.vocab_size", "encoding.kind"]\ntest = "threshold"\nop = ">="\n'
            'value = 0.0\n')
    false = ('[[claim]]\nid = "impossible"\nstatement = "deliberately false: accuracy 150%"\n'
             'where = { "task.name" = "reverse" }\nmetric = "token_accuracy"\n'
             'by = ["task.vocab_size", "encoding.kind"]\ntest = "threshold"\nvalue = 1.5\n')
    claims.write_text(true)
    result = runner.invoke(app, ["verify", str(out / "tiny"), "--claims", str(claims),
                                 "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    claims.write_text(true + "\n" + false)
    result = runner.invoke(app, ["verify", str(out / "tiny"), "--claims", str(claims),
                                 "--out", str(tmp_path)])
    assert result.exit_code == 1
    verdicts = {r["id"]: r for r in json.loads((tmp_path / "verify.json").read_text())
                ["results"]}
    # Two seeds a cell do not decide even a true threshold at 95% (one-sided t on 1 df,
    # alpha halved for an accuracy): inconclusive, which does not fail verify.
    assert verdicts["trained"]["verdict"] == "inconclusive"
    assert len(verdicts["trained"]["cells"]) == 4
    assert verdicts["impossible"]["verdict"] == "fail"
    # The cell shown is the one that decides: the lowest of the cells the test fails (a
    # cell whose seeds tie, e.g. both at the same accuracy, has no spread to fail with).
    means = table.groupby(["vocab_size", "encoding"])["token_accuracy"].mean()
    failing = [c["value"] for c in verdicts["impossible"]["cells"] if c["verdict"] == "fail"]
    assert failing and verdicts["impossible"]["value"] == pytest.approx(min(failing))
    assert all(any(v == pytest.approx(m) for m in means) for v in failing)


@pytest.mark.slow
def test_checkpoint_stops_training_and_the_requeued_job_resumes(tmp_path):
    """What submitit does on a SLURM time-out: checkpoint() -> requeue -> call again."""
    grid = tmp_path / "long.toml"
    grid.write_text(TINY.replace("iterations = 10", "iterations = 400")
                    .replace("checkpoint_every = 10", "checkpoint_every = 400")
                    + '[grid]\n"train.seed" = [111]\n')
    cell = load_grid(grid).cells[0]
    run_dir = tmp_path / "run"
    runs.Run(run_dir).claim(cell.recipe)
    args = (str(run_dir), [["train", str(run_dir / "recipe.toml"), "--run-dir", str(run_dir)]],
            "cpu", 1)
    job, errors = TrainJob(), []

    def call():
        try:
            job(*args)
        except RuntimeError as exc:
            errors.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 60
    while not runs.Run(run_dir).metrics() and time.monotonic() < deadline:
        time.sleep(0.05)
    delayed = job.checkpoint(*args)
    thread.join()
    assert (run_dir / "checkpoints" / "resume.pt").exists() and errors
    assert isinstance(delayed.function, TrainJob) and delayed.args == args
    delayed.function(*delayed.args)
    assert runs.Run(run_dir).is_complete()
    assert "interrupted at iteration" in (run_dir / "train.log").read_text()
    steps = [row.step for row in runs.Run(run_dir).metrics()]
    assert steps == list(range(5, 401, 5))  # resumed: every logged step once



@pytest.mark.slow
def test_second_sweep_on_one_run_tree_exits_2_naming_the_first(tmp_path):
    """Two sweeps of one grid into one --out: the second stops at once with one line
    naming the holder; the first trains every run once."""
    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY.replace("iterations = 10", "iterations = 30") + AXES)
    out = tmp_path / "runs"
    log = tmp_path / "first.log"
    first = forked.start(["sweep", grid, "--runs", out, "--only", "vocab_size=8", "--only",
                          "seed=111", "--device", "cpu", "--no-progress"],
                         env=subprocess_env(), output=log)  # a fork of this process
    lock = out / "tiny" / ".perencode.lock"
    deadline = time.monotonic() + 60
    while not (lock.exists() and lock.read_text().strip()) and time.monotonic() < deadline:
        assert first.poll() is None, log.read_text()
        time.sleep(0.01)
    # The first sweep stopped (alive, holding its lock) while the second starts: a short
    # grid outlives the second's start on a loaded machine.
    first.send_signal(signal.SIGSTOP)
    try:
        code, output = sweep(grid, "--runs", out, "--only", "vocab_size=8", "--only", "seed=111")
    finally:
        first.send_signal(signal.SIGCONT)
    text = " ".join(output.split())
    assert code == 2, output
    assert text.startswith(f"error: {out / 'tiny'}: in use by `perencode sweep {grid}` (pid "
                           f"{first.pid} on "), text
    assert first.wait(timeout=300) == 0, log.read_text()
    for encoding in ("none", "sinusoidal"):
        cell = out / "tiny" / f"vocab_size=8/encoding={encoding}/seed=111"
        steps = [r.step for r in runs.Run(cell).metrics()]
        assert steps == sorted(set(steps)) and steps[-1] == 30
    assert not lock.exists()  # released on exit


def test_children_run_the_installed_perencode_not_a_checkout_in_the_working_dir(
        tmp_path, monkeypatch, real_children):
    """A container started with a checkout mounted at its working directory, or the
    rehearsal's export: the sweep's children must run the package their parent runs."""
    from perencode.commands.sweep.child import launch, thread_env
    from perencode.common.processes import perencode_command

    (tmp_path / "perencode").mkdir()
    (tmp_path / "perencode" / "__init__.py").write_text("raise SystemExit(7)\n")
    (tmp_path / "perencode" / "__main__.py").write_text("raise SystemExit(7)\n")
    monkeypatch.chdir(tmp_path)
    assert perencode_command()[0].endswith("perencode")  # the console script of this venv
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc, log = launch(["--version"], run_dir, thread_env(1))
    assert proc.wait(timeout=60) == 0
    log.close()
    assert "perencode" in (run_dir / "train.log").read_text().splitlines()[-1]
