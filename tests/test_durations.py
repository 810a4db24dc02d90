"""tools/durations.py: every duration the docs quote is a record the tool measured, with its
CPU time and machine; a number typed over it is caught."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("durations", ROOT / "tools" / "durations.py")
assert spec is not None and spec.loader is not None
durations = importlib.util.module_from_spec(spec)
sys.modules["durations"] = durations
spec.loader.exec_module(durations)


remaking = pytest.mark.skipif(bool(os.environ.get(durations.MEASURING)),
                              reason="tools/durations.py is remaking the records")


@remaking
def test_every_quoted_duration_is_its_record():
    """The committed docs say what docs/durations.json recorded, figure for figure."""
    assert durations.write(check_only=True) == []


@remaking
def test_every_record_names_its_cpu_time_and_machine():
    recorded = durations.records()
    assert set(recorded) == set(durations.COMMANDS)
    assert {q.name for q in durations.QUOTES} == set(durations.COMMANDS)
    for name, record in recorded.items():
        assert record["command"] == " ".join(durations.COMMANDS[name].argv)
        assert record["exit_code"] == 0
        assert record["cpu"] == pytest.approx(record["user"] + record["system"], abs=0.15)
        assert record["cpu"] > 0 and record["wall"] > 0 and record["load"] >= 0
        assert record["cores"] >= 1 and record["cpu_model"] and record["isa"]
        assert record["torch"] and len(record["date"]) == 10


@remaking
def test_a_number_typed_over_a_record_is_named(tmp_path):
    for file in {q.file for q in durations.QUOTES}:
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / file, tmp_path / file)
    record = durations.records()["crosscheck"]
    typed = tmp_path / "REPRODUCE.md"
    quoted = f"# {round(record['cpu']):,} s of CPU time (below)"
    text = typed.read_text()
    assert quoted in text
    typed.write_text(text.replace(quoted, "# 47 s of CPU time (below)"))
    stale = durations.write(check_only=True, root=tmp_path)
    assert stale == [f"the quote of crosscheck in REPRODUCE.md: cpu 47 -> "
                     f"{round(record['cpu']):,}"]
    assert durations.write(root=tmp_path) == stale  # written back
    assert typed.read_text() == text and durations.write(check_only=True, root=tmp_path) == []


def test_a_quote_the_tool_cannot_find_is_an_error():
    record = {"cpu": 1.0, "user": 1.0, "system": 0.0, "wall": 1.0, "load": 0.0,
              "cpu_model": "x", "cores": 1}
    with pytest.raises(ValueError, match="found 0 times"):
        durations.render("nothing quoted here", durations.QUOTES[0], record)


def test_rendering_sets_each_figure_from_the_record():
    record = {"cpu": 1234.4, "user": 1200.2, "system": 34.2, "wall": 754.6, "load": 1.26,
              "cpu_model": "AMD EPYC 9654 96-Core Processor", "cores": 2}
    quote = next(q for q in durations.QUOTES if q.file == "Makefile" and q.name == "test")
    text = ('x about 9 s of CPU,"\n\t@echo "     3 min wall on a 1-core Some CPU, '
            'load 0.1 (tools/durations.py)"')
    new, differ = durations.render(text, quote, record)
    assert new == ('x about 1,234 s of CPU,"\n\t@echo "     13 min wall on a 2-core AMD EPYC, '
                   'load 1.3 (tools/durations.py)"')
    assert differ == ["the quote of test in Makefile: cpu 9 -> 1,234, wall_min 3 -> 13, "
                      "machine 1-core Some CPU -> 2-core AMD EPYC, load 0.1 -> 1.3"]


@pytest.mark.slow
@pytest.mark.compat
def test_measure_counts_the_cpu_of_a_command_and_its_children():
    """CPU time, not wall time: a child that spins 0.4 s and sleeps 0.4 s in a grandchild."""
    spin = ("import time, subprocess, sys\n"
            "end = time.process_time() + 0.4\n"
            "while time.process_time() < end: pass\n"
            "subprocess.run([sys.executable, '-c', 'import time; time.sleep(0.4)'])\n")
    times = durations.measure([sys.executable, "-c", spin])
    assert times["exit_code"] == 0
    assert 0.4 <= times["cpu"] < times["wall"]
    assert times["wall"] >= 0.8
    assert durations.measure([sys.executable, "-c", "raise SystemExit(3)"])["exit_code"] == 3
