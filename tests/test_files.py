"""perencode.common.files: refused writes become one line, stale temporary files, torch's
messages."""

import errno
import os
import tempfile

import pytest
import torch

from perencode.common import files
from perencode.common.errors import UserError, refused_write
from perencode.common.files import (
    TEMP_RE,
    CorruptCheckpoint,
    WriteError,
    append_line,
    atomic_write_bytes,
    atomic_write_text,
    remove_stale_temps,
)
from perencode.store.checkpoints import safe_torch_load


def refuse(code: int):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return fail


@pytest.mark.parametrize("code, reason", [(errno.ENOSPC, "no space left on device"),
                                          (errno.EDQUOT, "disk quota exceeded"),
                                          (errno.EACCES, "permission denied"),
                                          (errno.EROFS, "read-only file system")])
def test_a_refused_atomic_write_is_one_line_and_keeps_the_old_file(tmp_path, monkeypatch,
                                                                     code, reason):
    path = tmp_path / "results.csv"
    atomic_write_text(path, "old\n")
    monkeypatch.setattr(files.os, "fsync", refuse(code))
    with pytest.raises(WriteError) as info:
        atomic_write_text(path, "new\n")
    message = str(info.value)
    assert message == f"{path}: cannot write: {reason}; the previous results.csv is kept"
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["results.csv"]  # no temporary file

    with pytest.raises(WriteError, match="fresh.json was not written"):
        atomic_write_text(tmp_path / "fresh.json", "{}")
    assert not (tmp_path / "fresh.json").exists()


def test_other_os_errors_are_not_disguised(tmp_path, monkeypatch):
    monkeypatch.setattr(files.os, "fsync", refuse(errno.EIO))
    with pytest.raises(OSError) as info:
        atomic_write_text(tmp_path / "a.txt", "x")
    assert not isinstance(info.value, UserError)


def test_a_refused_append_leaves_no_half_line(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    append_line(path, '{"step": 5}')
    monkeypatch.setattr(files.os, "fsync", refuse(errno.ENOSPC))
    with pytest.raises(WriteError, match="metrics.jsonl keeps its earlier lines"):
        append_line(path, '{"step": 10}')
    monkeypatch.undo()
    assert path.read_text() == '{"step": 5}\n'
    append_line(path, '{"step": 10}')
    assert path.read_text() == '{"step": 5}\n{"step": 10}\n'


def test_the_temp_pattern_is_exactly_what_the_writers_make(tmp_path):
    fd, name = tempfile.mkstemp(prefix=".step-10.pt.", suffix=".tmp", dir=tmp_path)
    os.close(fd)
    match = TEMP_RE.match(os.path.basename(name))
    assert match and match.group("target") == "step-10.pt"
    for foreign in (".notes.tmp", "results.csv.abcdefgh.tmp", ".a.abc.tmp", ".a.ABCDEFGH.tmp",
                    ".a.abcdefgh.tmp.bak"):
        assert not TEMP_RE.match(foreign), foreign


def test_remove_stale_temps_removes_only_the_package_s_own(tmp_path):
    ours = [tmp_path / ".results.csv.k3j_9xq2.tmp", tmp_path / ".eval.json.abcdefgh.tmp"]
    theirs = [tmp_path / name for name in (".notes.tmp", "results.csv", "x.abcdefgh.tmp",
                                           ".verify.md.abcdefgh.tmp")]
    for path in ours + theirs:
        path.write_text("x")
    removed = remove_stale_temps(tmp_path, lambda name: not name.startswith("verify"))
    assert sorted(removed) == sorted(ours)
    assert sorted(tmp_path.iterdir()) == sorted(theirs)
    assert remove_stale_temps(tmp_path / "absent") == []


def test_checkpoint_errors_carry_no_terminal_codes(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "step-1.pt"
    torch.save({"format": "perencode-checkpoint", "x": Evil()}, path)
    with pytest.raises(CorruptCheckpoint) as info:
        safe_torch_load(path, "perencode-checkpoint")
    message = str(info.value)
    assert "\x1b" not in message and "\n" not in message
    assert message.startswith(f"{path}: not a readable perencode checkpoint")
    assert "print" in message  # what torch refused, not its advice on unsafe loading
    assert files.plain("\x1b[1mbold\x1b[0m text") == "bold text"


def test_written_files_get_the_usual_mode_not_mkstemp_s(tmp_path):
    """Results on a shared filesystem stay readable by the group, as open() would make them."""
    path = tmp_path / "eval.json"
    atomic_write_text(path, "{}")
    mask = os.umask(0o022)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


def test_disk_error_is_refused_write_and_what_is_kept(tmp_path):
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # no filename: the path is named
    assert refused_write(full, tmp_path / "a.csv") == \
        f"{tmp_path / 'a.csv'}: cannot write: no space left on device"
    assert str(files.disk_error(full, tmp_path / "a.csv", "a.csv was not written")) == \
        f"{tmp_path / 'a.csv'}: cannot write: no space left on device; a.csv was not written"
    assert refused_write(full) == "a file: cannot write: no space left on device"
    no_lock = OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
    assert "refuses file locks" in str(refused_write(no_lock))
    assert files.disk_error(no_lock, tmp_path / "a.csv", "kept") is None  # a lock, not a write


def test_a_temporary_file_can_be_named_apart_from_its_target(tmp_path, monkeypatch):
    made = []
    mkstemp = tempfile.mkstemp

    def spy(**kwargs):
        made.append(mkstemp(**kwargs))
        return made[-1]

    monkeypatch.setattr(files.tempfile, "mkstemp", spy)
    atomic_write_bytes(tmp_path / "events.out.tfevents.1", b"x", temp_name="truncating")
    match = TEMP_RE.match(os.path.basename(made[0][1]))
    assert match and match.group("target") == "truncating"
    assert [p.name for p in tmp_path.iterdir()] == ["events.out.tfevents.1"]
    assert (tmp_path / "events.out.tfevents.1").read_bytes() == b"x"
