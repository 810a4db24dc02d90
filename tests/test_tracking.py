"""TensorBoard logging (`train --tensorboard`) and `perencode tensorboard`."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path

import forked
import pytest
from conftest import PYTHON, ROOT, subprocess_env, tiny_overrides
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.summary.writer.record_writer import RecordWriter

from perencode.common import files as io
from perencode.store import runs
from perencode.training import tensorboard as tracking

pytestmark = pytest.mark.forked_children  # the sweep's children as forks (tests/forked.py)

RECIPE = ROOT / "recipes/gru_vocab256.toml"
TAGS = ("train/loss", "train/accuracy", "train/lr", "train/sequences_per_second")


def _train_args(run_dir: Path, iterations: int = 40, every: int = 20) -> list[str]:
    return ["train", str(RECIPE), "--run-dir", str(run_dir), "--device", "cpu",
            "--no-progress", "--tensorboard",
            *tiny_overrides(f"train.iterations={iterations}", f"train.checkpoint_every={every}",
                            "task.vocab_size=8", "task.length=6", "optim.warmup=5")]


def scalar_events(run_dir: Path) -> list[tuple[str, int, float]]:
    """(tag, step, value) of every scalar in every event file, read record by record."""
    found = []
    for path in tracking.event_files(run_dir / "tensorboard"):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.tag.startswith("train/"):
                    found.append((value.tag, event.step, float(value.tensor.float_val[0])))
    return found


def assert_each_step_once(run_dir: Path, steps: list[int]) -> None:
    events = scalar_events(run_dir)
    counts = Counter((tag, step) for tag, step, _ in events)
    assert set(counts.values()) == {1}, [k for k, n in counts.items() if n > 1]
    for tag in TAGS:
        assert sorted(s for t, s, _ in events if t == tag) == steps, tag
    # TensorBoard's own loader (what the UI shows) agrees.
    board = EventAccumulator(str(run_dir / "tensorboard"))
    board.Reload()
    for tag in TAGS:
        assert [e.step for e in board.Scalars(tag)] == steps, tag
    # The curves are those of metrics.jsonl, row for row.
    rows = {r.step: r for r in runs.Run(run_dir).metrics()}
    for tag, step, value in events:
        key = tag.split("/")[1]
        if key != "sequences_per_second":
            expected = rows[step].as_dict()[key]
            assert value == pytest.approx(expected, rel=1e-6, abs=1e-12), (tag, step)
        else:
            assert value > 0


class Killed(Exception):
    pass


@pytest.mark.slow
@pytest.mark.compat
def test_killed_after_its_checkpoint_and_resumed_every_step_once(cli, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    log = tracking.TensorBoardLog.log

    def log_then_die(self, row):
        log(self, row)
        if row.step == 35:  # past the checkpoint at 20: steps 25..35 are redone
            raise Killed

    monkeypatch.setattr(tracking.TensorBoardLog, "log", log_then_die)
    with pytest.raises(Killed):
        cli(*_train_args(run_dir))
    assert [i for i, _ in runs.Run(run_dir).checkpoints()] == [20]
    assert max(step for _, step, _ in scalar_events(run_dir)) == 35

    monkeypatch.setattr(tracking.TensorBoardLog, "log", log)
    code, text = cli(*_train_args(run_dir))
    assert code == 0, text
    assert len(tracking.event_files(run_dir / "tensorboard")) == 2  # one per start
    assert_each_step_once(run_dir, list(range(5, 41, 5)))
    code, text = cli(*_train_args(run_dir))  # complete: nothing is logged again
    assert code == 0 and "already complete" in text
    assert_each_step_once(run_dir, list(range(5, 41, 5)))


@pytest.mark.compat
@pytest.mark.slow
def test_sigkill_and_resume_every_step_once(tmp_path):
    run_dir = tmp_path / "run"
    args = _train_args(run_dir, iterations=1000, every=500)
    proc = subprocess.Popen([PYTHON, "-m", "perencode", *args], env=subprocess_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    # Row 510 is written after step 505's events were flushed: the kill leaves events past
    # the checkpoint at 500.
    while not any(r.step >= 510 for r in runs.Run(run_dir).metrics()):
        assert proc.poll() is None and time.time() - t0 < 120
        time.sleep(0.02)
    proc.kill()
    proc.wait()
    last = runs.Run(run_dir).checkpoints()[-1][0]
    logged = max(step for _, step, _ in scalar_events(run_dir))
    assert last == 500 and logged > last
    done = forked.run(args, env=subprocess_env())  # resumed in a fork of this process
    assert done.returncode == 0, done.stderr
    assert_each_step_once(run_dir, list(range(5, 1001, 5)))


def test_without_the_flag_no_event_files(cli, tmp_path):
    run_dir = tmp_path / "run"
    args = [a for a in _train_args(run_dir, iterations=10, every=10) if a != "--tensorboard"]
    code, text = cli(*args)
    assert code == 0, text
    assert not (run_dir / "tensorboard").exists()


def test_runs_trained_without_the_flag_are_shown_from_their_metrics(cli, tmp_path):
    """`perencode tensorboard` writes the curves of a run trained without --tensorboard from
    its metrics.jsonl, beside a run trained with it; written again only once the run logs
    more."""
    plain, logged = tmp_path / "sweep" / "plain", tmp_path / "sweep" / "logged"
    args = [a for a in _train_args(plain, iterations=10, every=10) if a != "--tensorboard"]
    assert cli(*args)[0] == 0 and cli(*_train_args(logged, 10, 10))[0] == 0
    code, text = cli("tensorboard", tmp_path / "sweep", "--dry-run")
    assert code == 0, text
    assert "2 of 2 runs shown; 1 from their metrics.jsonl" in " ".join(text.split())
    assert (f"--logdir_spec logged:{logged}/tensorboard,plain:{plain}/"
            f"{tracking.FROM_METRICS}") in text
    board = EventAccumulator(str(plain / tracking.FROM_METRICS))
    board.Reload()
    rows = runs.Run(plain).metrics()
    for tag, key in (("train/loss", "loss"), ("train/accuracy", "accuracy"),
                     ("train/lr", "lr")):
        got = [(e.step, e.value) for e in board.Scalars(tag)]
        assert got == [(r.step, pytest.approx(r.as_dict()[key], rel=1e-6)) for r in rows], tag
    written = plain / tracking.FROM_METRICS / tracking.CONVERTED
    before = written.stat().st_mtime_ns
    assert cli("tensorboard", tmp_path / "sweep", "--dry-run")[0] == 0
    assert written.stat().st_mtime_ns == before  # metrics.jsonl unchanged: not rewritten


def test_missing_tensorboard_names_the_extra(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    code, text = cli(*_train_args(tmp_path / "run"))
    assert code == 2 and "Traceback" not in text
    assert "pip install 'perencode[tensorboard]'" in " ".join(text.split())
    assert not (tmp_path / "run").exists()  # stopped before the run started


def test_logdir_spec_names_runs_by_their_axes(tmp_path):
    root = tmp_path / "grid"
    cells = [root / "vocab_size=32" / enc / "seed=111" for enc in ("encoding=none",
                                                                    "encoding=sinusoidal")]
    cells.append(root / "vocab_size=1024" / "encoding=none" / "seed=111")
    spec = tracking.logdir_spec(cells)
    assert spec.split(",") == [f"{cell.relative_to(root).as_posix()}:{cell}/tensorboard"
                               for cell in cells]
    # What the runs share is not repeated in their names.
    assert tracking.logdir_spec(cells[:2]).split(",") == [
        f"{enc}/seed=111:{root}/vocab_size=32/{enc}/seed=111/tensorboard"
        for enc in ("encoding=none", "encoding=sinusoidal")]
    assert tracking.logdir_spec([cells[0]]) == f"seed=111:{cells[0]}/tensorboard"


def test_tensorboard_command_dry_run(cli, tmp_path):
    for name in ("a", "b"):
        code, text = cli(*_train_args(tmp_path / "sweep" / name / "seed=111", 5, 5))
        assert code == 0, text
    code, text = cli("tensorboard", tmp_path / "sweep", "--dry-run", "--port", "6007")
    assert code == 0, text
    assert "2 of 2 runs shown\n" in text
    assert (f"-m tensorboard.main --logdir_spec a/seed=111:{tmp_path}/sweep/a/seed=111/"
            f"tensorboard,b/seed=111:{tmp_path}/sweep/b/seed=111/tensorboard --port 6007") in text
    code, text = cli("tensorboard", tmp_path / "nowhere")
    assert code == 2 and "no such run directory or folder" in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_tensorboard_serves_every_run_of_a_sweep(cli, tmp_path):
    for name in ("encoding=none", "encoding=sinusoidal"):
        code, text = cli(*_train_args(tmp_path / "sweep" / name / "seed=111", 10, 10))
        assert code == 0, text
    port = _free_port()
    proc = subprocess.Popen([PYTHON, "-m", "perencode", "tensorboard", str(tmp_path / "sweep"),
                             "--port", str(port)], env=subprocess_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    url = f"http://localhost:{port}/data/plugin/scalars"
    tags: dict = {}
    try:
        t0 = time.time()
        while len(tags) < 2:
            assert proc.poll() is None and time.time() - t0 < 60
            time.sleep(0.5)
            try:
                tags = json.load(urllib.request.urlopen(f"{url}/tags", timeout=5))
            except OSError:
                continue
        assert sorted(tags) == ["encoding=none/seed=111/.", "encoding=sinusoidal/seed=111/."]
        query = urllib.parse.urlencode({"run": "encoding=none/seed=111/.", "tag": "train/loss"})
        points = json.load(urllib.request.urlopen(f"{url}/scalars?{query}", timeout=5))
        assert [step for _, step, _ in points] == [5, 10]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_tensorboard_command_without_the_package_names_the_extra(cli, tmp_path, monkeypatch):
    code, text = cli(*_train_args(tmp_path / "runs" / "a", 5, 5))
    assert code == 0, text
    monkeypatch.setattr(tracking, "find_spec", lambda name: None)
    code, text = cli("tensorboard", tmp_path / "runs")
    assert code == 2 and "pip install 'perencode[tensorboard]'" in " ".join(text.split())


def test_truncating_rewrites_through_io_and_clears_a_killed_rewrite(tmp_path, monkeypatch):
    folder = tmp_path / "tensorboard"
    folder.mkdir()
    path = folder / "events.out.tfevents.1.host"
    with open(path, "wb") as f:
        writer = RecordWriter(f)
        for step in range(1, 6):
            writer.write(Event(step=step, wall_time=float(step)).SerializeToString())
    stale, foreign = folder / ".truncating.abcdefgh.tmp", folder / ".notes.abcdefgh.tmp"
    stale.write_bytes(b"cut")
    foreign.write_bytes(b"kept")
    made: list[tuple[int, str]] = []
    synced: list[Path] = []
    mkstemp, fsync_dir = io.tempfile.mkstemp, io.fsync_dir

    def made_temporary(**kw):
        made.append(mkstemp(**kw))
        return made[-1]

    def synced_folder(p):
        synced.append(Path(p))
        return fsync_dir(p)

    monkeypatch.setattr(io.tempfile, "mkstemp", made_temporary)
    monkeypatch.setattr(io, "fsync_dir", synced_folder)
    tracking.truncate_events(folder, 3)
    assert [e.step for e in EventFileLoader(str(path)).Load()] == [1, 2, 3]
    name = os.path.basename(made[0][1])  # io's temporary name, without "tfevents"
    matched = io.TEMP_RE.match(name)
    assert matched and matched.group("target") == tracking.TRUNCATING
    assert synced == [folder]
    assert sorted(p.name for p in folder.iterdir()) == [foreign.name, path.name]
