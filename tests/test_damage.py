"""Records that survive damage, and readers that say what is damaged (issues 35 and 36): an
appended metrics row is whole or absent, a damaged metrics line is skipped with a note and
every valid row after it kept (resume included), the disk-full message names the newest
checkpoint by iteration, every reader of a run's files turns bad bytes and wrong shapes into
one line naming the file (or a note, where the file is optional), and a plugin whose import
ends the process stops the command with one line naming it."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import forked
import pytest
from conftest import (
    RECIPE,
    ROOT,
    finished_run,
    flat,
    one_line,
    subprocess_env,
    tmpfs,
    train_args,
    unfinish,
)

import perencode.common.files
from perencode.common.errors import UserError
from perencode.common.files import WriteError, append_line
from perencode.store import runs
from perencode.store.records import MetricsRow

pytestmark = pytest.mark.forked_children  # the sweep's children as forks (tests/forked.py)

SETS = ("train.iterations=30", "train.checkpoint_every=10", "task.vocab_size=8", "task.length=6",
        "optim.warmup=2", "train.keep_checkpoints=\"all\"")


def _args(out: Path) -> list[str]:
    return train_args(out, *SETS)


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished tiny run: 30 iterations, a row every 5, a checkpoint every 10."""
    return finished_run(tmp_path_factory.mktemp("finished") / "run", *SETS)


def _copy(finished: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    return run


def _unfinish(run: Path) -> None:
    """The run as if killed after its step-20 checkpoint: train resumes it from there."""
    unfinish(run)
    (run / "checkpoints/step-30.pt").unlink()


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# -- 35.5: an appended row is whole or absent ----------------------------------------------

@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs (root and a mount that works), filled later by the test."""
    yield from tmpfs(tmp_path / "disk", "64k")


def test_a_row_appended_to_a_full_disk_is_absent_not_half_written(full_disk):
    path = full_disk / "metrics.jsonl"
    row = json.dumps({"step": 5, "loss": 2.1, "accuracy": 0.25, "lr": 0.001, "seconds": 0.5})
    # The file's one page holds 20 bytes more, the disk nothing: the next row half fits.
    page = os.statvfs(full_disk).f_frsize
    before = (row + "\n") * ((page - 20) // (len(row) + 1))
    before += "x" * (page - 20 - len(before) - 1) + "\n"
    path.write_text(before)
    fd = os.open(full_disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * page):
            pass
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    with pytest.raises(WriteError) as info:
        append_line(path, row)
    assert str(info.value) == (f"{path}: cannot write: no space left on device; "
                               "metrics.jsonl keeps its earlier lines")
    assert path.read_text() == before
    (full_disk / "filler").unlink()
    append_line(path, row)
    assert path.read_text() == before + row + "\n"


def test_a_write_refused_half_way_is_cut_back(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    append_line(path, '{"step": 5}')
    real = os.write

    def half(fd, data):  # writes part of the line, then finds the disk full
        if len(data) > 4:
            return real(fd, bytes(data[:4]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(perencode.common.files.os, "write", half)
    with pytest.raises(WriteError):
        append_line(path, '{"step": 10}')
    monkeypatch.undo()
    assert path.read_text() == '{"step": 5}\n'


def test_a_line_cut_by_a_killed_writer_does_not_swallow_the_next_row(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 5, "loss": 1.0, "seconds": 0.1}\n{"step": 10, "lo')
    append_line(path, '{"step": 15, "loss": 0.5, "seconds": 0.3}')
    rows = runs.Run(tmp_path).metrics()
    assert [r.step for r in rows] == [5, 15]


# -- 35.5: a damaged line is skipped, the rows after it kept, resume included ---------------

def test_a_zeroed_row_is_skipped_with_a_note_and_the_resume_keeps_the_rows_after_it(
        cli, finished, tmp_path):
    run = _copy(finished, tmp_path)
    original = _rows(run)
    lines = (run / "metrics.jsonl").read_bytes().split(b"\n")
    lines[1] = b"\0" * len(lines[1])  # the step-10 row, as after a power loss
    (run / "metrics.jsonl").write_bytes(b"\n".join(lines))
    _unfinish(run)
    code, text = cli(*_args(run))
    assert code == 0, text
    assert f"note: {run / 'metrics.jsonl'}: skipped damaged line 2 (not JSON); kept the 5 " \
        "valid rows" in flat(text)
    assert "resuming from iteration 20 of 30" in flat(text)
    rows = _rows(run)
    assert [r["step"] for r in rows] == [5, 15, 20, 25, 30]
    # The redone rows are those of the uninterrupted run (bit-identical on CPU).
    assert [r["loss"] for r in rows] == [r["loss"] for r in original if r["step"] != 10]


@pytest.mark.slow
@pytest.mark.compat
def test_figures_of_a_finished_run_with_a_damaged_row_use_its_last_row(cli, finished,
                                                                      tmp_path):
    run = _copy(finished, tmp_path)
    lines = (run / "metrics.jsonl").read_bytes().split(b"\n")
    lines[1] = b"\0" * len(lines[1])
    (run / "metrics.jsonl").write_bytes(b"\n".join(lines))
    code, text = cli("figures", run, "--out", tmp_path / "figures")
    assert code == 0, text
    assert "skipped damaged line 2 (not JSON)" in flat(text)
    import pandas as pd

    table = pd.read_csv(tmp_path / "figures/results.csv")
    last = _rows(finished)[-1]
    assert table["train_step"].tolist() == [30]
    assert table["train_loss"].tolist() == [pytest.approx(last["loss"])]


def test_the_disk_full_message_names_the_newest_checkpoint_by_iteration(cli, finished,
                                                                        tmp_path, monkeypatch):
    run = _copy(finished, tmp_path)
    _unfinish(run)
    future = 1_900_000_000  # 2030: a copy or a `touch` makes an old checkpoint look newest
    os.utime(run / "checkpoints/step-10.pt", (future, future))
    real: Callable[..., tuple[int, str]] = perencode.common.files.tempfile.mkstemp

    def full(*args, prefix="", **kwargs):
        if prefix == ".step-30.pt.":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(*args, prefix=prefix, **kwargs)

    monkeypatch.setattr(perencode.common.files.tempfile, "mkstemp", full)
    code, text = cli(*_args(run))
    line = flat(text.strip().splitlines()[-1])
    assert code == 2, text
    assert line == (f"error: {run}/checkpoints/step-30.pt: cannot write: no space left on "
                    f"device; step-30.pt was not written; the last complete checkpoint is "
                    f"{run}/checkpoints/step-20.pt: run the same command again to resume")


# -- 36.6: every reader of a run's files, every malformed form ------------------------------

def _zero_row(data: bytes) -> bytes:
    lines = data.split(b"\n")
    lines[1] = b"\0" * len(lines[1])
    return b"\n".join(lines)


def _without_seconds(data: bytes) -> bytes:
    lines = data.split(b"\n")
    row = json.loads(lines[1])
    del row["seconds"]
    lines[1] = json.dumps(row).encode()
    return b"\n".join(lines)


def _byte_ff(data: bytes) -> bytes:
    return data[:20] + b"\xff" + data[21:]


# (file, damage, what a note or the error says after the path)
METRICS = {
    "0xff byte": (_byte_ff, "skipped damaged line 1 (not UTF-8 text); kept the 5 valid rows"),
    "zeroed row": (_zero_row, "skipped damaged line 2 (not JSON); kept the 5 valid rows"),
    "row without seconds": (_without_seconds,
                            "skipped damaged line 2 (no 'seconds'); kept the 5 valid rows"),
    "not a row": (lambda d: b"[1, 2]\n" + d, "skipped damaged line 1 (not a row); kept the 6 "
                  "valid rows"),
}


@pytest.mark.slow
@pytest.mark.parametrize("form", METRICS)
def test_a_damaged_metrics_line_is_a_note_in_every_reader(cli, finished, tmp_path, form):
    damage, says = METRICS[form]
    run = _copy(finished, tmp_path)
    path = run / "metrics.jsonl"
    path.write_bytes(damage(path.read_bytes()))
    note = f"note: {path}: {says}"
    for command in (["figures", run, "--out", tmp_path / "f"],
                    ["verify", run, "--claims", "quick", "--out", tmp_path / "v"],
                    ["report", run, "--claims", "quick", "--out", tmp_path / "r"]):
        code, text = cli(*command)
        assert code == 0 and "Traceback" not in text, (command, text)
        assert flat(text).count(note) == 1, (command, text)
    _unfinish(run)
    code, text = cli(*_args(run))
    # The resume reads the same line (the last two rows gone with step-30.pt), and rewrites
    # the file without it.
    assert code == 0 and f"note: {path}: {says.split('; kept')[0]}" in flat(text), text
    assert [r["step"] for r in _rows(run)][-2:] == [25, 30]


EVAL = {"{}": (b"{}", "no whole-number 'iteration' (damaged)"),
        "[]": (b"[]", "not a JSON object (holds a list)"),
        "null": (b"null", "not a JSON object (holds null)"),
        '"high"': (b'"high"', "not a JSON object (holds a string)"),
        "a metric 'high'": (None, "'token_accuracy' is 'high', not a number (damaged)"),
        "0xff byte": (b"\xff{}", "not UTF-8 text (byte 0xff at offset 0)")}


@pytest.mark.parametrize("form", EVAL)
def test_a_damaged_eval_json_is_one_line_in_every_reader(cli, finished, tmp_path, form):
    data, says = EVAL[form]
    run = _copy(finished, tmp_path)
    path = run / "eval.json"
    if data is None:
        data = json.dumps({**json.loads(path.read_text()), "token_accuracy": "high"}).encode()
    path.write_bytes(data)
    for command in (["figures", run, "--out", tmp_path / "f"],
                    ["verify", run, "--claims", "quick", "--out", tmp_path / "v"],
                    ["report", run, "--claims", "quick", "--out", tmp_path / "r"]):
        line = one_line(*cli(*command))
        assert line.startswith(f"error: {path}: {says}"), (command, line)
        assert line.endswith(f"restore it from a copy of the run, or `perencode eval {run}` "
                             "scores the final checkpoint again"), line


@pytest.mark.slow
@pytest.mark.compat
@pytest.mark.parametrize("data, says", [(b"\xff{}", "not UTF-8 text (byte 0xff at offset 0)"),
                                        (b"[]", "not a JSON object (holds a list)")],
                         ids=["0xff byte", "a list"])
def test_a_damaged_env_json_is_a_note_in_report_and_set_aside_on_resume(cli, finished,
                                                                         tmp_path, data, says):
    run = _copy(finished, tmp_path)
    path = run / "env.json"
    path.write_bytes(data)
    code, text = cli("report", run, "--claims", "quick", "--out", tmp_path / "r")
    assert code == 0, text
    assert f"note: {path}: {says}" in flat(text)
    assert "not recorded" in (tmp_path / "r/report.html").read_text()
    _unfinish(run)
    code, text = cli(*_args(run))
    assert code == 0, text
    assert f"note: {path}: {says}" in flat(text) and "kept aside as env.json.corrupt" in \
        flat(text)
    assert (run / "env.json.corrupt").read_bytes() == data
    assert len(runs.read_json(path)["starts"]) == 1


@pytest.mark.slow
@pytest.mark.compat
def test_a_recipe_with_a_byte_order_mark_loads_and_a_bad_byte_is_one_line(cli, finished,
                                                                          tmp_path):
    run = _copy(finished, tmp_path)
    path = run / "recipe.toml"
    text = path.read_bytes()
    path.write_bytes(b"\xef\xbb\xbf" + text)
    for command in (["figures", run, "--out", tmp_path / "f"],
                    ["verify", run, "--claims", "quick", "--out", tmp_path / "v"],
                    ["eval", run, "--device", "cpu"]):
        code, out = cli(*command)
        assert code == 0, (command, out)
    path.write_bytes(text.replace(b"[model]", b"# caf\xe9\n[model]"))
    line_no = text[:text.index(b"[model]")].count(b"\n") + 1
    for command in (["figures", run, "--out", tmp_path / "f"],
                    ["verify", run, "--claims", "quick", "--out", tmp_path / "v"],
                    ["report", run, "--claims", "quick", "--out", tmp_path / "r"],
                    ["eval", run, "--device", "cpu"], _args(run)):
        line = one_line(*cli(*command))
        assert line == (f"error: {path}: not a UTF-8 text file (byte 0xe9 on line "
                        f"{line_no}); save it as UTF-8"), (command, line)


def test_a_users_recipe_with_a_byte_order_mark_trains(cli, tmp_path):
    own = tmp_path / "mine.toml"
    own.write_bytes(b"\xef\xbb\xbf" + RECIPE.read_bytes())
    args = _args(tmp_path / "run")
    args[1] = str(own)
    code, text = cli(*args)
    assert code == 0, text


@pytest.mark.parametrize("data, says", [(b"\xff", "damaged (not UTF-8 text); ignored"),
                                        (b"[1]", "damaged (not a JSON object); ignored"),
                                        (b"{", "damaged (not JSON); ignored")],
                         ids=["0xff byte", "a list", "cut short"])
def test_a_damaged_plugins_json_is_a_note_and_ignored(cli, finished, tmp_path, data, says):
    run = _copy(finished, tmp_path)
    (run / "plugins.json").write_bytes(data)
    code, text = cli("eval", run, "--device", "cpu")
    assert code == 0, text
    assert f"note: {run / 'plugins.json'}: {says}" in flat(text)


def test_a_corpus_that_is_not_utf8_is_one_line_naming_file_and_line(cli, tmp_path):
    from perencode.commands.rehearsal import write_corpus

    source = tmp_path / "raw"
    source.mkdir()
    write_corpus(source)
    path = source / "wiki.train.raw"
    lines = path.read_bytes().split(b"\n")
    lines[6] = lines[6] + b" caf\xe9"
    path.write_bytes(b"\n".join(lines))
    line = one_line(*cli("lm-prepare", "--source", source, "--out", tmp_path / "data",
                          "--vocab-size", 96, "--threads", 1, "--no-progress"))
    column = len(lines[6]) - 1 + 1
    assert line == (f"error: {path}: line 7 is not UTF-8 text (byte 0xe9 at column {column}); "
                    "WikiText's raw files are UTF-8: convert it, e.g. iconv -f latin1 -t "
                    "utf-8")
    assert not (tmp_path / "data").exists()
    assert not list(tmp_path.glob(".data.build-*"))


# -- 36.5: a plugin's import cannot end the command quietly --------------------------------

PLUGINS = {
    "sys.exit(0)": ("import sys\nsys.exit(0)\n",
                    "it called sys.exit(0) when imported; a plugin only defines and "
                    "registers kinds"),
    "sys.exit('bye')": ("raise SystemExit('bye')\n",
                        "it called sys.exit('bye') when imported; a plugin only defines and "
                        "registers kinds"),
    "argparse": ("import argparse\nparser = argparse.ArgumentParser()\n"
                 "parser.add_argument('--scale')\nparser.parse_args()\n",
                 "it parses the command line when imported (argparse: unrecognized "
                 "arguments: --plugin"),
    "an exception": ("raise ValueError('no GPU found')\n", "ValueError: no GPU found"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", PLUGINS)
def test_a_plugin_whose_import_ends_the_process_is_one_line_and_exit_2(tmp_path, case):
    source, says = PLUGINS[case]
    plugin = tmp_path / "bad_plugin.py"
    plugin.write_text(source)
    sweep = ["sweep", str(ROOT / "recipes/paper/fig02_gru_reverse.toml"), "--runs",
             str(tmp_path / "runs"), "--dry-run"]
    for command in (_args(tmp_path / "run"), *([sweep] if case == "sys.exit(0)" else [])):
        done = forked.run(["--plugin", plugin, *command], env=subprocess_env(), timeout=120)
        text = done.stdout + done.stderr
        line = one_line(done.returncode, text)
        assert line.startswith(f"error: plugin {plugin}: importing it failed: {says}"), line
        assert "usage:" not in text
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_what_a_plugin_prints_when_imported_still_shows(tmp_path, capsys):
    from perencode.config import plugins

    plugin = tmp_path / "chatty_plugin.py"
    plugin.write_text("import sys\nprint('chatty plugin loaded')\n"
                      "print('to stderr', file=sys.stderr)\n")
    try:
        loaded = plugins.load(str(plugin))
        assert loaded.file == str(plugin.resolve())
        said = capsys.readouterr()
        assert said.out == "chatty plugin loaded\n" and said.err == "to stderr\n"
    finally:  # leave this process's plugins as they were
        plugins._LOADED.pop(str(plugin.resolve()), None)
        sys.modules.pop("chatty_plugin", None)
    with pytest.raises(UserError, match="no such file"):
        plugins.load(str(tmp_path / "missing.py"))


def test_a_sweeps_progress_reads_past_damaged_rows(tmp_path):
    from perencode.commands.sweep.cells import last_rows

    rows = [{"step": 5, "loss": 2.0, "seconds": 1.0}, {"step": 10, "loss": 1.5, "seconds": 2.0}]
    (tmp_path / "metrics.jsonl").write_bytes(
        b"".join(json.dumps(r).encode() + b"\n" for r in rows)
        + b'[1]\n{"step": 15, "loss": 1.0}\n\xff\xfe\n')
    assert last_rows(tmp_path) == [MetricsRow(**r) for r in rows]
