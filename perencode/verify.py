"""Check the paper's claims against finished runs (`perencode verify`).

A claims file (data/paper_claims.toml, data/quick_claims.toml) is a list of `[[claim]]`
tables. Each names the rows it is about (`table` and `where`: filters on recipe fields
and table columns), the metric, the cells it holds in (`by`, `cells`) and a test:

    threshold    statistic(metric) OP value in the cells
    difference   statistic over rows `a` minus over rows `b` (e.g. PE minus vanilla) OP value;
                 with `than = "<claim id>"`: |this difference| - |that claim's| OP value
    trend        statistic at the last value of `along` minus at its first OP value
    lowest       the value of `along` where the statistic is lowest is `expect`
    approx       |statistic - value| <= tolerance (the paper's numbers, Table 1)

The statistic is taken over runs (one value per run: the mean of its matching rows, weighted
by `n` where the table has it), i.e. over seeds; the reproduced value comes with its 95%
percentile-bootstrap CI (10,000 resamples). Verdicts: pass, fail, or not run (no matching
runs). The verdict uses the point estimate; the CI shows how firm it is.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rich.table import Table

from perencode.errors import UserError
from perencode.figures import BOOKKEEPING, Results, collect
from perencode.io import atomic_write_json, atomic_write_text
from perencode.progress import console
from perencode.recipe import read_toml
from perencode.stats import bootstrap_ci, bootstrap_diff_ci
from perencode.sweep import short_key

OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
TABLES = ("runs", "by_band", "by_condition", "by_length", "stability", "curves")


class Claim(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(description="Short unique name, e.g. 'fig2-gru-pe-95'.")
    statement: str = Field(description="The claim in words, no stronger than the paper's.")
    source: str = Field("", description="Where the paper says it (section, figure, SPEC §8).")
    paper: str = Field("", description="The paper's value or wording.")
    table: Literal[TABLES] = Field("runs", description="Rows: runs (eval.json), by_band, "
                                   "by_condition, by_length, stability or curves.")
    where: dict[str, Any] = Field({}, description="Filters: column = value | [values] | "
                                  "{min, max, not, missing}.")
    metric: str = Field(description="The column compared.")
    statistic: Literal["mean", "min", "max"] = Field("mean", description="Over runs (seeds).")
    by: list[str] = Field([], description="Columns whose values make the cells.")
    cells: Literal["all", "any", "first", "last"] = Field(
        "all", description="Cells that must pass: all, any, or the first/last by `by[0]`.")
    test: Literal["threshold", "difference", "trend", "lowest", "approx"]
    op: Literal[">", ">=", "<", "<="] = ">"
    value: float = 0.0
    tolerance: float = Field(0.0, ge=0.0, description="approx: allowed |difference|.")
    a: dict[str, Any] = Field({}, description="difference: filters of the first group.")
    b: dict[str, Any] = Field({}, description="difference: filters of the second group.")
    along: str | None = Field(None, description="trend / lowest: the ordered column.")
    expect: Any = Field(None, description="lowest: the value of `along` expected lowest.")
    than: str | None = Field(None, description="difference: id of the claim whose "
                             "difference this one's is compared with (in magnitude).")


def load_claims(path: str | Path) -> list[Claim]:
    data = read_toml(path)
    items = data.get("claim")
    if not isinstance(items, list) or not items:
        raise UserError(f"{path}: no [[claim]] tables")
    claims = []
    for i, item in enumerate(items):
        try:
            claim = Claim.model_validate(item)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"]) or "claim"
            name = item.get("id", f"#{i + 1}") if isinstance(item, dict) else f"#{i + 1}"
            raise UserError(f"{path}: claim {name}: {where}: {err['msg']}") from None
        problem = _check(claim)
        if problem:
            raise UserError(f"{path}: claim {claim.id}: {problem}")
        claims.append(claim)
    ids = [c.id for c in claims]
    for claim in claims:
        if ids.count(claim.id) > 1:
            raise UserError(f"{path}: claim id '{claim.id}' appears twice")
        if claim.than is not None and claim.than not in ids:
            raise UserError(f"{path}: claim {claim.id}: than = '{claim.than}' is no claim's id")
    return claims


def _check(claim: Claim) -> str:
    if claim.test == "difference" and not (claim.a and claim.b):
        return "test = 'difference' needs filters `a` and `b`"
    if claim.test in ("trend", "lowest") and claim.along is None:
        return f"test = '{claim.test}' needs `along`"
    if claim.test == "lowest" and claim.expect is None:
        return "test = 'lowest' needs `expect`"
    if claim.than is not None and claim.test != "difference":
        return "`than` applies to test = 'difference' only"
    return ""


# --------------------------------------------------------------------------------------
# Rows, runs, cells
# --------------------------------------------------------------------------------------

def select(df: pd.DataFrame, filters: dict[str, Any], source: str) -> pd.DataFrame:
    for column, rule in filters.items():
        if column not in df.columns:
            raise UserError(f"{source}: no column '{column}' to filter on")
        values = df[column]
        if isinstance(rule, dict):
            keep = pd.Series(True, index=df.index)
            if "missing" in rule:
                keep &= values.isna() if rule["missing"] else values.notna()
            if "min" in rule:
                keep &= values >= rule["min"]
            if "max" in rule:
                keep &= values <= rule["max"]
            if "not" in rule:
                banned = rule["not"] if isinstance(rule["not"], list) else [rule["not"]]
                keep &= ~values.isin(banned)
        elif isinstance(rule, list):
            keep = values.isin(rule)
        else:
            keep = values == rule
        df = df[keep]
    return df


def per_run(df: pd.DataFrame, keys: list[str], metric: str) -> pd.DataFrame:
    """One value per run and cell: the mean of its rows (weighted by `n` if present)."""
    weights = df["n"] if "n" in df.columns else pd.Series(1.0, index=df.index)
    work = df.assign(_w=weights.astype(float), _wm=df[metric].astype(float) * weights)
    out = work.groupby(["run", *keys], dropna=False, as_index=False)[["_w", "_wm"]].sum()
    return out.assign(value=out["_wm"] / out["_w"])[["run", *keys, "value"]]


def _cells(df: pd.DataFrame, keys: list[str]) -> list[tuple[tuple, np.ndarray]]:
    """(cell key, per-run values) sorted by key."""
    if not keys:
        return [((), df["value"].to_numpy())]
    groups = df.groupby(keys, dropna=False, sort=True)
    return [(k if isinstance(k, tuple) else (k,), g["value"].to_numpy()) for k, g in groups]


def _stat(values: np.ndarray, statistic: str) -> tuple[float, float, float]:
    if statistic == "mean":
        return bootstrap_ci(values)
    v = float(getattr(np, statistic)(values))
    return v, math.nan, math.nan


def _diff(a: np.ndarray, b: np.ndarray, statistic: str) -> tuple[float, float, float]:
    if statistic == "mean":
        return bootstrap_diff_ci(a, b)
    return float(getattr(np, statistic)(a) - getattr(np, statistic)(b)), math.nan, math.nan


def _mixed(df: pd.DataFrame, claim: Claim, recipe_columns: list[str]) -> list[str]:
    """Recipe fields that differ among the matched runs but are no part of the claim."""
    used = {*claim.where, *claim.by, *claim.a, *claim.b, claim.along, *BOOKKEEPING}
    return [c for c in recipe_columns if c in df.columns and c not in used
            and df[c].nunique(dropna=False) > 1]


# --------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------

class Scored(NamedTuple):
    """One cell of a claim: its reproduced value and whether the claim holds there."""
    cell: tuple
    value: float
    low: float
    high: float
    ok: bool
    margin: float  # how far inside (+) or outside (-) the claim the value lies
    runs: int


@dataclass
class Outcome:
    claim: Claim
    verdict: str                     # pass, fail, not run
    value: float = math.nan          # the reproduced number the verdict rests on
    low: float = math.nan
    high: float = math.nan
    shown: str = ""                  # value, CI and the cell it comes from, for people
    coverage: str = ""
    note: str = ""
    cells: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        c = self.claim
        return {"id": c.id, "statement": c.statement, "source": c.source, "paper": c.paper,
                "verdict": self.verdict, "reproduced": self.shown,
                "value": None if math.isnan(self.value) else self.value,
                "ci95": None if math.isnan(self.low) else [self.low, self.high],
                "coverage": self.coverage, "note": self.note, "cells": self.cells}


def _fmt(value: float, low: float, high: float) -> str:
    text = f"{value:.4g}"
    return text if math.isnan(low) else f"{text} [{low:.4g}, {high:.4g}]"


def _describe(keys: list[str], cell: tuple) -> str:
    return ", ".join(f"{short_key(k)}={v}" for k, v in zip(keys, cell))


def _coverage(claim: Claim, found: list[tuple]) -> str:
    """'3/4 cells' when `where` lists the values of a `by` column and some have no runs."""
    expected = 1
    for key in claim.by:
        rule = claim.where.get(key)
        if not isinstance(rule, list):
            return ""
        expected *= len(rule)
    return f"{len(found)}/{expected} cells" if len(found) < expected else ""


def evaluate(claim: Claim, results: Results, done: dict[str, Outcome]) -> Outcome:
    source = f"claim {claim.id}"
    rows = results.table(claim.table)
    if claim.table != "curves":  # training curves of unfinished runs count too
        rows = rows[rows["complete"].astype(bool)]
    if rows.empty:  # e.g. no run wrote stability.csv: its columns do not exist either
        return Outcome(claim, "not run", note=f"no finished run has table '{claim.table}'")
    rows = select(rows, claim.where, source)
    if claim.metric not in rows.columns and not rows.empty:
        raise UserError(f"{source}: metric '{claim.metric}' is not a column of table "
                        f"'{claim.table}'")
    if rows.empty:
        return Outcome(claim, "not run", note="no finished run matches")
    mixed = _mixed(rows, claim, results.recipe_columns)
    if mixed:
        return Outcome(claim, "not run", note=f"runs of different settings match ({mixed[0]} "
                       "varies); narrow `where`")
    keys = claim.by + ([claim.along] if claim.along else [])
    if claim.test == "difference":
        return _difference(claim, rows, done, source)
    values = per_run(rows, keys, claim.metric)
    if claim.test in ("trend", "lowest"):
        return _along(claim, values)
    scored = []
    for cell, vals in _cells(values, claim.by):
        v, lo, hi = _stat(vals, claim.statistic)
        if claim.test == "approx":
            off = abs(v - claim.value)
            scored.append(Scored(cell, v, lo, hi, off <= claim.tolerance, -off, len(vals)))
        else:
            scored.append(_against(claim, cell, (v, lo, hi), len(vals)))
    return _verdict(claim, scored)


def _against(claim: Claim, cell: tuple, estimate: tuple[float, float, float],
             runs: int) -> Scored:
    """A cell's (value, low, high) compared with the claim's `op value`."""
    v, lo, hi = estimate
    sign = 1 if claim.op in (">", ">=") else -1
    return Scored(cell, v, lo, hi, OPS[claim.op](v, claim.value), (v - claim.value) * sign,
                  runs)


def _verdict(claim: Claim, scored: list[Scored]) -> Outcome:
    """Pick the deciding cell: the worst for 'all', the best for 'any', else first/last."""
    if claim.cells == "all":
        pick, ok = min(scored, key=lambda s: s.margin), all(s.ok for s in scored)
    elif claim.cells == "any":
        pick, ok = max(scored, key=lambda s: s.margin), any(s.ok for s in scored)
    else:
        pick = scored[0] if claim.cells == "first" else scored[-1]
        ok = pick.ok
    where = _describe(claim.by, pick.cell)
    details = [{"cell": _describe(claim.by, s.cell), "value": s.value, "low": s.low,
                "high": s.high, "runs": s.runs, "pass": bool(s.ok)} for s in scored]
    return Outcome(claim, "pass" if ok else "fail", pick.value, pick.low, pick.high,
                   _fmt(pick.value, pick.low, pick.high) + (f" ({where})" if where else ""),
                   _coverage(claim, [s.cell for s in scored]), cells=details)


def _difference(claim: Claim, rows: pd.DataFrame, done: dict[str, Outcome],
                source: str) -> Outcome:
    a = per_run(select(rows, claim.a, source), claim.by, claim.metric)
    b = per_run(select(rows, claim.b, source), claim.by, claim.metric)
    if a.empty or b.empty:
        missing = "a" if a.empty else "b"
        return Outcome(claim, "not run", note=f"no finished run in group {missing}")
    b_cells = dict(_cells(b, claim.by))
    scored = [_against(claim, cell, _diff(vals, b_cells[cell], claim.statistic),
                       len(vals) + len(b_cells[cell]))
              for cell, vals in _cells(a, claim.by) if cell in b_cells]
    if not scored:
        return Outcome(claim, "not run", note="groups a and b share no cell")
    if claim.than is not None:
        return _than(claim, scored, done.get(claim.than))
    return _verdict(claim, scored)


def _than(claim: Claim, scored: list[Scored], other: Outcome | None) -> Outcome:
    """|this difference| - |the other claim's deciding difference| OP value."""
    if claim.cells in ("all", "any") and len(scored) > 1:
        raise UserError(f"claim {claim.id}: with `than`, set cells = 'first' or 'last' (or "
                        "narrow `where` to one cell)")
    if other is None or other.verdict == "not run":
        return Outcome(claim, "not run", note=f"claim {claim.than} was not run")
    pick = scored[-1] if claim.cells == "last" else scored[0]
    d, v = pick.value, abs(pick.value) - abs(other.value)
    where = _describe(claim.by, pick.cell)
    return Outcome(claim, "pass" if OPS[claim.op](v, claim.value) else "fail", v,
                   shown=f"|{d:.4g}|{' (' + where + ')' if where else ''} - "
                         f"|{other.value:.4g}| ({claim.than}) = {v:.4g}")


def _along(claim: Claim, values: pd.DataFrame) -> Outcome:
    scored = []
    for cell, part in (values.groupby(claim.by, dropna=False, sort=True) if claim.by
                       else [((), values)]):
        cell = cell if isinstance(cell, tuple) else (cell,)
        series = {key[0]: vals for key, vals in _cells(part, [claim.along])}
        order = sorted(series)
        if claim.test == "trend":
            if len(order) < 2:
                continue
            first, last = series[order[0]], series[order[-1]]
            scored.append(_against(claim, cell, _diff(last, first, claim.statistic),
                                   len(first) + len(last)))
        else:
            stats = {k: _stat(series[k], claim.statistic)[0] for k in order}
            lowest = min(stats, key=stats.get)
            ok = str(lowest) == str(claim.expect)
            expected = stats.get(claim.expect, math.nan)
            gap = min((s for k, s in stats.items() if str(k) != str(claim.expect)),
                      default=math.nan) - expected
            scored.append(Scored(cell, gap, math.nan, math.nan, ok, gap,
                                 sum(map(len, series.values()))))
    if not scored:
        return Outcome(claim, "not run", note=f"fewer than two values of {claim.along}")
    outcome = _verdict(claim, scored)
    if claim.test == "lowest":
        outcome.shown = f"next lowest minus {claim.expect}: {outcome.shown}"
    return outcome


# --------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------

VERDICT_STYLE = {"pass": "bold green", "fail": "bold red", "not run": "yellow"}


def _reproduced(o: Outcome) -> str:
    extra = "; ".join(x for x in (o.coverage, o.note) if x)
    return (o.shown or "-") + (f" ({extra})" if extra else "")


def report_markdown(outcomes: list[Outcome], claims_path: Path, run_paths: list[Path]) -> str:
    counts = {v: sum(o.verdict == v for o in outcomes) for v in VERDICT_STYLE}
    lines = [f"# Claims of {claims_path} checked against {', '.join(map(str, run_paths))}", "",
             f"{counts['pass']} pass, {counts['fail']} fail, {counts['not run']} not run. "
             "Reproduced values: mean over seeds [95% percentile-bootstrap CI, 10,000 "
             "resamples] in the deciding cell.", "",
             "| claim | statement | paper | reproduced | verdict |", "|---|---|---|---|---|"]
    for o in outcomes:
        cells = (o.claim.id, o.claim.statement, o.claim.paper, _reproduced(o), o.verdict)
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def verify_runs(runs: list[Path], claims: Path = Path("data/paper_claims.toml"),
                out: Path = Path("figures")) -> int:
    """Evaluate every claim; print a table, write verify.md and verify.json into `out`.
    Returns 1 if an evaluated claim fails, else 0."""
    claims_path = Path(claims)
    parsed = load_claims(claims_path)
    results = collect([Path(p) for p in runs])
    done: dict[str, Outcome] = {}
    for claim in sorted(parsed, key=lambda c: c.than is not None):  # referenced ones first
        done[claim.id] = evaluate(claim, results, done)
    outcomes = [done[c.id] for c in parsed]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "verify.md", report_markdown(outcomes, claims_path, runs))
    atomic_write_json(out / "verify.json", {"claims": str(claims_path),
                                            "runs": [str(p) for p in runs],
                                            "results": [o.as_dict() for o in outcomes]})
    table = Table(title=f"claims of {claims_path}")
    for col in ("claim", "paper", "reproduced (95% CI)", "verdict"):
        table.add_column(col, overflow="fold")
    for o in outcomes:
        table.add_row(f"{o.claim.id}: {o.claim.statement}", o.claim.paper, _reproduced(o),
                      f"[{VERDICT_STYLE[o.verdict]}]{o.verdict}")
    console.print(table)
    console.print(f"wrote {out / 'verify.md'} and {out / 'verify.json'}", highlight=False)
    return 1 if any(o.verdict == "fail" for o in outcomes) else 0
