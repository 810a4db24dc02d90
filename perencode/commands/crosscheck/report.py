"""A crosscheck's result: one `Comparison` per quantity compared, shown as a table and
written as crosscheck.md and crosscheck.json."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rich.markup import escape

from perencode.common.files import atomic_write_json, atomic_write_text

AGREE, DISAGREE, NOT_RUN = "agree", "disagree", "not run"
# `--train` only: the equivalence test could not decide with the seeds given.
UNDECIDED = "undecided"
DTYPES = ("fp32", "fp64")


@dataclass
class Comparison:
    """One comparison of perencode with the authors' code.

    tolerance/error: per precision ("fp32", "fp64"), the largest error allowed and the one
    measured (a check without a float path states one tolerance for both).
    theirs: what of the authors' code the check runs. difference: the documented
    difference (REPRODUCE.md) the check confirms, if it checks one.
    """

    name: str
    compared: str
    theirs: str
    tolerance: dict[str, float] = field(default_factory=dict)
    error: dict[str, float] = field(default_factory=dict)
    unit: str = "max |ours - theirs|"
    verdict: str = AGREE
    reason: str = ""
    difference: str = ""

    def settle(self) -> Comparison:
        """Verdict from the errors: agree when each is within its tolerance."""
        if self.verdict in (NOT_RUN, UNDECIDED):
            return self
        over = [d for d in self.error
                if not (math.isfinite(self.error[d]) and self.error[d] <= self.tolerance[d])]
        if over:
            self.verdict = DISAGREE
            detail = ", ".join(f"{d}: {self.error[d]:.3g} > {self.tolerance[d]:.3g}"
                               for d in over)
            self.reason = f"{detail}; {self.reason}" if self.reason else detail
        return self


def numeric(name: str, compared: str, theirs: str, tolerance: dict[str, float],
            error: dict[str, float], **extra) -> Comparison:
    return Comparison(name, compared, theirs, tolerance, error, **extra).settle()


def _fmt(values: dict[str, float]) -> str:
    if not values:
        return "-"
    if len(set(values.values())) == 1 and len(values) == len(DTYPES):
        return f"{next(iter(values.values())):.2g} (both)"
    return " / ".join(f"{values[d]:.2g}" for d in DTYPES if d in values)


def verdict_text(check: Comparison) -> str:
    text = check.verdict
    if check.reason:
        text += f": {check.reason}"
    if check.difference and check.verdict == AGREE:
        text += f" (documented difference: {check.difference})"
    return text


COLOUR = {AGREE: "green", DISAGREE: "bold red", NOT_RUN: "yellow", UNDECIDED: "yellow"}
NAME_WIDTH = 34  # the longest check names ("training loop: lstm variable_length") fit


def lines(checks: list[Comparison], width: int) -> list[str]:
    """One line per check for a terminal `width` columns wide (rich markup): the verdict, the
    check's name, and its largest errors (agree) or its reason (otherwise), cut at the
    width; crosscheck.md has the rest."""
    out = []
    name_width = min(NAME_WIDTH, max((len(c.name) for c in checks), default=0))
    for c in checks:
        if c.verdict == AGREE:
            # A documented difference says more than its zero error.
            detail = (f"documented: {c.difference}" if c.difference else
                      f"max error {_fmt(c.error)}" if c.error else "")
        else:
            detail = c.reason
        text = f"{c.name:<{name_width}} {detail}".rstrip()
        room = max(width - 10, 20)  # the verdict takes 9 columns and a space
        if len(text) > room:
            text = text[:room - 1] + "…"
        out.append(f"[{COLOUR[c.verdict]}]{c.verdict:<9}[/] {escape(text)}")
    return out


def markdown(checks: list[Comparison], header: list[str]) -> str:
    lines = ["# perencode crosscheck", "", *header, "",
             "| check | compared | authors' code run | tolerance fp32 / fp64 | "
             "max error fp32 / fp64 | verdict |", "|---|---|---|---|---|---|"]
    for c in checks:
        error = f"{_fmt(c.error)} ({c.unit})" if c.error else "-"
        cells = [c.name, c.compared, c.theirs, _fmt(c.tolerance), error, verdict_text(c)]
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    return "\n".join(lines) + "\n"


def write(out: Path, checks: list[Comparison], header: list[str], meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "crosscheck.md", markdown(checks, header))
    atomic_write_json(out / "crosscheck.json", meta | {"checks": [
        asdict(c) | {"error": {k: (v if math.isfinite(v) else str(v))
                               for k, v in c.error.items()}} for c in checks]})
