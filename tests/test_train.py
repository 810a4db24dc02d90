import errno
import json
import math
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import forked
import pytest
import torch
from conftest import (
    PYTHON,
    RECIPE,
    ROOT,
    TINY_MODEL,
    assert_scores_consistent,
    subprocess_env,
    tiny_model,
    tiny_overrides,
    tmpfs,
    train_args,
    unfinish,
)
from fake_runs import fake_run

import perencode.common.files
from perencode.config.recipe import OptimConfig, validate
from perencode.store import runs
from perencode.training.session import learning_rate, loss_fn


def test_timm_schedule_known_values():
    o, n = OptimConfig(), 300_000
    assert learning_rate(0, o, n) == 0.0  # iteration 1 runs at lr 0
    assert learning_rate(500, o, n) == pytest.approx(0.5e-3)
    assert learning_rate(999, o, n) < 1e-3
    assert learning_rate(1000, o, n) == pytest.approx(1e-3)  # peak first used at 1,001
    # the last iteration runs at about 2.7e-8 (docs/paper-facts.md#learning-rate-schedule)
    last = learning_rate(n - 1, o, n)
    assert last == pytest.approx(2.7e-8, rel=0.03) and last > 0
    assert learning_rate(599_999, o, 600_000) == pytest.approx(6.9e-9, rel=0.03)
    mid = 1000 + n // 2
    assert learning_rate(mid, o, n) == pytest.approx(0.5e-3)


def test_cosine_schedule_reaches_zero_at_last_iteration():
    o, n = OptimConfig(schedule="cosine", warmup=10), 100
    assert learning_rate(0, o, n) == 0.0
    assert learning_rate(10, o, n) == pytest.approx(1e-3)
    assert learning_rate(n - 1, o, n) == pytest.approx(0.0, abs=1e-15)
    values = [learning_rate(k, o, n) for k in range(10, n)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def _train_args(out: Path, iterations: int = 30, every: int = 10,
                recipe: Path = RECIPE) -> list[str]:
    return train_args(out, f"train.iterations={iterations}", f"train.checkpoint_every={every}",
                      "task.vocab_size=8", "task.length=6", "optim.warmup=5", recipe=recipe)


def _final_model(run_dir: Path) -> dict:
    steps = runs.Run(run_dir).checkpoints()
    return runs.load_checkpoint(steps[-1][1])["model"]


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _spawn(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "-m", "perencode", *args], env=subprocess_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _run(args: list[str]) -> subprocess.CompletedProcess:
    """`perencode ARGS` to its end in a process of its own, forked from this one
    (tests/forked.py): the uninterrupted twin of a killed run, the resume of one, the second
    of two processes. The process killed is always a new interpreter (`_spawn`)."""
    return forked.run(args, env=subprocess_env(), timeout=120)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    t0, stdout = time.time(), proc.stdout
    assert stdout is not None
    while not path.exists():
        assert proc.poll() is None, stdout.read().decode()
        assert time.time() - t0 < timeout
        time.sleep(0.02)


RECIPES = {"reverse": RECIPE, "dual_frequency": ROOT / "recipes" / "gru_dualfreq_vocab64.toml"}


@pytest.mark.parametrize("task, keep, kept", [
    ("reverse", None, [28]), ("reverse", 2, [24, 28]),
    ("reverse", "all", [4, 8, 12, 16, 20, 24, 28]),
    ("dual_frequency", None, [4, 8, 12, 16, 20, 24, 28]), ("dual_frequency", 1, [28])])
def test_checkpoint_retention_keeps_exactly_the_newest(cli, tmp_path, task, keep, kept):
    """Unset: every checkpoint of a dual-frequency run (the stability analysis reads them all),
    the last one otherwise; an explicit count keeps the newest N (28 = the final step)."""
    out = tmp_path / "run"
    args = _train_args(out, iterations=28, every=4, recipe=RECIPES[task])
    if keep is not None:
        args += ["--set", f"train.keep_checkpoints={keep!r}".replace("'", '"')]
    code, text = cli(*args)
    assert code == 0, text
    assert [i for i, _ in runs.Run(out).checkpoints()] == kept
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == sorted(
        f"step-{i}.pt" for i in kept)
    # Retention is not part of the run: the same command with another count is the same run.
    args += ["--set", "train.keep_checkpoints=3"]
    code, text = cli(*args)
    assert code == 0 and "already complete" in text, text


def test_keep_checkpoints_must_be_positive_or_all(cli, tmp_path):
    code, text = cli(*_train_args(tmp_path / "r"), "--set", "train.keep_checkpoints=0")
    assert code == 2 and "keep_checkpoints" in text and len(text.strip().splitlines()) == 1


def test_run_dir_contents_and_eval(cli, tmp_path):
    out = tmp_path / "run"
    code, text = cli(*_train_args(out))
    assert code == 0, text
    for name in ("recipe.toml", "env.json", "metrics.jsonl", "eval.json"):
        assert (out / name).exists(), name
    assert [i for i, _ in runs.Run(out).checkpoints()] == [30]  # reverse keeps the last one
    env = json.loads((out / "env.json").read_text())
    for key in ("perencode_version", "git_commit", "python", "torch", "cuda", "cudnn",
                "device", "device_name", "seed", "start_time", "end_time"):
        assert key in env
    assert env["seed"] == 111 and env["device"] == "cpu"
    rows = runs.Run(out).metrics()
    assert [r.step for r in rows] == [5, 10, 15, 20, 25, 30]
    assert all({"step", "loss", "accuracy", "lr"} <= r.as_dict().keys() for r in rows)
    result = json.loads((out / "eval.json").read_text())
    assert result["n_sequences"] == 32 and result["n_tokens"] == 32 * 6
    assert_scores_consistent(result)
    recipe = runs.read_recipe(out)
    assert recipe.model.hidden_size == 16  # the resolved recipe keeps the overrides

    code, text = cli("eval", str(out), "--device", "cpu")
    assert code == 0, text
    again = json.loads((out / "eval.json").read_text())
    assert again["token_accuracy"] == result["token_accuracy"]

    code, text = cli(*_train_args(out))
    assert code == 0 and "already complete" in text
    # The description is free text, not part of what makes a run (recipe.identity): the
    # same command with an edited description is the same, finished run.
    code, text = cli(*_train_args(out), "--set", 'description="edited text"')
    assert code == 0 and "already complete" in text, text
    assert runs.read_recipe(out).description == recipe.description
    code, text = cli(*_train_args(out), "--set", "optim.lr=0.5")
    assert code == 2 and "holds a run of a different recipe (optim.lr" in text


@pytest.mark.compat
@pytest.mark.slow
def test_resume_after_sigkill_is_bit_identical(tmp_path):
    full = tmp_path / "full"
    assert _run(_train_args(full, 40)).returncode == 0

    cut = tmp_path / "cut"
    proc = _spawn(_train_args(cut, 40))
    _wait_for(cut / "checkpoints" / "step-10.pt", proc)
    proc.kill()
    proc.wait()
    assert not (cut / "eval.json").exists()
    assert json.loads((cut / ".perencode.lock").read_text())["pid"] == proc.pid  # left behind
    done = _run(_train_args(cut, 40))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"pid {proc.pid}" in done.stderr and "taking over" in done.stderr  # stale lock
    assert not (cut / ".perencode.lock").exists()
    _assert_same_weights(_final_model(full), _final_model(cut))
    assert [r.loss for r in runs.Run(full).metrics()] == \
        [r.loss for r in runs.Run(cut).metrics()]
    assert json.loads((full / "eval.json").read_text())["token_accuracy"] == \
        json.loads((cut / "eval.json").read_text())["token_accuracy"]


@pytest.mark.compat
@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_resumes_identically(tmp_path):
    full = tmp_path / "full"
    assert _run(_train_args(full, 300, 1000)).returncode == 0
    cut = tmp_path / "cut"
    proc = _spawn(_train_args(cut, 300, 1000))
    _wait_for(cut / "metrics.jsonl", proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, out.decode()  # 128 + SIGTERM, as a shell reports it
    assert (cut / "checkpoints" / "resume.pt").exists()
    stopped_at = runs.load_checkpoint(cut / "checkpoints" / "resume.pt")["iteration"]
    assert 0 < stopped_at < 300
    done = _run(_train_args(cut, 300, 1000))
    assert done.returncode == 0, done.stdout + done.stderr
    said = " ".join((done.stdout + done.stderr).split())
    assert f"{cut}: resuming from iteration {stopped_at} of 300" in said
    assert not (cut / "checkpoints" / "resume.pt").exists()
    _assert_same_weights(_final_model(full), _final_model(cut))


def test_different_recipe_in_existing_run_dir_is_refused(cli, tmp_path):
    out = tmp_path / "run"
    assert cli(*_train_args(out, 10))[0] == 0
    code, text = cli(*_train_args(out, 10), "--set", "optim.lr=0.5")
    assert code == 2
    assert "holds a run of a different recipe" in text and "optim.lr" in text
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    code, text = cli(*_train_args(tmp_path / "other", 10))
    assert code == 2 and "not a perencode run directory" in text


def test_corrupted_truncated_and_foreign_checkpoints(cli, tmp_path):
    out = tmp_path / "run"
    assert cli(*_train_args(out, 10))[0] == 0
    ckpt = out / "checkpoints" / "step-10.pt"
    data = ckpt.read_bytes()

    ckpt.write_bytes(data[: len(data) // 2])
    code, text = cli("eval", str(out), "--device", "cpu")
    assert code == 2 and "not a readable perencode checkpoint" in text
    assert "Traceback" not in text

    ckpt.write_bytes(b"\x00garbage" * 10)
    code, text = cli("eval", str(out), "--device", "cpu")
    assert code == 2 and "not a readable perencode checkpoint" in text

    torch.save({"state_dict": {"w": torch.zeros(2)}}, ckpt)
    code, text = cli("eval", str(out), "--device", "cpu")
    assert code == 2 and "foreign checkpoint" in text

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    torch.save({"format": "perencode-checkpoint", "x": Evil()}, ckpt)
    code, text = cli("eval", str(out), "--device", "cpu")
    assert code == 2 and "pwned" not in text


def test_checkpoint_of_another_model_is_refused(cli, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli(*_train_args(a, 10))[0] == 0
    assert cli(*_train_args(b, 10), "--set", "model.arch=lstm")[0] == 0
    code, text = cli("eval", str(a), "--checkpoint", str(b / "checkpoints/step-10.pt"),
                     "--device", "cpu")
    assert code == 2 and "another run's checkpoint (model.arch: 'lstm' in the checkpoint" in text


@pytest.mark.slow
@pytest.mark.compat
def test_loss_decreases_on_a_small_problem(cli, tmp_path):
    out = tmp_path / "run"
    code, text = cli("train", str(RECIPE), "--run-dir", str(out), "--device", "cpu",
                     "--no-progress", *tiny_overrides(
                         "train.iterations=150", "task.vocab_size=4", "task.length=3",
                         "optim.lr=1e-2", "optim.warmup=10", "train.checkpoint_every=150",
                         "model.hidden_size=32", "train.batch_size=32", "task.held_out=8"))
    assert code == 0, text
    rows = runs.Run(out).metrics()
    assert rows[-1].loss < rows[0].loss - 0.3
    assert json.loads((out / "eval.json").read_text())["token_accuracy"] > 0.5
    assert math.isfinite(rows[-1].loss)


def _tiny_model_and_batch(mask: bool):
    from perencode.config.recipe import Recipe
    from perencode.kinds.models import Shapes, build_model
    from perencode.kinds.tasks.base import Batch

    recipe = Recipe.model_validate({"model": TINY_MODEL})
    torch.manual_seed(0)
    model = build_model(recipe, Shapes(num_embeddings=11, num_classes=10, steps=12, outputs=6))
    inputs = torch.randint(0, 11, (4, 12))
    targets = torch.randint(0, 10, (4, 6))
    out_mask = torch.rand(4, 6) > 0.3 if mask else None
    return model, Batch(sequences=inputs, inputs=inputs, targets=targets,
                        output_targets=targets, output_mask=out_mask)


@pytest.mark.parametrize("mask", [False, True])
def test_chunked_loss_equals_full_loss_and_gradients(mask):
    model, batch = _tiny_model_and_batch(mask)
    full, hits = loss_fn(model, batch, count_hits=True)
    full.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    chunked, chunk_hits = loss_fn(model, batch, count_hits=True, chunk_logits=30)  # 3 rows
    chunked.backward()
    torch.testing.assert_close(chunked, full)
    assert chunk_hits is not None and hits is not None
    assert int(chunk_hits) == int(hits)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], msg=n)


def test_masked_outputs_never_count():
    model, batch = _tiny_model_and_batch(mask=True)
    loss = loss_fn(model, batch)[0]
    scrambled = batch.output_targets.clone()
    scrambled[~batch.output_mask] = (scrambled[~batch.output_mask] + 1) % 10
    batch.output_targets = scrambled
    torch.testing.assert_close(loss_fn(model, batch)[0], loss)


@pytest.mark.parametrize("arch", ["gru", "lstm", "s4d"])
def test_padding_row_of_a_task_is_zero_and_frozen(arch):
    from perencode.config.recipe import Recipe
    from perencode.kinds.models import Shapes, build_model

    recipe = Recipe.model_validate({"model": tiny_model(arch)})
    model = build_model(recipe, Shapes(num_embeddings=6, num_classes=5, steps=4, outputs=4,
                                       pad_id=5))
    assert model.embedding.weight[5].abs().sum() == 0
    model(torch.tensor([[5, 1, 5, 2]])).sum().backward()
    assert model.embedding.weight.grad is not None
    assert model.embedding.weight.grad[5].abs().sum() == 0
    assert model.embedding.weight.grad[1].abs().sum() > 0


def test_a_corrupted_env_json_is_set_aside_and_the_run_goes_on(cli, tmp_path):
    out = tmp_path / "run"
    assert cli(*_train_args(out, 10))[0] == 0
    unfinish(out)  # unfinished again: the rerun reads env.json
    (out / "env.json").write_text("{not json")
    code, text = cli(*_train_args(out, 10))
    assert code == 0 and "env.json: not valid JSON" in text and "Traceback" not in text
    assert "kept aside as env.json.corrupt" in text
    assert (out / "env.json.corrupt").read_text() == "{not json"
    assert len(runs.read_json(out / "env.json")["starts"]) == 1 and (out / "eval.json").exists()


# -- one writer per run, refused writes, unreadable checkpoints, stale temporary files ----

def _steps(run_dir: Path) -> list[int]:
    return [r.step for r in runs.Run(run_dir).metrics()]


@pytest.mark.slow
def test_a_second_train_or_eval_of_a_running_run_exits_2(cli, tmp_path):
    out = tmp_path / "run"
    first = _spawn(_train_args(out, 100_000, 50_000))
    try:
        _wait_for(out / "metrics.jsonl", first)
        code, text = cli(*_train_args(out, 100_000, 50_000))
        assert code == 2 and len(text.strip().splitlines()) == 1, text
        assert f"in use by `train` (pid {first.pid} on {socket.gethostname()}" in text
        assert "since 20" in text and ".perencode.lock" in text
        code, text = cli("eval", out, "--device", "cpu")
        assert code == 2 and f"pid {first.pid}" in text
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    assert first.returncode == 143
    steps = _steps(out)
    assert steps == list(range(5, steps[-1] + 1, 5))  # each step once
    assert len(json.loads((out / "env.json").read_text())["starts"]) == 1


@pytest.mark.slow
def test_two_train_processes_on_one_run_dir_train_once(tmp_path):
    """Two real `perencode train` at once: the second exits 2 naming the first, whose
    metrics have each step once. The first is paused meanwhile, so the overlap is certain."""
    out = tmp_path / "run"
    first = _spawn(_train_args(out, 300, 100))
    _wait_for(out / "metrics.jsonl", first)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = _run(_train_args(out, 300, 100))
    finally:
        os.kill(first.pid, signal.SIGCONT)
    output, _ = first.communicate(timeout=120)
    assert first.returncode == 0, output.decode()
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and f"in use by `train` (pid {first.pid}" in lines[0], lines
    assert _steps(out) == list(range(5, 301, 5))
    assert len(json.loads((out / "env.json").read_text())["starts"]) == 1
    assert not (out / ".perencode.lock").exists()


def _refuse_writes_of(monkeypatch, name: str, code: int = errno.ENOSPC) -> None:
    """Make the filesystem refuse atomic writes of `name` (as a full disk would)."""
    real: Callable[..., tuple[int, str]] = perencode.common.files.tempfile.mkstemp

    def mkstemp(*args, prefix="", **kwargs):
        if prefix == f".{name}.":
            raise OSError(code, os.strerror(code))
        return real(*args, prefix=prefix, **kwargs)

    monkeypatch.setattr(perencode.common.files.tempfile, "mkstemp", mkstemp)


@pytest.mark.slow
@pytest.mark.compat
def test_a_full_disk_stops_training_with_one_line_and_the_rerun_resumes(cli, tmp_path,
                                                                          monkeypatch):
    clean, out = tmp_path / "clean", tmp_path / "run"
    assert cli(*_train_args(clean, 20, 5))[0] == 0
    _refuse_writes_of(monkeypatch, "step-15.pt")
    code, text = cli(*_train_args(out, 20, 5))
    assert code == 2 and "Traceback" not in text
    assert " ".join(text.split()) == (
        f"error: {out}/checkpoints/step-15.pt: cannot write: no space left on device; "
        f"step-15.pt was not written; the last complete checkpoint is "
        f"{out}/checkpoints/step-10.pt: run the same command again to resume")
    assert not (out / ".perencode.lock").exists()
    monkeypatch.undo()
    code, text = cli(*_train_args(out, 20, 5))
    assert code == 0, text
    assert _steps(out) == [5, 10, 15, 20]
    _assert_same_weights(_final_model(clean), _final_model(out))


def test_a_read_only_run_dir_before_any_checkpoint(cli, tmp_path, monkeypatch):
    _refuse_writes_of(monkeypatch, "env.json", errno.EROFS)
    code, text = cli(*_train_args(tmp_path / "run", 10))
    assert code == 2 and "env.json: cannot write: read-only file system" in text
    assert "no checkpoint yet" in text


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (root and a mount that works: a container may forbid it)."""
    yield from tmpfs(tmp_path / "disk", "2m")


@pytest.mark.slow
@pytest.mark.compat
def test_disk_full_on_a_real_small_filesystem(cli, tmp_path, small_disk):
    clean = tmp_path / "clean"
    assert cli(*_train_args(clean, 20, 5))[0] == 0
    checkpoint = (clean / "checkpoints" / "step-20.pt").stat().st_size
    page = os.statvfs(small_disk).f_frsize
    # Room for the small files and one checkpoint, not for the next one beside it.
    room = 6 * page + checkpoint + checkpoint // 2
    free = os.statvfs(small_disk).f_bavail * page
    (small_disk / "filler").write_bytes(b"\0" * (free - room))
    out = small_disk / "run"
    code, text = cli(*_train_args(out, 20, 5))
    line = " ".join(text.split())
    assert code == 2 and "Traceback" not in text, text
    assert "cannot write: no space left on device" in line
    assert f"the last complete checkpoint is {out}/checkpoints/step-" in line
    (small_disk / "filler").unlink()
    assert cli(*_train_args(out, 20, 5))[0] == 0
    assert _steps(out) == [5, 10, 15, 20]
    _assert_same_weights(_final_model(clean), _final_model(out))


def test_an_unreadable_latest_checkpoint_is_set_aside_and_the_run_resumes(cli, tmp_path):
    out = tmp_path / "run"
    keep_all = ["--set", 'train.keep_checkpoints="all"']
    assert cli(*_train_args(out, 20, 5), *keep_all)[0] == 0
    ckpts = out / "checkpoints"
    final = runs.load_checkpoint(ckpts / "step-20.pt")["model"]
    result = json.loads((out / "eval.json").read_text())
    unfinish(out)
    truncated = (ckpts / "step-20.pt").read_bytes()[:1000]
    (ckpts / "step-20.pt").write_bytes(truncated)
    (ckpts / "resume.pt").write_bytes(b"\x00garbage")
    stale = [out / ".metrics.jsonl.abcd_123.tmp", ckpts / ".step-20.pt.x1y2z3w4.tmp"]
    foreign = [out / ".mine.tmp", ckpts / "step-20.pt.bak"]
    for path in stale + foreign:
        path.write_bytes(b"half")
    assert not runs.Run(out).is_complete()

    code, text = cli(*_train_args(out, 20, 5), *keep_all)
    assert code == 0, text
    notes = [" ".join(line.split()) for line in text.split("note:")[1:]]
    assert any("resume.pt: not a readable perencode checkpoint" in n and
               "kept aside as resume.pt.corrupt, resuming from step-15.pt" in n for n in notes)
    assert any("step-20.pt: not a readable perencode checkpoint" in n and
               "kept aside as step-20.pt.corrupt" in n for n in notes)
    assert "\x1b" not in text
    assert (ckpts / "step-20.pt.corrupt").read_bytes() == truncated
    assert (ckpts / "resume.pt.corrupt").exists()
    _assert_same_weights(final, runs.load_checkpoint(ckpts / "step-20.pt")["model"])
    assert json.loads((out / "eval.json").read_text())["token_accuracy"] == \
        result["token_accuracy"]
    assert _steps(out) == [5, 10, 15, 20] and runs.Run(out).is_complete()
    assert not any(p.exists() for p in stale) and all(p.exists() for p in foreign)


def test_eval_removes_its_stale_temporary_file(cli, tmp_path):
    out = tmp_path / "run"
    assert cli(*_train_args(out, 10))[0] == 0
    stale = out / ".eval.json.q8w7e6r5.tmp"
    stale.write_text("{")
    code, text = cli("eval", out, "--device", "cpu")
    assert code == 0, text
    assert not stale.exists()


# -- a long run said at once, progress lines at least every 30 s, RUN_DIR/recipe.toml ---------

def test_a_run_of_more_than_an_hour_is_said_in_one_line(cli, tmp_path, monkeypatch):
    from perencode.training import loop as train

    # The estimate itself: 20 iterations in 2 s, 299,980 left: 8.3 hours.
    run_dir = fake_run(tmp_path, "long", recipe=validate(
        {"train": {"iterations": 300_000}}, "long"))
    messages: list[str] = []
    monkeypatch.setattr(train.console, "print", lambda text, **_: messages.append(text))
    train._warn_if_long(runs.Run(run_dir), torch.device("cpu"), 20, 20, 2.0)
    assert messages == [
        f"[yellow]warning:[/] {run_dir}: about 8.3 hours more on cpu at 10 iterations/s "
        "(299,980 of 300,000 iterations left); Ctrl-C stops it with a checkpoint (the same "
        "command resumes), --set train.iterations=N shortens it"]
    messages.clear()
    train._warn_if_long(runs.Run(run_dir), torch.device("cpu"), 299_000, 20, 2.0)
    assert messages == []  # 100 s left
    # Through training: said once, when the first iterations are timed.
    monkeypatch.undo()
    monkeypatch.setattr(train, "LONG_SECONDS", 0.0)
    monkeypatch.setattr(train, "TIMED_STEPS", 3)
    code, text = cli(*_train_args(tmp_path / "run", 10))
    assert code == 0 and " ".join(text.split()).count("more on cpu at") == 1, text


def test_progress_lines_come_at_least_every_30_seconds(capsys, monkeypatch):
    from perencode.common import progress

    with progress.Reporter("train", 5, log_every=1000, enabled=True) as reporter:
        reporter.tty = False
        for _ in range(5):
            reporter.advance(1)
    assert capsys.readouterr().err.count("[train]") == 1  # the last step only
    monkeypatch.setattr(progress, "LINE_SECONDS", 0.0)  # as if 30 s passed between steps
    with progress.Reporter("train", 5, log_every=1000, enabled=True) as reporter:
        reporter.tty = False
        for _ in range(5):
            reporter.advance(1)
    assert capsys.readouterr().err.count("[train]") == 5


def test_training_a_runs_own_recipe_file_trains_that_run(cli, tmp_path):
    run_dir = tmp_path / "runs" / "mine"
    code, text = cli(*_train_args(run_dir, 10))
    assert code == 0, text
    scored = (run_dir / "eval.json").read_text()
    code, text = cli("train", run_dir / "recipe.toml", "--device", "cpu", "--no-progress")
    flat = " ".join(text.split())
    assert code == 0 and f"is the recipe of the run {run_dir}: training that run" in flat
    assert "run is already complete" in flat and (run_dir / "eval.json").read_text() == scored
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["mine"]  # no new run
