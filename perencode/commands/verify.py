"""Check the paper's claims against finished runs (`perencode verify`): the verdicts of
perencode.analysis.verdicts printed as a table and written as verify.md and verify.json. Only a fail
makes `perencode verify` exit 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from perencode.analysis import sequential
from perencode.analysis.machines import machine_note
from perencode.analysis.results import say_left_out
from perencode.analysis.verdicts import (
    BUNDLED_CLAIMS,
    FAIL,
    INCONCLUSIVE,
    NOT_RUN,
    PASS,
    RULE,
    Checked,
    Outcome,
    adjusted,
    check_claims,
    claims_file,
    outside_plan,
    paper_interval,
    reproduced,
    tested,
)
from perencode.common import defaults
from perencode.common.console import console, results
from perencode.common.files import atomic_write_json, atomic_write_text, remove_stale_temps
from perencode.store.lock import hold

VERDICT_STYLE = {INCONCLUSIVE: "bold yellow", FAIL: "bold red", NOT_RUN: "yellow",
                 PASS: "bold green"}


def in_report_order(outcomes: list[Outcome]) -> list[Outcome]:
    """Inconclusive claims first (they need more seeds), then the rest in file order."""
    return sorted(outcomes, key=lambda o: o.verdict != INCONCLUSIVE)


def _ids(outcomes: list[Outcome]) -> str:
    return ", ".join(o.claim.id for o in outcomes)


def report_markdown(checked: Checked, run_paths: list[Path]) -> str:
    lines = [f"# Claims of {checked.claims_path} checked against "
             f"{', '.join(map(str, run_paths))}", "", checked.summary(), "", RULE, ""]
    if checked.decided:
        lines += ["| claim | statement | paper | reproduced [one-sided bounds] | tests | "
                  "decided by | p of the claim (Holm, BH q) | paper's bootstrap 95% CI | "
                  "verdict |", "|---|---|---|---|---|---|---|---|---|"]
        for o in in_report_order(checked.decided):
            cells = (o.claim.id, o.claim.statement, o.claim.paper, reproduced(o), tested(o),
                     o.method, adjusted(o), paper_interval(o),
                     f"{o.verdict} (description)" if o.description else o.verdict)
            lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
        lines.append("")
    groups = checked.not_run()
    if groups:
        lines += ["## Not run", ""]
        lines += [f"- {reason}. Claims ({len(group)}): {_ids(group)}" for reason, group in groups]
    return "\n".join(lines) + "\n"


def default_out(claims: str | Path) -> Path:
    """Where verify writes without --out: figures/ for a bundled claims file, figures/<its
    name>/ for one of one's own, so that its verdicts never replace the paper's verify.md
    (nor another claims file's)."""
    path = claims_file(claims)
    bundled = path.resolve().parent == BUNDLED_CLAIMS.resolve()
    return defaults.FIGURES if bundled else defaults.FIGURES / path.stem


def staged(plan: Path) -> tuple[dict[str, float], str]:
    """The alpha shares of a staged plan's look (sequential.plan_shares); a file that is no
    plan.json is refused by outside_plan."""
    try:
        data = json.loads(Path(plan).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}, ""
    return sequential.plan_shares(data) if isinstance(data, dict) else ({}, "")


def verify_runs(runs: list[Path], claims: str | Path = defaults.CLAIMS,
                out: Path | None = None, as_json: bool = False,
                accept_code_change: bool = False, plan: Path | None = None) -> int:
    """Evaluate every claim; print a summary, the decided claims and the reasons of those
    not run (`as_json`: the whole verify.json document on stdout instead), and write
    verify.md and verify.json into `out` (None: `default_out`). Returns 1 if a claim fails
    (inconclusive and not run do not fail), else 0."""
    out = default_out(claims) if out is None else out
    shares, look = staged(plan) if plan is not None else ({}, "")
    checked = check_claims(runs, claims, accept_code_change=accept_code_change,
                           alpha_shares=shares)
    for o in checked.outcomes:  # a staged plan's look: its share of the claim's alpha
        if o.claim.id in shares and o.method:
            o.method += f"; {look}: alpha x {shares[o.claim.id]:.3g}"
    if plan is not None:
        outside_plan(checked, plan)
    say_left_out(checked.results)
    # The quick demo's numbers quoted in README and REPRODUCE.md: their digits hold on their
    # machine only, the verdicts and the direction everywhere.
    note = machine_note([Path(p) for p in checked.results.runs["run"]]) \
        if checked.claims_path.name == "quick.toml" else None
    if note:
        console.print(note, highlight=False, soft_wrap=True)
    outcomes = checked.outcomes
    document = checked.as_json(runs)
    out = Path(out)
    # The lock `figures` takes on the same folder; what a killed verify left is cleared.
    with hold(out, "verify"):
        remove_stale_temps(out, lambda name: name.startswith("verify"))
        atomic_write_text(out / "verify.md", report_markdown(checked, runs))
        atomic_write_json(out / "verify.json", document)
    if as_json:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        _print(checked)
    # Results on stdout, unless stdout carries the JSON document alone.
    (console if as_json else results).print(f"wrote {out / 'verify.md'} and "
                                            f"{out / 'verify.json'}", highlight=False)
    return 1 if any(o.verdict == FAIL for o in outcomes) else 0


def _print(checked: Checked) -> None:
    results.print(checked.summary(), highlight=False)
    if checked.decided:
        table = Table(title=f"claims of {checked.claims_path}")
        for col in ("claim", "paper", "reproduced [one-sided bounds]", "tests; decided by",
                    "p (Holm, BH q)", "verdict"):
            table.add_column(col, overflow="fold")
        for o in in_report_order(checked.decided):
            table.add_row(escape(f"{o.claim.id}: {o.claim.statement}"), escape(o.claim.paper),
                          escape(reproduced(o)), escape(f"{tested(o)}; {o.method}"),
                          adjusted(o), f"[{VERDICT_STYLE[o.verdict]}]{o.verdict}"
                          + (" (description)" if o.description else ""))
        results.print(table)
    for reason, group in checked.not_run():
        results.print(f"[yellow]not run[/] ({len(group)}): {escape(reason)}\n    "
                      f"{_ids(group)}", highlight=False)
