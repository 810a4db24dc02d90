"""lm-prepare and its SentencePiece child (issue 36): the child dies with its parent however
the parent dies (SIGTERM: the same one line as Ctrl-C and the unfinished build removed;
SIGKILL: PR_SET_PDEATHSIG), a rerun ends a trainer a killed lm-prepare left running and
never runs two, SentencePiece's failures come in perencode's words with the option to
change, and no lock file outlives its command (a read-only parent can still confirm an
up-to-date build)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import PYTHON, flat, one_line, run_cli, spawned_children, subprocess_env
from wikitext_like import write_wikitext_like

from perencode.commands import lm_prepare
from perencode.commands.rehearsal import write_corpus

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="finds processes through /proc")


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its new parent to reap it has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone(pids: list[int], seconds: float = 10.0) -> bool:
    deadline = time.time() + seconds
    while any(_alive(pid) for pid in pids):
        if time.time() > deadline:
            return False
        time.sleep(0.1)
    return True


def _prepare(*args) -> tuple[int, str]:
    return run_cli("lm-prepare", *[str(a) for a in args])


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    """The rehearsal's small WikiText-shaped corpus (14 kB of training text)."""
    folder = tmp_path_factory.mktemp("small")
    write_corpus(folder)
    return folder


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> Path:
    """A corpus SentencePiece takes long enough over to be killed while it trains."""
    return write_wikitext_like(tmp_path_factory.mktemp("large") / "raw", 8.0)


def _start(source: Path, out: Path) -> tuple[subprocess.Popen, list[int]]:
    """lm-prepare in a process of its own, returned once its trainer has started."""
    proc = subprocess.Popen([PYTHON, "-m", "perencode", "lm-prepare", "--source", str(source),
                             "--out", str(out), "--vocab-size", "8000", "--threads", "1"],
                            env=subprocess_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    t0 = time.time()
    while True:
        trainers = spawned_children(proc.pid)  # the trainer
        builds = list(out.parent.glob(f".{out.name}.build-*"))
        if trainers and builds and (builds[0] / lm_prepare.TRAINER_PID).exists():
            return proc, trainers
        assert proc.poll() is None and time.time() - t0 < 90, proc.communicate()[0]
        time.sleep(0.1)


# -- 36.3: the trainer dies with lm-prepare ------------------------------------------------

@pytest.mark.slow
def test_sigterm_stops_lm_prepare_as_ctrl_c_does(tmp_path, large):
    out = tmp_path / "data"
    proc, trainers = _start(large, out)
    proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=30)
    assert proc.returncode == 143, text
    assert text.strip().splitlines()[-1] == \
        f"interrupted; the unfinished build was removed ({out} is as it was)"
    assert "Traceback" not in text
    assert _gone(trainers)
    assert not out.exists() and not list(tmp_path.glob(".data*")), list(tmp_path.iterdir())


@pytest.mark.slow
def test_sigkill_of_lm_prepare_ends_its_trainer_and_the_rerun_cleans_up(tmp_path, large,
                                                                        small):
    out = tmp_path / "data"
    proc, trainers = _start(large, out)
    proc.kill()
    proc.communicate(timeout=30)
    assert _gone(trainers), "the trainer outlived its lm-prepare"
    build = next(tmp_path.glob(".data.build-*"))
    code, text = _prepare("--source", small, "--out", out, "--vocab-size", 96, "--threads", 1,
                          "--no-progress")
    assert code == 0, text
    assert f"note: removed {build}, left by an lm-prepare that was killed" in flat(text)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


@pytest.mark.slow
def test_a_rerun_ends_a_live_trainer_of_a_dead_lm_prepare_before_it_builds(tmp_path, large,
                                                                          small):
    """A trainer left running (an lm-prepare killed before PR_SET_PDEATHSIG took effect, or
    an older one): the real trainer, started in a build folder no lm-prepare owns."""
    out = tmp_path / "data"
    build = tmp_path / ".data.build-0rphan00"
    build.mkdir()
    lines = (line for line in (large / "wiki.train.raw").open(encoding="utf-8")
             if lm_prepare.is_paragraph(line))
    (build / "train.txt").write_text("".join(lines), encoding="utf-8")
    options = {**lm_prepare.trainer_options(8000), "num_threads": 1}
    script = ("import os, sys; from perencode.commands.lm_prepare import _train_child; "
              f"_train_child({str(build / 'train.txt')!r}, {str(build)!r}, {options!r}, "
              "os.getppid())")
    trainer = subprocess.Popen([PYTHON, "-c", script], env=subprocess_env())
    try:
        t0 = time.time()
        while not (build / lm_prepare.TRAINER_PID).exists() or \
                not (build / "sentencepiece.log").exists():
            assert trainer.poll() is None and time.time() - t0 < 60
            time.sleep(0.1)
        code, text = _prepare("--source", small, "--out", out, "--vocab-size", 96,
                              "--threads", 1, "--no-progress")
        assert code == 0, text
        assert trainer.wait(timeout=10) == -signal.SIGKILL
        assert f"note: removed {build} and ended its SentencePiece trainer (pid " \
            f"{trainer.pid}), left by an lm-prepare that was killed" in flat(text)
        assert not build.exists() and (out / "manifest.json").is_file()
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()


# -- 36.7: SentencePiece's failures in perencode's words -----------------------------------

def _copy(small: Path, tmp_path: Path) -> Path:
    source = tmp_path / "raw"
    shutil.copytree(small, source)
    return source


@pytest.mark.slow
def test_a_vocabulary_too_large_for_the_corpus_names_the_largest_that_fits(tmp_path, small):
    out = tmp_path / "data"
    line = one_line(*_prepare("--source", small, "--out", out, "--vocab-size", 5000,
                               "--threads", 1, "--no-progress"))
    log = tmp_path / "data.sentencepiece.log"
    most = int(line.split("at most ")[1].split()[0])
    assert line == (f"error: --vocab-size 5000 is too large for this corpus: SentencePiece can "
                    f"make at most {most} pieces from it; pass --vocab-size {most} or less, "
                    f"or a larger corpus (SentencePiece's message is in {log})")
    # The full message is in the log, kept beside --out; the limit is SentencePiece's own.
    assert f"Vocabulary size too high (5000). Please set it to a value <= {most}." in \
        log.read_text()
    assert not out.exists() and not list(tmp_path.glob(".data*"))
    code, text = _prepare("--source", small, "--out", out, "--vocab-size", most,
                          "--threads", 1, "--no-progress")
    assert code == 0, text
    assert not log.exists()  # a build removes the log of an earlier failure


@pytest.mark.slow
def test_a_sample_too_small_names_the_smallest_sentencepiece_takes(tmp_path, small):
    out = tmp_path / "data"
    line = one_line(*_prepare("--source", small, "--out", out, "--vocab-size", 96,
                               "--sample", 1, "--threads", 1, "--no-progress"))
    log = tmp_path / "data.sentencepiece.log"
    assert line == ("error: --sample 1 is too small: SentencePiece samples at least 101 "
                    "paragraphs; pass --sample 101 or more, or leave --sample out to train on "
                    f"every paragraph (SentencePiece's message is in {log})")
    assert "input_sentence_size() > 100]" in log.read_text()


def test_a_corpus_without_paragraphs_is_named_as_such(tmp_path, small):
    source = _copy(small, tmp_path)
    (source / "wiki.train.raw").write_text(" = Title = \n \n = = Section = = \n")
    line = one_line(*_prepare("--source", source, "--out", tmp_path / "data",
                               "--vocab-size", 96, "--threads", 1, "--no-progress"))
    assert line == (f"error: {source}: the training split has no paragraph (its 3 lines are "
                    "blank or headings): nothing to train the vocabulary on; pass --source a "
                    "WikiText-shaped corpus")
    assert not list(tmp_path.glob(".data*")) and not (tmp_path / "data").exists()


@pytest.mark.slow
def test_a_corpus_of_one_long_line_is_named_as_such(tmp_path, small):
    source = _copy(small, tmp_path)
    text = " ".join(line.strip() for line in (small / "wiki.train.raw").open()
                    if lm_prepare.is_paragraph(line))
    (source / "wiki.train.raw").write_text(" " + text + "\n")
    line = one_line(*_prepare("--source", source, "--out", tmp_path / "data",
                               "--vocab-size", 96, "--threads", 1, "--no-progress"))
    log = tmp_path / "data.sentencepiece.log"
    assert line == (f"error: no training paragraph is short enough for SentencePiece: the "
                    f"longest has {len(text.encode()) + 1:,} bytes and it skips those over "
                    f"4,192; WikiText has one paragraph a line, and this corpus has 1 line (a "
                    f"file without its line breaks?) (SentencePiece's message is in {log})")
    assert "[!sentences_.empty()]" in log.read_text()


# -- 36.9: no lock file outlives its command -----------------------------------------------

@pytest.mark.slow
def test_no_lock_file_is_left_beside_the_output(tmp_path, small):
    out = tmp_path / "data"
    args = ["--source", small, "--out", out, "--vocab-size", 96, "--threads", 1,
            "--no-progress"]
    for status in ("built", "up to date"):
        code, text = _prepare(*args)
        assert code == 0 and f"({status})" in text, text
        assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    assert _prepare(*args[:-5], "--vocab-size", 5000, "--threads", 1, "--no-progress")[0] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "data.sentencepiece.log"]


@pytest.mark.slow
def test_a_second_lm_prepare_waits_for_the_first_and_finds_its_build(tmp_path, small):
    """Two at once on one --out: the second waits on the lock, then finds the first's build
    up to date (one build, never two); the lock file is gone after both."""
    out = tmp_path / "data"
    args = [PYTHON, "-m", "perencode", "lm-prepare", "--source", str(small), "--out", str(out),
            "--vocab-size", "96", "--threads", "1", "--no-progress"]
    first = subprocess.Popen(args, env=subprocess_env(), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    t0 = time.time()
    while not list(tmp_path.glob(".data.build-*")):
        assert first.poll() is None and time.time() - t0 < 60, first.communicate()[0]
        time.sleep(0.05)
    second = subprocess.run(args, env=subprocess_env(), capture_output=True, text=True,
                            timeout=120)
    said = first.communicate(timeout=120)[0]
    assert first.returncode == 0 and "(built)" in said, said
    assert second.returncode == 0 and "(up to date)" in second.stdout, second.stderr  # a result
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]


@contextlib.contextmanager
def _read_only(folder: Path):
    """A read-only bind mount of `folder` (root), or mode 0555 (another user); skips where
    neither stops a write."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if subprocess.run(["mount", "--bind", str(folder), str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)],
                          capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only here")
        yield
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)


@pytest.mark.slow
def test_a_read_only_parent_still_confirms_an_up_to_date_build(tmp_path, small):
    parent = tmp_path / "shared"
    out = parent / "data"
    args = ["--source", small, "--out", out, "--vocab-size", 96, "--threads", 1,
            "--no-progress"]
    assert _prepare(*args)[0] == 0
    manifest = json.loads((out / "manifest.json").read_text())
    with _read_only(parent):
        code, text = _prepare(*args)
        assert code == 0 and f"prepared {out} (up to date)" in flat(text), text
        line = one_line(*_prepare(*args[:-5], "--vocab-size", 64, "--threads", 1,
                                   "--no-progress"))
        why = "read-only file system" if os.geteuid() == 0 else "permission denied"
        assert line == (f"error: {parent}: cannot write: {why}; {out} is not an up-to-date "
                        "build of these inputs and options: choose an --out in a writable "
                        "folder")
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert sorted(p.name for p in parent.iterdir()) == ["data"]


def test_a_trainer_that_outlives_sigterm_is_killed(monkeypatch, tmp_path):
    """Interrupted while SentencePiece trains, lm-prepare ends its trainer: SIGTERM, a
    second's wait, then SIGKILL for one that is still there (a trainer busy in C code that
    does not end at once). Whether a real one takes the second path depends on the machine's
    load; a stand-in that ignores SIGTERM takes it every time."""
    calls: list[str] = []

    class Stubborn:  # multiprocessing.Process, as _train_tokenizer uses it
        exitcode = None

        def __init__(self, **kwargs):
            self.killed = False

        def start(self):
            calls.append("start")

        def is_alive(self):
            return not self.killed

        def join(self, timeout=None):
            calls.append(f"join {timeout}")
            if timeout == 0.2:  # the wait while it trains: Ctrl-C arrives
                raise KeyboardInterrupt

        def terminate(self):
            calls.append("terminate")  # ignored

        def kill(self):
            calls.append("kill")
            self.killed = True

    context = SimpleNamespace(Process=Stubborn)
    monkeypatch.setattr(lm_prepare, "multiprocessing",
                        SimpleNamespace(get_context=lambda method: context))
    with pytest.raises(KeyboardInterrupt):
        lm_prepare._train_tokenizer(tmp_path / "train.txt", tmp_path, {}, progress=False)
    assert calls == ["start", "join 0.2", "terminate", "join 1.0", "kill", "join None"]
