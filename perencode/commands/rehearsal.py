"""`make rehearsal`: the reviewer's whole path (`make reproduce-all`) at CPU size, in minutes.

The rehearsal runs the very Makefile target and CLI commands a reproduction runs, on a small
WikiText-shaped corpus written here and with every grid shrunk by `--set`/`--only`, and then
checks what a reproduction must leave behind: every claim of the claims file decided or
reported in verify.json, every figure of the paper drawn. The paper's verdicts mean nothing
at this size; the rehearsal's own claims (perencode/claims/rehearsal.toml: the paper's tests
and tables at the effects tiny runs show) must be decided, pass or fail, through every
verdict path the paper's claims take (`verdict_paths`, `check_paths`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from perencode.analysis.plots import FIGURES
from perencode.analysis.verdicts import FAIL, PASS, VERDICTS, Claim, claims_file, load_claims
from perencode.common import defaults
from perencode.common.errors import UserError


def write_corpus(folder: str | Path, seed: int = 0) -> dict[str, dict]:
    """wiki.{train,valid,test}.raw shaped like WikiText-103 raw (headings, blank lines,
    paragraphs of Zipf-distributed made-up words); returns, by split, the paragraphs
    written and the number of headings. `train` also holds one paragraph of 80 words and
    two of a single piece, for the truncation and the leaving-out rules."""
    folder = Path(folder)
    rng = random.Random(seed)
    syllables = ["ka", "to", "ri", "mu", "sen", "la", "po", "dra", "ne", "vo", "shi", "el"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 3))) for _ in range(400)]
    weights = [1 / (i + 1) for i in range(len(words))]
    written = {}
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in {"train": 300, "valid": 40, "test": 40}.items():
        lines, paragraphs = [" ", f" = {split.title()} Article = ", " ", ""], []
        for i in range(n):
            if i % 50 == 25:
                lines += [" = = Section = = ", " "]
            text = " " + " ".join(rng.choices(words, weights, k=rng.randint(1, 14))) + " . "
            paragraphs.append(text)
            lines += [text, " "]
        if split == "train":
            paragraphs += [" " + " ".join(rng.choices(words, weights, k=80)) + " . ", " . ",
                           f" {words[0]} "]
            lines += [paragraphs[-3], " ", " = = = Deep heading = = = ", paragraphs[-2],
                      paragraphs[-1], ""]
        written[split] = {"paragraphs": paragraphs,
                          "headings": sum(line.startswith(" = ") for line in lines)}
        (folder / f"wiki.{split}.raw").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return written


def planned_figures(plan: str | Path) -> set[str]:
    """The figures a plan's grids can draw: those of the paper figure numbers its grid files
    name (fig02_gru_reverse-1.toml: fig02; fig15_table1_...: fig15 and table1)."""
    try:
        grids = json.loads(Path(plan).read_text(encoding="utf-8"))["grids"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{plan}: not a plan.json of `perencode plan --write` ({exc})") from None
    numbers = set()
    for name in grids:
        parts = Path(name).stem.split("_")
        numbers.add(parts[0])
        if len(parts) > 1 and parts[1].startswith("table"):
            numbers.add(parts[1])
    return {f.name for f in FIGURES if f.name.split("_")[0] in numbers}


def check_outputs(figures: str | Path, claims: str | Path = defaults.CLAIMS,
                  plan: str | Path | None = None) -> list[str]:
    """What a finished reproduce-all must have left in `figures`: verify.json deciding or
    reporting every claim, and a file of every figure and table (of a plan: those of its
    grids, `planned_figures`). Returns one line per item checked; raises UserError naming
    what is missing."""
    figures = Path(figures)
    expected_figures = None if plan is None else planned_figures(plan)
    report = figures / "verify.json"
    if not report.is_file():
        raise UserError(f"{report}: not found; `perencode verify` did not finish")
    results = {r["id"]: r["verdict"] for r in json.loads(report.read_text())["results"]}
    expected = [c.id for c in load_claims(claims_file(claims))]
    missing = [c for c in expected if results.get(c) not in VERDICTS]
    if missing:
        raise UserError(f"{report}: {len(missing)} claim(s) neither decided nor reported: "
                        f"{', '.join(missing[:5])}")
    counts = {v: sum(results[c] == v for c in expected) for v in VERDICTS}
    shown = ", ".join(f"{n} {v}" for v, n in counts.items())
    lines = [f"claims: {len(expected)} reported ({shown})"]
    absent = []
    for figure in FIGURES:
        if expected_figures is not None and figure.name not in expected_figures:
            continue
        drawn = sorted(p.name for p in figures.glob(f"{figure.name}*") if p.stat().st_size)
        if not drawn:
            absent.append(figure.name)
        lines.append(f"{figure.name}: {', '.join(drawn) or 'MISSING'}")
    if absent:
        raise UserError(f"{figures}: no file of {', '.join(absent)}")
    return lines


# The verdict paths a rehearsal must decide a claim through (pass or fail): the tests, the
# rules over several cells, the tables and the two kinds of test the paper's claims take
# (perencode.analysis.verdicts). A plan's rehearsal needs those of the claims it decides.
REQUIRED_PATHS = ("test threshold", "test difference", "test trend", "cells all (several)",
                  "cells first", "cells last", "table runs", "table by_band",
                  "table stability", "t test", "exact test (constant cells)")
REHEARSAL_CLAIMS = "rehearsal"


def static_paths(claim: Claim) -> set[str]:
    """The paths a claim takes whatever its runs: its test, table and cells rule."""
    paths = {f"test {claim.test}", f"table {claim.table}"}
    if claim.than is not None:
        paths.add("test difference than another claim")
    if claim.by and claim.cells in ("first", "last", "any"):
        paths.add(f"cells {claim.cells}")
    if claim.statistic != "mean":
        paths.add("observed min/max (no test)")
    return paths


def verdict_paths(claim: Claim, result: dict) -> set[str]:
    """The paths one verdict of verify.json went through: static_paths, the kind of test
    its method names, and 'cells all (several)' when it combined more than one cell."""
    paths = static_paths(claim)
    method = result.get("method") or ""
    if "exact" in method:
        paths.add("exact test (constant cells)")
    if "Student t" in method or "Welch t" in method:
        paths.add("t test")
    if claim.cells == "all" and len(result.get("cells") or []) > 1:
        paths.add("cells all (several)")
    return paths


def required_paths(plan: Path | None = None, claims: str | Path = defaults.CLAIMS) -> list[str]:
    """REQUIRED_PATHS; for a plan (plan.json), those its decided claims take, and the t test."""
    if plan is None:
        return list(REQUIRED_PATHS)
    try:
        decided = set(json.loads(Path(plan).read_text(encoding="utf-8"))["decided"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{plan}: not a plan.json of `perencode plan --write` ({exc})") from None
    taken = {"t test"}
    for claim in load_claims(claims_file(claims)):
        if claim.id in decided:
            taken |= static_paths(claim)
            if claim.by and claim.cells == "all":
                taken.add("cells all (several)")
    return [p for p in REQUIRED_PATHS if p in taken]


def check_paths(verdicts: str | Path, required: list[str],
                claims: str | Path = REHEARSAL_CLAIMS, both: bool = True) -> list[str]:
    """That the rehearsal claims' verify.json (`verdicts`) decided a claim, pass or fail,
    through every path of `required`, and (`both`) that a pass and a fail happened: a
    plan's arms may leave the failing claims without runs. One line per path (the claims
    that decided it); UserError naming the paths left undecided, with why their claims
    were not decided."""
    verdicts = Path(verdicts)
    if not verdicts.is_file():
        raise UserError(f"{verdicts}: not found; `perencode verify RUNS --claims rehearsal` "
                        "did not finish")
    parsed = {c.id: c for c in load_claims(claims_file(claims))}
    results = json.loads(verdicts.read_text(encoding="utf-8"))["results"]
    by_path: dict[str, list[str]] = {}
    undecided: dict[str, list[str]] = {}
    for result in results:
        claim = parsed.get(result["id"])
        if claim is None:
            continue
        decided = result["verdict"] in (PASS, FAIL)
        for path in verdict_paths(claim, result) if decided else static_paths(claim):
            target = by_path if decided else undecided
            target.setdefault(path, []).append(
                f"{claim.id} {result['verdict']}" if decided else
                f"{claim.id}: {result['verdict']}"
                + (f" ({result['note']})" if result.get("note") else ""))
    missing = [p for p in required if p not in by_path]
    if missing:
        why = "; ".join(f"{p}: {'; '.join(undecided.get(p, ['no claim takes it'])[:2])}"
                        for p in missing)
        raise UserError(f"{verdicts}: {len(missing)} verdict path(s) decided by no claim: "
                        f"{why}")
    outcomes = {r["verdict"] for r in results}
    for verdict in (PASS, FAIL) if both else ():
        if verdict not in outcomes:
            raise UserError(f"{verdicts}: no claim {verdict}s; the rehearsal claims must "
                            "decide both ways")
    counts = {v: sum(r["verdict"] == v for r in results) for v in VERDICTS}
    lines = [f"rehearsal claims: {len(results)} ("
             + ", ".join(f"{n} {v}" for v, n in counts.items()) + ")"]
    lines += [f"path {p}: {', '.join(by_path[p][:4])}" for p in required]
    also = sorted(set(by_path) - set(required))
    if also:
        lines.append(f"also decided: {', '.join(also)}")
    return lines
