"""`make rehearsal`: the reviewer's whole path (`make reproduce-all`) at CPU size, in minutes.

The rehearsal runs the very Makefile target and CLI commands a reproduction runs, on a small
WikiText-shaped corpus written here and with every grid shrunk by `--set`/`--only`, and then
checks what a reproduction must leave behind: every claim of the claims file decided or
reported in verify.json, every figure of the paper drawn. Verdicts themselves are not
expected to pass at this size.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from perencode.analysis.plots import FIGURES
from perencode.analysis.verdicts import VERDICTS, claims_file, load_claims
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


def check_outputs(figures: str | Path, claims: str | Path = defaults.CLAIMS) -> list[str]:
    """What a finished reproduce-all must have left in `figures`: verify.json deciding or
    reporting every claim, and a file of every figure and table. Returns one line per item
    checked; raises UserError naming what is missing."""
    figures = Path(figures)
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
        drawn = sorted(p.name for p in figures.glob(f"{figure.name}*") if p.stat().st_size)
        if not drawn:
            absent.append(figure.name)
        lines.append(f"{figure.name}: {', '.join(drawn) or 'MISSING'}")
    if absent:
        raise UserError(f"{figures}: no file of {', '.join(absent)}")
    return lines
