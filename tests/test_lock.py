"""perencode.store.lock: one holder per directory, across processes, surviving a SIGKILL."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
from conftest import PYTHON, subprocess_env

from perencode.common.errors import UserError
from perencode.store.lock import LOCK_NAME, Locked, hold

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and fork")

HOLDER = """
import sys
from perencode.store.lock import hold
with hold(sys.argv[1], sys.argv[2]):
    print("held", flush=True)
    sys.stdin.readline()
"""


def start_holder(directory, purpose="train", **env) -> subprocess.Popen:
    """A process holding `directory` until its stdin gets a line (or it is killed)."""
    proc = subprocess.Popen([PYTHON, "-c", HOLDER, str(directory), purpose],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**subprocess_env(), **env})
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    return proc


def release(proc: subprocess.Popen) -> None:
    assert proc.stdin is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(timeout=30) == 0


def test_hold_records_the_holder_and_leaves_nothing_behind(tmp_path):
    run = tmp_path / "a" / "run"
    with hold(run, "train"):
        record = json.loads((run / LOCK_NAME).read_text())
        assert record["pid"] == os.getpid()
        assert record["host"] == socket.gethostname()
        assert record["purpose"] == "train"
        assert record["since"].endswith(" UTC")
    assert list(run.iterdir()) == []


def test_a_second_process_is_refused_with_one_line_naming_the_holder(tmp_path):
    proc = start_holder(tmp_path, "train")
    try:
        with pytest.raises(Locked) as info, hold(tmp_path, "eval"):
            pass
        message = str(info.value)
        assert "\n" not in message
        assert f"pid {proc.pid} on {socket.gethostname()}" in message
        assert "`train`" in message and "since 20" in message
        assert str(tmp_path / LOCK_NAME) in message  # what to do if the holder is lost
    finally:
        release(proc)
    with hold(tmp_path, "eval"):  # released: free again
        pass


def test_a_lock_left_by_a_killed_process_is_taken_over(tmp_path, capsys):
    proc = start_holder(tmp_path, "train")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == proc.pid  # left behind
    with hold(tmp_path, "train"):
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    note = capsys.readouterr().err
    assert f"pid {proc.pid}" in note and "taking over" in note


def test_the_same_process_cannot_hold_a_directory_twice(tmp_path):
    with hold(tmp_path, "sweep"):
        with pytest.raises(Locked, match="already in use by this process"), \
                hold(tmp_path / "." , "train"):
            pass
        with hold(tmp_path / "cell", "train"):  # another directory: fine
            pass
    with pytest.raises(RuntimeError), hold(tmp_path, "train"):
        raise RuntimeError("boom")
    with hold(tmp_path, "train"):  # an exception released it
        pass


def test_children_do_not_inherit_the_lock(tmp_path):
    """A sweep holding its tree starts `perencode train` children on the cells."""
    child = [PYTHON, "-c", "import sys; from perencode.store.lock import hold\n"
             "with hold(sys.argv[1], 'train'): pass", ]
    with hold(tmp_path, "sweep"):
        cell = subprocess.run([*child, str(tmp_path / "cell")], env=subprocess_env(),
                              capture_output=True, text=True)
        assert cell.returncode == 0, cell.stderr
        tree = subprocess.run([*child, str(tmp_path)], env=subprocess_env(),
                              capture_output=True, text=True)
        assert tree.returncode != 0 and "Locked" in tree.stderr


def test_a_requeued_slurm_job_takes_its_run_back(tmp_path, monkeypatch, capsys):
    """A lost node's lock can outlive its job; the job's requeued run knows it has ended."""
    proc = start_holder(tmp_path, "train", SLURM_JOB_ID="77", SLURM_RESTART_COUNT="0")
    try:
        monkeypatch.setenv("SLURM_JOB_ID", "78")  # another job: refused
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
        with pytest.raises(Locked, match="SLURM job 77"), hold(tmp_path, "train"):
            pass
        monkeypatch.setenv("SLURM_JOB_ID", "77")
        monkeypatch.setenv("SLURM_RESTART_COUNT", "0")  # the same run of it: refused
        with pytest.raises(Locked), hold(tmp_path, "train"):
            pass
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # its requeued run: taken back
        with hold(tmp_path, "train"):
            record = json.loads((tmp_path / LOCK_NAME).read_text())
            assert record["pid"] == os.getpid() and record["slurm_restart"] == 1
        assert "requeued SLURM job" in capsys.readouterr().err
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_file_in_the_way_is_a_user_error(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(UserError, match="not a directory"), hold(tmp_path / "f", "train"):
        pass
