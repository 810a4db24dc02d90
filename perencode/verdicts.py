"""The paper's claims judged on collected runs: the claims file, each claim's verdict and
the whole file's (`check_claims`), which `perencode verify` and `perencode report` show.

A claims file (the bundled perencode/claims/paper.toml, quick.toml, quick_gpu.toml, or any
file of the same grammar) is a list of `[[claim]]`
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
percentile-bootstrap CI (10,000 resamples). Verdicts account for the seeds (`three_way`):
pass when the CI lies entirely on the claimed side of the threshold, fail when it lies
entirely on the other side, inconclusive when it straddles it or a group has one run (no
CI); not run when no run matches, with the reason: the claim's filters that the runs nearest
to matching fail and the values they have there ("need model.hidden_size = 512, the
nearest runs have 32"), or the field that varies within one of the claim's groups though
the claim does not name it (runs of different settings would be pooled). Only a fail makes
`perencode verify` exit 1.
"""

from __future__ import annotations

import difflib
import json
import math
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from perencode import defaults
from perencode.errors import UserError
from perencode.naming import short_key
from perencode.recipe import BOOKKEEPING, read_toml
from perencode.results import Results, collect
from perencode.stats import bootstrap_ci, bootstrap_diff_ci
from perencode.validation import validate_table

OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
Tables = Literal["runs", "by_band", "by_condition", "by_length", "stability", "curves"]


class Claim(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(description="Short unique name, e.g. 'fig2-gru-pe-95'.")
    statement: str = Field(description="The claim in words, no stronger than the paper's.")
    source: str = Field("", description="Where the paper says it (section, figure, "
                        "docs/paper-facts.md#paper-claims).")
    paper: str = Field("", description="The paper's value or wording.")
    table: Tables = Field("runs", description="Rows: runs (eval.json), by_band, "
                                   "by_condition, by_length, stability or curves.")
    where: dict[str, Any] = Field({}, description="Filters: column = value | [values] | "
                                  "{min, max, not, missing}.")
    metric: str = Field(description="The column compared.")
    statistic: Literal["mean", "min", "max"] = Field("mean", description="Over runs (seeds).")
    by: list[str] = Field([], description="Columns whose values make the cells.")
    cells: Literal["all", "any", "first", "last"] = Field(
        "all", description="Cells that must pass: all, any, or the first/last by `by[0]`.")
    test: Literal["threshold", "difference", "trend", "lowest", "approx"] = Field(
        description="threshold: statistic OP value in the cells; difference: group a minus "
        "group b OP value; trend: at the last value of `along` minus at its first OP value; "
        "lowest: `expect` is where the statistic is lowest; approx: within value +- "
        "tolerance.")
    op: Literal[">", ">=", "<", "<="] = Field(">", description="The comparison with `value`.")
    value: float = Field(0.0, description="The threshold (approx: the paper's value).")
    tolerance: float = Field(0.0, ge=0.0, description="approx: allowed |difference|.")
    a: dict[str, Any] = Field({}, description="difference: filters of the first group.")
    b: dict[str, Any] = Field({}, description="difference: filters of the second group.")
    along: str | None = Field(None, description="trend / lowest: the ordered column.")
    expect: Any = Field(None, description="lowest: the value of `along` expected lowest.")
    than: str | None = Field(None, description="difference: id of the claim whose "
                             "difference this one's is compared with (in magnitude).")

    @model_validator(mode="after")
    def _complete(self) -> Claim:
        if self.test == "difference" and not (self.a and self.b):
            raise ValueError("field 'a': test = 'difference' needs filters `a` and `b`")
        if self.test in ("trend", "lowest") and self.along is None:
            raise ValueError(f"field 'along': test = '{self.test}' needs `along`")
        if self.test == "lowest" and self.expect is None:
            raise ValueError("field 'expect': test = 'lowest' needs `expect`")
        if self.than is not None and self.test != "difference":
            raise ValueError("field 'than': applies to test = 'difference' only")
        return self


def claims_schema() -> dict[str, Any]:
    """The JSON Schema of a claims file: a non-empty array `claim` of Claim tables."""
    claim = Claim.model_json_schema()
    return {"title": "perencode claims file", "type": "object", "required": ["claim"],
            "properties": {"claim": {"type": "array", "minItems": 1, "items": claim,
                                     "description": "The claims, one [[claim]] table each; "
                                     "ids unique."}}}


# Package data: installed with the wheel, so `verify` and `quickstart` find the claims in a
# container or any install without a checkout.
BUNDLED_CLAIMS = Path(__file__).parent / "claims"


def claims_file(spec: str | Path) -> Path:
    """A claims file: an existing path, or the name of a bundled one (paper, quick,
    quick_gpu)."""
    path = Path(spec)
    if path.is_file():
        return path
    bundled = BUNDLED_CLAIMS / f"{spec}.toml"
    if path.name == str(spec) and bundled.is_file():
        return bundled
    names = ", ".join(sorted(p.stem for p in BUNDLED_CLAIMS.glob("*.toml")))
    raise UserError(f"{spec}: claims file not found; give a path or a bundled claims file: "
                    f"{names}")


def load_claims(path: str | Path) -> list[Claim]:
    path = claims_file(path)
    data = read_toml(path)
    items = data.get("claim")
    if not isinstance(items, list) or not items:
        raise UserError(f"{path}: no [[claim]] tables")
    claims = []
    for i, item in enumerate(items):
        name = item.get("id", f"#{i + 1}") if isinstance(item, dict) else f"#{i + 1}"
        claims.append(validate_table(Claim, item, f"{path}: claim {name}", top="the claim"))
    ids = [c.id for c in claims]
    for claim in claims:
        if ids.count(claim.id) > 1:
            raise UserError(f"{path}: claim id '{claim.id}' appears twice")
        if claim.than is not None and claim.than not in ids:
            raise UserError(f"{path}: claim {claim.id}: than = '{claim.than}' is no claim's id")
    return claims


# --------------------------------------------------------------------------------------
# Rows, runs, cells
# --------------------------------------------------------------------------------------

def select(df: pd.DataFrame, filters: dict[str, Any], source: str) -> pd.DataFrame:
    for column, rule in filters.items():
        if column not in df.columns:
            raise UserError(f"{source}: no column '{column}' to filter on"
                            f"{_did_you_mean(column, df.columns)}")
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


def _did_you_mean(name: str, columns) -> str:
    close = difflib.get_close_matches(name, [str(c) for c in columns], n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


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


def _groups(df: pd.DataFrame, claim: Claim, source: str) -> tuple[pd.DataFrame, list[str]]:
    """The rows the claim compares and the columns whose values make its groups: its cells
    (`by`, `along`) and, for a difference, the side (a or b) a row is on."""
    keys = [k for k in (*claim.by, claim.along) if k is not None and k in df.columns]
    if claim.test != "difference":
        return df, keys
    side = pd.Series(None, index=df.index, dtype=object)
    side[side.index.isin(select(df, claim.b, source).index)] = "b"
    side[side.index.isin(select(df, claim.a, source).index)] = "a"
    return df.assign(_side=side)[side.notna()], [*keys, "_side"]


def _mixed(df: pd.DataFrame, claim: Claim, recipe_columns: list[str],
           source: str) -> tuple[str, list, str] | None:
    """A recipe field that varies within one of the claim's groups though the claim does
    not name it: runs of different settings that one statistic would pool. (field, its
    values there, the group) or None. A field fixed within each group mixes nothing (the
    three architectures' own vocabulary sizes under by = ["model.arch"]), as in `figures`."""
    used = {*claim.where, *claim.by, *claim.a, *claim.b, claim.along, *BOOKKEEPING}
    varying = [c for c in recipe_columns if c in df.columns and c not in used
               and df[c].nunique(dropna=False) > 1]
    if not varying:
        return None
    rows, keys = _groups(df, claim, source)
    parts = rows.groupby(keys, dropna=False, sort=True) if keys else [((), rows)]
    for cell, part in parts:
        for column in varying:
            if part[column].nunique(dropna=False) > 1:
                cell = cell if isinstance(cell, tuple) else (cell,)
                named = [(k, v) for k, v in zip(keys, cell) if k != "_side"]
                group = ", ".join(f"{short_key(k)}={v}" for k, v in named)
                if "_side" in keys:
                    group = ", ".join(x for x in (group, f"group {cell[-1]}") if x)
                return column, _values(part[column]), group
    return None


def _values(column: pd.Series) -> list:
    """The distinct values of a column, sorted (numbers as numbers), None for unset."""
    values = [None if pd.isna(v) else (v.item() if hasattr(v, "item") else v)
              for v in column.drop_duplicates()]
    return sorted(values, key=lambda v: (v is None, not isinstance(v, (int, float)),
                                         v if isinstance(v, (int, float)) else str(v)))


def _text(value: Any) -> str:
    if value is None:
        return "unset"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _shown(values: list, limit: int = 5) -> str:
    text = ", ".join(map(_text, values[:limit]))
    return text + (f" and {len(values) - limit} more" if len(values) > limit else "")


def _rule(rule: Any) -> str:
    """A `where` filter in words: '= 512', 'in 32, 64', '>= 3', 'not 1-16'."""
    if isinstance(rule, list):
        return f"in {_shown(rule, 8)}"
    if isinstance(rule, dict):
        words = []
        if "min" in rule:
            words.append(f">= {_text(rule['min'])}")
        if "max" in rule:
            words.append(f"<= {_text(rule['max'])}")
        if "not" in rule:
            banned = rule["not"] if isinstance(rule["not"], list) else [rule["not"]]
            words.append(f"not {_shown(banned, 8)}")
        if "missing" in rule:
            words.append("unset" if rule["missing"] else "set")
        return " and ".join(words)
    return f"= {_text(rule)}"


def excluded(df: pd.DataFrame, filters: dict[str, Any], source: str) -> list[dict]:
    """Why no row of `df` passes `filters`: the filters that the rows nearest to passing
    (those failing the fewest) fail, each with what it needs, the values those rows have
    there and how many runs they are; [] when some row passes."""
    if df.empty:
        return []
    passes = {column: df.index.isin(select(df, {column: rule}, source).index)
              for column, rule in filters.items()}
    failed = sum((~keep).astype(int) for keep in passes.values())
    if not filters or failed.min() == 0:
        return []
    nearest = failed == failed.min()
    return [{"field": column, "need": filters[column], "needs": _rule(filters[column]),
             "have": _values(df.loc[nearest & ~keep, column]),
             "runs": int(df.loc[nearest & ~keep, "run"].nunique())}
            for column, keep in passes.items() if (nearest & ~keep).any()]


def because(found: list[dict], group: str = "", shown: int = 3) -> str:
    """'need model.hidden_size = 512 (the nearest runs have 32), model.arch = lstm (gru)':
    the first `shown` fields (all of them are in verify.json's `excluded`)."""
    clauses = [f"{x['field']} {x['needs']} ({'the nearest runs have ' if i == 0 else ''}"
               f"{_shown(x['have'])})" for i, x in enumerate(found[:shown])]
    more = len(found) - shown
    rest = f" and {more} more field{'s' * (more > 1)}" if more > 0 else ""
    who = f"group {group} needs" if group else "need"
    return f"{who} {', '.join(clauses)}{rest}" if found else ""


# --------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------

PASS, FAIL, INCONCLUSIVE, NOT_RUN = "pass", "fail", "inconclusive", "not run"
VERDICTS = (PASS, FAIL, INCONCLUSIVE, NOT_RUN)
ONE_SEED = "one run per group: no confidence interval, so no verdict"


def three_way(holds, low: float, high: float) -> str:
    """The verdict of a claim `holds(x)` about a quantity whose 95% CI is [low, high]:
    pass when it holds over the whole interval, fail when it holds nowhere on it,
    inconclusive when the interval straddles the claim's boundary. Only the two ends are
    looked at, so `holds` must be monotone in x (a threshold `x OP value`); the tolerance
    band of `approx`, which holds on an interval of x, is decided by `_near` instead."""
    at_low, at_high = holds(low), holds(high)
    if at_low and at_high:
        return PASS
    if not at_low and not at_high:
        return FAIL
    return INCONCLUSIVE


class Scored(NamedTuple):
    """One cell of a claim: its reproduced value, its CI and the verdict there."""
    cell: tuple
    value: float
    low: float
    high: float
    verdict: str   # pass, fail or inconclusive
    margin: float  # how far inside (+) or outside (-) the claim the point estimate lies
    runs: int
    note: str = ""


@dataclass
class Outcome:
    claim: Claim
    verdict: str                     # pass, fail, inconclusive, not run
    value: float = math.nan          # the reproduced number the verdict rests on
    low: float = math.nan
    high: float = math.nan
    shown: str = ""                  # value, CI and the cell it comes from, for people
    coverage: str = ""
    note: str = ""                   # for a claim not run: the reason, in words
    cells: list[dict] = field(default_factory=list)
    excluded: list[dict] = field(default_factory=list)  # not run: the filters no run passes
    runs: list[str] = field(default_factory=list)       # the run directories it rests on

    def as_dict(self) -> dict:
        c = self.claim
        return {"id": c.id, "statement": c.statement, "source": c.source, "paper": c.paper,
                "verdict": self.verdict, "reproduced": self.shown,
                "value": None if math.isnan(self.value) else self.value,
                "ci95": None if math.isnan(self.low) else [self.low, self.high],
                "coverage": self.coverage, "note": self.note, "cells": self.cells,
                "excluded": self.excluded, "runs": self.runs}


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
    every = results.table(claim.table)
    rows = every
    if claim.table != "curves":  # training curves of unfinished runs count too
        rows = rows[rows["complete"].astype(bool)]
    if rows.empty:  # e.g. no run wrote stability.csv: its columns do not exist either
        return _count_diverged(Outcome(claim, NOT_RUN, note=_no_table(claim.table, results)),
                               results)
    matched = select(rows, claim.where, source)
    if claim.metric not in matched.columns and not matched.empty:
        raise UserError(f"{source}: metric '{claim.metric}' is not a column of table "
                        f"'{claim.table}'{_did_you_mean(claim.metric, matched.columns)}")
    if matched.empty:
        waiting = results.runs.loc[results.runs["status"] == "unfinished", "run"]
        unfinished = select(every[every["run"].isin(waiting)], claim.where,
                            source)["run"].nunique()
        if unfinished:
            return _count_diverged(Outcome(claim, NOT_RUN, note="only unfinished runs "
                                           f"match ({unfinished})"), results)
        found = excluded(rows, claim.where, source)
        return _count_diverged(Outcome(claim, NOT_RUN, note=because(found), excluded=found),
                               results)
    rows = matched
    mixed = _mixed(rows, claim, results.recipe_columns, source)
    if mixed:
        column, values, group = mixed
        return Outcome(claim, NOT_RUN, note=f"runs of different settings match: {column} "
                       f"takes {_shown(values)}{' within ' + group if group else ''}; "
                       "narrow `where`")
    keys = claim.by + ([claim.along] if claim.along else [])
    if claim.test == "difference":
        outcome = _difference(claim, rows, done, source)
    else:
        values = per_run(rows, keys, claim.metric)
        if claim.test in ("trend", "lowest"):
            outcome = _along(claim, values)
        else:
            scored = []
            for cell, vals in _cells(values, claim.by):
                v, lo, hi = _stat(vals, claim.statistic)
                if claim.test == "approx":
                    scored.append(_near(claim, cell, (v, lo, hi), len(vals)))
                else:
                    scored.append(_against(claim, cell, (v, lo, hi), len(vals), len(vals)))
            outcome = _verdict(claim, scored)
    if outcome.verdict != NOT_RUN:  # a difference rests on its groups' runs alone
        outcome.runs = sorted(set(_groups(rows, claim, source)[0]["run"]))
    return _count_diverged(outcome, results)


def _count_diverged(outcome: Outcome, results: Results) -> Outcome:
    """Name the diverged runs of the claim's cells (the `where` fields of the runs table
    they match): counted there, never as numbers."""
    diverged = results.diverged()
    where = {k: v for k, v in outcome.claim.where.items() if k in diverged.columns}
    found = len(select(diverged, where, f"claim {outcome.claim.id}")) if len(diverged) else 0
    if found:
        said = f"{found} diverged run(s) match, counted without a value"
        outcome.note = f"{outcome.note}; {said}" if outcome.note else said
    return outcome


def _no_table(table: str, results: Results) -> str:
    finished = int(results.runs["complete"].sum())
    if table == "stability":
        return (f"none of the {finished} finished runs has stability.csv (`perencode "
                "stability RUN` writes it; grids with `after = [\"stability\"]` run it)")
    return f"none of the {finished} finished runs has rows of table '{table}'"


def _near(claim: Claim, cell: tuple, estimate: tuple[float, float, float],
          runs: int) -> Scored:
    """approx: pass when the CI lies within value +- tolerance, fail when it lies wholly
    outside, else inconclusive."""
    v, lo, hi = estimate
    if runs < 2:
        return Scored(cell, v, lo, hi, INCONCLUSIVE, -abs(v - claim.value), runs, ONE_SEED)
    low, high = _interval(estimate)
    band = (claim.value - claim.tolerance, claim.value + claim.tolerance)
    if band[0] <= low and high <= band[1]:
        verdict = PASS
    elif high < band[0] or low > band[1]:
        verdict = FAIL
    else:
        verdict = INCONCLUSIVE
    return Scored(cell, v, lo, hi, verdict, -abs(v - claim.value), runs)


def _interval(estimate: tuple[float, float, float]) -> tuple[float, float]:
    """The CI of an estimate; min/max over seeds have none and decide on the value itself
    (a claim about every seed, not about a mean)."""
    v, lo, hi = estimate
    return (v, v) if math.isnan(lo) else (lo, hi)


def _against(claim: Claim, cell: tuple, estimate: tuple[float, float, float], seeds: int,
             runs: int) -> Scored:
    """A cell's (value, low, high) compared with the claim's `op value`; `seeds` is the
    smallest number of runs behind one side of the estimate."""
    v, lo, hi = estimate
    margin = (v - claim.value) * (1 if claim.op in (">", ">=") else -1)
    if seeds < 2:
        return Scored(cell, v, lo, hi, INCONCLUSIVE, margin, runs, ONE_SEED)
    verdict = three_way(lambda x: OPS[claim.op](x, claim.value), *_interval(estimate))
    return Scored(cell, v, lo, hi, verdict, margin, runs)


RANK = {FAIL: 0, INCONCLUSIVE: 1, PASS: 2}


def _verdict(claim: Claim, scored: list[Scored]) -> Outcome:
    """Combine the cells: 'all' passes when every cell passes and fails when one fails;
    'any' passes when one passes and fails when all fail; else inconclusive. The cell
    shown is the one that decides (the worst for 'all', the best for 'any')."""
    if claim.cells == "all":
        pick = min(scored, key=lambda s: (RANK[s.verdict], s.margin))
    elif claim.cells == "any":
        pick = max(scored, key=lambda s: (RANK[s.verdict], s.margin))
    else:
        pick = scored[0] if claim.cells == "first" else scored[-1]
    where = _describe(claim.by, pick.cell)
    details = [{"cell": _describe(claim.by, s.cell), "value": s.value, "low": s.low,
                "high": s.high, "runs": s.runs, "verdict": s.verdict} for s in scored]
    return Outcome(claim, pick.verdict, pick.value, pick.low, pick.high,
                   _fmt(pick.value, pick.low, pick.high) + (f" ({where})" if where else ""),
                   _coverage(claim, [s.cell for s in scored]), note=pick.note, cells=details)


def _difference(claim: Claim, rows: pd.DataFrame, done: dict[str, Outcome],
                source: str) -> Outcome:
    a = per_run(select(rows, claim.a, source), claim.by, claim.metric)
    b = per_run(select(rows, claim.b, source), claim.by, claim.metric)
    if a.empty or b.empty:
        missing = "a" if a.empty else "b"
        found = excluded(rows, getattr(claim, missing), source)
        return Outcome(claim, NOT_RUN, note=because(found, missing) or
                       f"no finished run in group {missing}", excluded=found)
    b_cells = dict(_cells(b, claim.by))
    scored = [_against(claim, cell, _diff(vals, b_cells[cell], claim.statistic),
                       min(len(vals), len(b_cells[cell])), len(vals) + len(b_cells[cell]))
              for cell, vals in _cells(a, claim.by) if cell in b_cells]
    if not scored:
        return Outcome(claim, NOT_RUN, note="groups a and b share no cell")
    if claim.than is not None:
        return _than(claim, scored, done.get(claim.than))
    return _verdict(claim, scored)


def _abs_interval(low: float, high: float) -> tuple[float, float]:
    """The range of |x| for x in [low, high]."""
    if low >= 0:
        return low, high
    if high <= 0:
        return -high, -low
    return 0.0, max(-low, high)


def _than(claim: Claim, scored: list[Scored], other: Outcome | None) -> Outcome:
    """|this difference| - |the other claim's deciding difference| OP value. Its interval
    combines the two CIs end to end (wider than a joint CI: a pass is certain)."""
    if claim.cells in ("all", "any") and len(scored) > 1:
        raise UserError(f"claim {claim.id}: with `than`, set cells = 'first' or 'last' (or "
                        "narrow `where` to one cell)")
    if other is None or other.verdict == NOT_RUN:
        why = f" ({other.note})" if other is not None and other.note else ""
        return Outcome(claim, NOT_RUN, note=f"claim {claim.than} was not run{why}")
    pick = scored[-1] if claim.cells == "last" else scored[0]
    d, v = pick.value, abs(pick.value) - abs(other.value)
    mine = _abs_interval(*_interval((pick.value, pick.low, pick.high)))
    theirs = _abs_interval(*_interval((other.value, other.low, other.high)))
    low, high = mine[0] - theirs[1], mine[1] - theirs[0]
    holds = lambda x: OPS[claim.op](x, claim.value)  # noqa: E731
    one_seed = pick.note == ONE_SEED or other.note == ONE_SEED
    where = _describe(claim.by, pick.cell)
    return Outcome(claim, INCONCLUSIVE if one_seed else three_way(holds, low, high), v, low,
                   high, shown=f"|{d:.4g}|{' (' + where + ')' if where else ''} - "
                   f"|{other.value:.4g}| ({claim.than}) = {_fmt(v, low, high)}",
                   note=ONE_SEED if one_seed else "")


def _lowest(claim: Claim, cell: tuple, series: dict) -> Scored:
    """`expect` has the lowest statistic of the values of `along`: pass when its CI lies
    below every other value's CI, fail when another's CI lies below its own."""
    stats = {k: _stat(vals, claim.statistic) for k, vals in series.items()}
    expected = next((k for k in stats if str(k) == str(claim.expect)), None)
    others = [k for k in stats if k != expected]
    runs = sum(map(len, series.values()))
    if expected is None or not others:
        return Scored(cell, math.nan, math.nan, math.nan, FAIL, -math.inf, runs,
                      f"no run at {claim.along} = {claim.expect}")
    low, high = _interval(stats[expected])
    nearest = min(others, key=lambda k: stats[k][0])
    gap = stats[nearest][0] - stats[expected][0]
    if min(len(vals) for vals in series.values()) < 2:
        return Scored(cell, gap, math.nan, math.nan, INCONCLUSIVE, gap, runs, ONE_SEED)
    if all(high < _interval(stats[k])[0] for k in others):
        verdict = PASS
    elif any(_interval(stats[k])[1] < low for k in others):
        verdict = FAIL
    else:
        verdict = INCONCLUSIVE
    return Scored(cell, gap, math.nan, math.nan, verdict, gap, runs)


def _along(claim: Claim, values: pd.DataFrame) -> Outcome:
    assert claim.along is not None  # Claim requires it for trend and lowest
    scored = []
    for cell, part in (values.groupby(claim.by, dropna=False, sort=True) if claim.by
                       else [((), values)]):
        cell = cell if isinstance(cell, tuple) else (cell,)
        series = {key[0]: vals for key, vals in _cells(part, [claim.along])}
        order = sorted(series)
        if claim.test == "lowest":
            scored.append(_lowest(claim, cell, series))
        elif len(order) >= 2:
            first, last = series[order[0]], series[order[-1]]
            scored.append(_against(claim, cell, _diff(last, first, claim.statistic),
                                   min(len(first), len(last)), len(first) + len(last)))
    if not scored:
        return Outcome(claim, NOT_RUN, note=f"fewer than two values of {claim.along}")
    outcome = _verdict(claim, scored)
    if claim.test == "lowest":
        outcome.shown = f"next lowest minus {claim.expect}: {outcome.shown}"
    return outcome


RULE = ("Verdicts: pass when the 95% CI of the reproduced value lies entirely on the claimed "
        "side of the threshold, fail when it lies entirely on the other side, inconclusive "
        "when it straddles the threshold or a group has a single run (no CI). Reproduced "
        "values: mean over seeds [95% percentile-bootstrap CI, 10,000 resamples] in the "
        "deciding cell; min/max over seeds have no CI and decide on the value itself.")


def reproduced(o: Outcome) -> str:
    """The reproduced value for people: value [CI] (deciding cell) (coverage; note)."""
    extra = "; ".join(x for x in (o.coverage, o.note) if x)
    return (o.shown or "-") + (f" ({extra})" if extra else "")


@dataclass
class Checked:
    """The claims of one claims file evaluated on one set of runs."""
    claims_path: Path
    outcomes: list[Outcome]
    results: Results

    @property
    def decided(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.verdict != NOT_RUN]

    def summary(self) -> str:
        """'49 claims; 4 concern the 12 finished runs given: 2 pass, 1 fail, 1 inconclusive;
        45 not run (reasons below).'"""
        runs = self.results.runs
        finished = int(runs["complete"].sum())
        diverged = int((runs["status"] == "diverged").sum())
        unfinished = len(runs) - finished - diverged
        others = ", ".join(f"{n} {what}" for n, what in ((unfinished, "unfinished"),
                                                          (diverged, "diverged")) if n)
        given = f"{finished} finished run{'s' * (finished != 1)} given" + (
            f" ({others})" if others else "")
        decided = self.decided
        verdicts = ", ".join(f"{sum(o.verdict == v for o in decided)} {v}"
                             for v in (PASS, FAIL, INCONCLUSIVE))
        left = len(self.outcomes) - len(decided)
        return (f"{len(self.outcomes)} claims; {len(decided)} concern the {given}"
                + (f": {verdicts}" if decided else "")
                + (f"; {left} not run (reasons below)" if left else "") + ".")

    def not_run(self) -> list[tuple[str, list[Outcome]]]:
        """The claims not run grouped by their reason, the largest group first."""
        groups: dict[str, list[Outcome]] = {}
        for o in self.outcomes:
            if o.verdict == NOT_RUN:
                groups.setdefault(o.note, []).append(o)
        return sorted(groups.items(), key=lambda item: -len(item[1]))

    def as_json(self, run_paths: list[Path]) -> dict:
        return {"claims": str(self.claims_path), "runs": [str(p) for p in run_paths],
                "summary": self.summary(), "rule": RULE,
                "results": [o.as_dict() for o in self.outcomes]}


def check_claims(runs: list[Path], claims: str | Path = defaults.CLAIMS,
                 results: Results | None = None, accept_code_change: bool = False) -> Checked:
    """Every claim of `claims` evaluated on the runs under `runs` (or on `results`, already
    collected from them); nothing is written."""
    claims_path = claims_file(claims)
    parsed = load_claims(claims_path)
    results = collect([Path(p) for p in runs], "verify", accept_code_change) \
        if results is None else results
    done: dict[str, Outcome] = {}
    for claim in sorted(parsed, key=lambda c: c.than is not None):  # referenced ones first
        try:
            done[claim.id] = evaluate(claim, results, done)
        except UserError as exc:  # a column the claim names that the runs lack
            raise UserError(f"{claims_path}: {exc}") from None
    return Checked(claims_path, [done[c.id] for c in parsed], results)


def outside_plan(checked: Checked, plan: Path) -> None:
    """Mark the claims a budget plan left out (plan.json of `perencode plan --write`) and no
    run decides: not run, "outside the plan" (not a missing run to look for)."""
    try:
        data = json.loads(Path(plan).read_text(encoding="utf-8"))
        left = {item["id"] for item in data["left_out"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{plan}: not a plan.json of `perencode plan --write` ({exc})") from None
    for o in checked.outcomes:
        if o.verdict == NOT_RUN and o.claim.id in left:
            o.note = f"outside the plan ({plan}: a budget of {data.get('budget_hours')} " \
                     f"GPU-hours on {data.get('gpu')})"
