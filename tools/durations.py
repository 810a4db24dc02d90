"""The durations the docs quote, measured by this tool and written back into the docs, so
that none is typed by hand (issue 54).

    python tools/durations.py measure NAME [NAME ...]   # or `all`; then writes the docs
    python tools/durations.py write                     # the docs from docs/durations.json
    python tools/durations.py check                     # exit 1 naming each stale quote

`measure` runs each named command (COMMANDS) from the repository root in a fresh process
and records in docs/durations.json its CPU time (user and system of the command and every
process it waited for: resource.getrusage(RUSAGE_CHILDREN)), its wall time, and the
machine: CPU model, cores, the vector ISA torch's CPU kernels use, torch's version, the
load average before it started and the date. `write` puts each record's figures into every
quote of it (QUOTES: a file and a pattern whose named groups are the figures); `check`, as
tests/test_durations.py does, says which quote differs from the record. Times are one
measurement on a shared machine: compare them as ratios measured in one run.
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs" / "durations.json"
AUTHORS = ROOT.parent / "shared" / "authors" / "position-encoded_rnn"
# Set for the commands `measure` runs: the suite it times compares the docs with records
# that this very measurement is remaking (tests/test_durations.py skips that comparison).
MEASURING = "PERENCODE_DURATIONS_MEASURING"


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]  # {python}: this interpreter; {tmp}: a fresh folder; {authors}: theirs
    what: str
    env: dict[str, str] = field(default_factory=dict)


def _perencode(*args: str) -> tuple[str, ...]:
    return ("{python}", "-m", "perencode", *args)


COMMANDS = {
    "first-train": Command(
        _perencode("train", "recipes/gru_vocab256.toml", "--device", "cpu", "--run-dir",
                   "{tmp}/run", "--set", "train.iterations=200", "--set",
                   "model.hidden_size=64", "--set", "model.embed_size=64", "--set",
                   "train.batch_size=64"),
        "README's first `train` (200 iterations of a small GRU)", {"OMP_NUM_THREADS": "1"}),
    "doctor": Command(_perencode("doctor", "--device", "cpu"),
                      "`perencode doctor` without CUDA (its CPU checks)",
                      {"OMP_NUM_THREADS": "1"}),
    "crosscheck": Command(_perencode("crosscheck", "{authors}", "--out", "{tmp}/crosscheck"),
                          "`perencode crosscheck` against the authors' code, no training"),
    "test-fast": Command(("make", "test-fast"), "`make test-fast`"),
    "test": Command(("make", "test"), "`make test`, the whole suite"),
}


@dataclass(frozen=True)
class Quote:
    name: str       # the record (COMMANDS) whose figures it quotes
    file: str       # relative to the repository root
    pattern: str    # named groups: cpu, user, system, wall, wall_min, load, machine, cores


QUOTES = (
    Quote("first-train", "README.md",
          r"200 iterations of a small GRU, (?P<cpu>[\d,]+) s of CPU time \((?P<wall>[\d,]+) s"
          r" wall at a\s+load average of (?P<load>[\d.]+) on a (?P<machine>[^;)]+);"),
    Quote("doctor", "REPRODUCE.md",
          r"still run: (?P<cpu>[\d,]+) s of CPU time \((?P<user>[\d,]+) s user, "
          r"(?P<system>[\d,]+) s\s+system; [^;]+; (?P<machine>[^;]+); (?P<wall>[\d,]+) s of "
          r"wall time at a load average of (?P<load>[\d.]+)\)"),
    Quote("crosscheck", "REPRODUCE.md",
          r"# (?P<cpu>[\d,]+) s of CPU time \(below\)"),
    Quote("crosscheck", "REPRODUCE.md",
          r"The (?P<cpu>[\d,]+) s are user \+ system CPU time of the first command as\s+"
          r"tools/durations.py measured it on a\s+(?P<machine>[^;(]+?) \(load average "
          r"(?P<load>[\d.]+);"),
    Quote("test", "Makefile",
          r"about (?P<cpu>[\d,]+) s of CPU,\"\n\t@echo \"\s+(?P<wall_min>\d+) min wall on a "
          r"(?P<machine>[^,]+), load (?P<load>[\d.]+)"),
    Quote("test-fast", "Makefile",
          r"about\"\n\t@echo \"\s+(?P<cpu>[\d,]+) s of CPU, (?P<wall>[\d,]+) s wall on a "
          r"(?P<machine>[^,]+), load (?P<load>[\d.]+)"),
)


# --------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------

def machine() -> dict[str, object]:
    """The machine a time belongs to: CPU model, cores, the ISA torch's CPU kernels use."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch
        isa, version = torch.backends.cpu.get_cpu_capability(), torch.__version__
    except Exception:  # a machine without torch still has a CPU
        isa, version = "unknown", "none"
    return {"cpu_model": model, "cores": os.cpu_count(), "isa": isa, "torch": version}


def measure(argv: list[str], env: dict[str, str] | None = None,
            cwd: Path = ROOT) -> dict[str, float]:
    """Run `argv` to its end: its CPU time (user, system: the process and every
    descendant it waited for), wall time, exit code and the load average before it."""
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    code = subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {}), MEASURING: "1"},
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    wall = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {"cpu": user + system, "user": user, "system": system, "wall": wall,
            "load": load, "exit_code": code}


def measure_named(name: str) -> dict[str, object]:
    command = COMMANDS[name]
    with tempfile.TemporaryDirectory() as tmp:
        argv = [a.format(python=sys.executable, tmp=tmp, authors=AUTHORS)
                for a in command.argv]
        times = measure(argv, command.env)
    if times["exit_code"] != 0:
        raise SystemExit(f"{name}: `{' '.join(argv)}` exited {times['exit_code']:.0f}; "
                         "nothing recorded")
    return {"what": command.what, "command": " ".join(command.argv),
            "env": command.env, **{k: round(v, 1) for k, v in times.items()},
            **machine(), "date": datetime.now(timezone.utc).strftime("%Y-%m-%d")}


# --------------------------------------------------------------------------------------
# The docs
# --------------------------------------------------------------------------------------

def machine_label(record: dict) -> str:
    """'2-core AMD EPYC': the cores and the first two words of the CPU model."""
    words = str(record["cpu_model"]).split()
    return f"{record['cores']}-core {' '.join(words[:2])}"


def figures(record: dict) -> dict[str, str]:
    """A record's figures as the docs write them."""
    return {"cpu": f"{round(record['cpu']):,}", "user": f"{round(record['user']):,}",
            "system": f"{round(record['system']):,}", "wall": f"{round(record['wall']):,}",
            "wall_min": f"{round(record['wall'] / 60)}", "load": f"{record['load']:.1f}",
            "machine": machine_label(record)}


def render(text: str, quote: Quote, record: dict) -> tuple[str, list[str]]:
    """`text` with the quote's figures set from `record`, and what differed ('the quote
    of NAME in FILE: cpu 286 -> 301'); a quote not found exactly once is an error."""
    found = list(re.finditer(quote.pattern, text))
    if len(found) != 1:
        raise ValueError(f"{quote.file}: the quote of {quote.name} found {len(found)} times "
                         f"(pattern {quote.pattern!r})")
    match, wanted = found[0], figures(record)
    differ, pieces, at = [], [], match.start()
    for group, start in sorted(((g, match.start(g)) for g in match.groupdict()),
                               key=lambda item: item[1]):
        pieces += [text[at:start], wanted[group]]
        at = match.end(group)
        if match.group(group) != wanted[group]:
            differ.append(f"{group} {match.group(group)} -> {wanted[group]}")
    new = text[:match.start()] + "".join(pieces) + text[at:]
    where = f"the quote of {quote.name} in {quote.file}"
    return new, [f"{where}: {', '.join(differ)}"] if differ else []


def records() -> dict[str, dict]:
    return json.loads(RECORDS.read_text(encoding="utf-8")) if RECORDS.is_file() else {}


def write(check_only: bool = False, root: Path = ROOT,
          recorded: dict[str, dict] | None = None) -> list[str]:
    """Every quote set from its record (files under `root`); what differed. `check_only`
    writes nothing."""
    recorded = records() if recorded is None else recorded
    stale: list[str] = []
    for file in sorted({q.file for q in QUOTES}):
        path = root / file
        text = original = path.read_text(encoding="utf-8")
        for quote in (q for q in QUOTES if q.file == file):
            if quote.name not in recorded:
                stale.append(f"the quote of {quote.name} in {file}: no record (measure it)")
                continue
            text, differ = render(text, quote, recorded[quote.name])
            stale += differ
        if text != original and not check_only:
            path.write_text(text, encoding="utf-8")
    return stale


def main(args: list[str]) -> int:
    if not args or args[0] not in ("measure", "write", "check"):
        print(__doc__)
        return 2
    if args[0] == "measure":
        names = list(COMMANDS) if args[1:] == ["all"] else args[1:]
        unknown = [n for n in names if n not in COMMANDS]
        if unknown or not names:
            print(f"measure: expected one or more of {', '.join(COMMANDS)} or all")
            return 2
        recorded = records()
        for name in names:
            print(f"measuring {name}: {' '.join(COMMANDS[name].argv)}", flush=True)
            recorded[name] = measure_named(name)
            print(f"  {recorded[name]['cpu']} s of CPU, {recorded[name]['wall']} s wall, "
                  f"load {recorded[name]['load']}", flush=True)
            RECORDS.write_text(json.dumps(recorded, indent=2) + "\n", encoding="utf-8")
    stale = write(check_only=args[0] == "check")
    if args[0] == "check":
        print("\n".join(stale) or "every quoted duration is its record's")
        return 1 if stale else 0
    print("\n".join(f"rewrote {line}" for line in stale) or "the docs were up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
