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
by `n` where the table has it), i.e. over seeds. A verdict on a mean is a one-sided test at
the claim's level (perencode.analysis.stats: Student's t against a threshold, Welch's t for a
difference or a trend, exact tests for constant cells, a conservative rule for a threshold
on a metric in [0, 1]; statistic = "median": the exact sign or rank test;
docs/claims.md#statistics), naming the quantity it tests, the assumption behind its level
and whether the runs' shape contradicts it, with Holm and Benjamini-Hochberg adjusted p over
the claims of one call: pass when the test of the claim rejects its negation,
fail when the test of the opposite rejects the claim, inconclusive otherwise or when a group
has one run, with the runs per group that would decide it (a power calculation). Each
verdict names its method, runs per group, alpha and p, with the paper's percentile-bootstrap
CI beside it for comparison only. Not run when no run matches, with the reason: the claim's
filters that the runs nearest to matching fail and the values they have there ("need
model.hidden_size = 512, the nearest runs have 32"), or the field that varies within one of
the claim's groups though the claim does not name it (runs of different settings would be
pooled). A column the claim names that its table lacks, or text given for a column of
numbers, is a usage error (exit 2). Only a fail makes `perencode verify` exit 1.
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

from perencode.analysis.results import Results, collect
from perencode.analysis.stats import (
    HypothesisTest,
    at_bound,
    bootstrap_ci,
    bootstrap_diff_ci,
    difference_test,
    mean_test,
    outliers,
    rank_test,
    seeds_to_decide,
    sign_test,
)
from perencode.common import defaults
from perencode.common.errors import UserError
from perencode.config.naming import short_key
from perencode.config.recipe import BOOKKEEPING, read_toml
from perencode.config.validation import validate_table

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
    statistic: Literal["mean", "median", "min", "max"] = Field(
        "mean", description="Over runs (seeds). mean: a t-test of the mean; median: the "
        "distribution-free reading, 'on most seeds' (the exact sign test of a threshold, the "
        "exact rank test of a difference or trend); min / max: a description of these "
        "seeds, no test.")
    by: list[str] = Field([], description="Columns whose values make the cells.")
    cells: Literal["all", "any", "first", "last"] = Field(
        "all", description="Cells that must pass: all, any, or all of those at the "
        "first/last value of `by[0]`.")
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
    level: float = Field(0.95, gt=0.5, lt=1.0, description="The verdict's confidence: a pass "
                         "or a fail is a test at alpha = 1 - level (docs/claims.md#statistics).")
    priority: int = Field(2, ge=1, description="`perencode plan --budget`: the order claims "
                          "are planned in, 1 first (the paper's headline, Fig. 2); within a "
                          "priority, the claims decided per GPU-hour.")
    sides: Literal["one", "two"] = Field(
        "one", description="one: pass and fail are each one-sided tests at 1 - level (the "
        "claim's op names its side); two: at (1 - level) / 2 each, as 'a two-sided "
        "interval lies on one side'.")

    @model_validator(mode="after")
    def _complete(self) -> Claim:
        if self.test == "difference" and not (self.a and self.b):
            raise ValueError("field 'a': test = 'difference' needs filters `a` and `b`")
        if self.test in ("trend", "lowest") and self.along is None:
            raise ValueError(f"field 'along': test = '{self.test}' needs `along`")
        if self.test == "lowest" and self.expect is None:
            raise ValueError("field 'expect': test = 'lowest' needs `expect`")
        if self.statistic == "median" and self.test not in ("threshold", "difference",
                                                            "trend"):
            raise ValueError("field 'statistic': 'median' applies to test = 'threshold', "
                             "'difference' and 'trend'")
        if self.than is not None and self.statistic == "median":
            raise ValueError("field 'than': compares differences of means (statistic = "
                             "'mean')")
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
BUNDLED_CLAIMS = Path(__file__).parents[1] / "claims"


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
    """The rows of `df` that pass every filter, each filter checked (`_same_kind`) against
    the rows the filters before it left. Only a filter's own column is cut as it goes; the
    table, once, at the end."""
    if not filters:
        return df
    mask = np.ones(len(df), dtype=bool)
    for column, rule in filters.items():
        if column not in df.columns:
            raise UserError(f"{source}: no column '{column}' to filter on"
                            f"{_did_you_mean(column, df.columns)}")
        values = df[column][mask]
        _same_kind(values, column, rule, source)
        if isinstance(rule, dict):
            keep = pd.Series(True, index=values.index)
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
        mask[mask] = keep.to_numpy(dtype=bool, na_value=False)  # unknown is no match
    return df[mask]


def _given(rule: Any) -> list:
    """The values a filter compares with: the value, a list's items, min, max and not."""
    if isinstance(rule, dict):
        banned = rule.get("not", [])
        return [rule[k] for k in ("min", "max") if k in rule] + (
            banned if isinstance(banned, list) else [banned])
    return rule if isinstance(rule, list) else [rule]


def _same_kind(values: pd.Series, column: str, rule: Any, source: str) -> None:
    """Text given for a column of numbers (or a number for a column of text) matches no run
    ever: a usage error naming the values there, not a silent 'not run'."""
    present = values.dropna()
    if present.empty:
        return
    numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
    numbers = [g for g in _given(rule) if isinstance(g, (int, float)) and not isinstance(g, bool)]
    texts = bool(numbers) and (isinstance(values.dtype, pd.StringDtype)
                               or present.map(lambda v: isinstance(v, str)).all())
    for given in _given(rule):
        if numeric and isinstance(given, str):
            raise UserError(f"{source}: {column} = '{given}' is text, but {column} holds "
                            f"numbers ({_shown(_values(values))}): write it without quotes")
        if texts and isinstance(given, (int, float)) and not isinstance(given, bool):
            raise UserError(f"{source}: {column} = {given} is a number, but {column} holds "
                            f"text ({_shown(_values(values))}): write it in quotes")


def _value_hint(values: pd.Series, rule: Any) -> str | None:
    """The value of the column closest to a text the filter wants and no row has."""
    present = [v for v in _values(values) if isinstance(v, str)]
    for wanted in _given(rule) if not isinstance(rule, dict) else []:
        if isinstance(wanted, str) and wanted not in present:
            close = difflib.get_close_matches(wanted, present, n=1)
            if close:
                return close[0]
    return None


def _did_you_mean(name: str, columns) -> str:
    close = difflib.get_close_matches(name, [str(c) for c in columns], n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def per_run(df: pd.DataFrame, keys: list[str], metric: str) -> pd.DataFrame:
    """One value per run and cell: the mean of its rows (weighted by `n` if present). Rows
    without a value are left out (a sum over none of them would read as 0)."""
    df = df[pd.to_numeric(df[metric], errors="coerce").notna()]
    weights = df["n"] if "n" in df.columns else pd.Series(1.0, index=df.index)
    work = df.assign(_w=weights.astype(float), _wm=df[metric].astype(float) * weights)
    out = work.groupby(["run", *keys], dropna=False, as_index=False)[["_w", "_wm"]].sum()
    return out.assign(value=out["_wm"] / out["_w"])[["run", *keys, "value"]]


def _cells(df: pd.DataFrame, keys: list[str]) -> list[tuple[tuple, np.ndarray]]:
    """(cell key, per-run values) sorted by key; a run without a value (NaN) is left out, and
    a cell left without runs."""
    if not keys:
        values = df["value"].dropna().to_numpy()
        return [((), values)] if len(values) else []
    groups = df.groupby(keys, dropna=False, sort=True)
    cells = [(k if isinstance(k, tuple) else (k,), g["value"].dropna().to_numpy())
             for k, g in groups]
    return [(k, v) for k, v in cells if len(v)]


def _groups(df: pd.DataFrame, claim: Claim, source: str) -> tuple[pd.DataFrame, list[str]]:
    """The rows the claim compares and the columns whose values make its groups: its cells
    (`by`, `along`) and, for a difference, the side (a or b) a row is on."""
    keys = [k for k in (*claim.by, claim.along) if k is not None]
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
    found = []
    for column, keep in passes.items():
        if (nearest & ~keep).any():
            found.append({"field": column, "need": filters[column],
                          "needs": _rule(filters[column]),
                          "have": _values(df.loc[nearest & ~keep, column]),
                          "runs": int(df.loc[nearest & ~keep, "run"].nunique())})
            hint = _value_hint(df[column], filters[column])
            if hint is not None:
                found[-1]["did_you_mean"] = hint
    return found


def because(found: list[dict], group: str = "", shown: int = 3) -> str:
    """'need model.hidden_size = 512 (the nearest runs have 32), model.arch = lstm (gru)':
    the first `shown` fields (all of them are in verify.json's `excluded`)."""
    clauses = [f"{x['field']} {x['needs']} ({'the nearest runs have ' if i == 0 else ''}"
               f"{_shown(x['have'])}"
               + (f"; did you mean '{x['did_you_mean']}'?" if "did_you_mean" in x else "")
               + ")" for i, x in enumerate(found[:shown])]
    more = len(found) - shown
    rest = f" and {more} more field{'s' * (more > 1)}" if more > 0 else ""
    who = f"group {group} needs" if group else "need"
    return f"{who} {', '.join(clauses)}{rest}" if found else ""


# --------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------

PASS, FAIL, INCONCLUSIVE, NOT_RUN = "pass", "fail", "inconclusive", "not run"
VERDICTS = (PASS, FAIL, INCONCLUSIVE, NOT_RUN)
ONE_SEED = "one run per group: no spread to test with, so no verdict"
POWER = 0.8  # of the seeds-to-decide calculation
NO_TEST = "no test"  # a cell's method where nothing could be tested
SIGN_TEST = "exact sign test of the median"
RANK_TEST = "exact rank test (Mann-Whitney, permutations)"


def three_way(holds, low: float, high: float) -> str:
    """The verdict of a claim `holds(x)` about a quantity known to lie in [low, high]
    (each end a one-sided bound at the claim's level): pass when it holds over the whole
    interval, fail when it holds nowhere on it, inconclusive when the interval straddles
    the claim's boundary. Only the two ends are looked at, so `holds` must be monotone in x
    (a threshold `x OP value`)."""
    at_low, at_high = holds(low), holds(high)
    if at_low and at_high:
        return PASS
    if not at_low and not at_high:
        return FAIL
    return INCONCLUSIVE


class Scored(NamedTuple):
    """One cell of a claim: its reproduced value, the test behind it and its p-values. The
    cell passes when p_pass <= alpha (divided by the cells a union of them needs: `_verdict`)
    and fails when p_fail <= alpha likewise."""
    cell: tuple
    value: float
    low: float            # one-sided (1 - alpha) bounds; NaN without a t-test
    high: float
    p_pass: float         # p-value of the claim (its negation rejected)
    p_fail: float         # p-value of the claim's opposite
    alpha: float          # the level each side is tested at (halved for bounded metrics)
    method: str
    n: tuple[int, ...]    # runs per group
    margin: float         # how far inside (+) or outside (-) the claim the estimate lies
    groups: tuple[np.ndarray, ...] = ()  # the per-run values tested (a, b) or (values,)
    test: HypothesisTest | None = None  # the test an inconclusive's power calculation uses
    note: str = ""

    @property
    def runs(self) -> int:
        return sum(self.n)


def _verdict_of(s: Scored, pass_cells: int = 1, fail_cells: int = 1) -> str:
    if s.p_pass <= s.alpha / pass_cells:
        return PASS
    if s.p_fail <= s.alpha / fail_cells:
        return FAIL
    return INCONCLUSIVE


@dataclass
class Outcome:
    claim: Claim
    verdict: str                     # pass, fail, inconclusive, not run
    value: float = math.nan          # the reproduced number the verdict rests on
    low: float = math.nan            # its one-sided (1 - alpha) bounds
    high: float = math.nan
    shown: str = ""                  # value, bounds and the cell it comes from, for people
    coverage: str = ""
    note: str = ""                   # for a claim not run: the reason, in words
    cells: list[dict] = field(default_factory=list)
    excluded: list[dict] = field(default_factory=list)  # not run: the filters no run passes
    runs: list[str] = field(default_factory=list)       # the run directories it rests on
    method: str = ""                 # how it was decided: test, sides, alpha, n, p
    n: list[int] = field(default_factory=list)          # runs per group, deciding cell
    alpha: float = math.nan          # each side's level as used in the deciding cell
    p: float = math.nan              # p-value of the side that decided (or came nearest)
    bootstrap: tuple[float, float] | None = None        # the paper's 95% CI, for comparison
    seeds_to_decide: int | None = None
    deciding: Scored | None = None   # the cell that decided (`than` reads it)
    quantity: str = ""               # what the verdict is about: the mean, the median, ...
    assumption: str = ""             # under which the stated level holds
    shape: str = ""                  # these runs contradict the assumption: how, and the
    #                                  verdicts without the outlying seeds / distribution-free
    p_claim: float = math.nan        # p-value of the claim as a whole (its cells combined)
    p_holm: float = math.nan         # p_claim adjusted over the call's tests (Holm)
    q_bh: float = math.nan           # p_claim's Benjamini-Hochberg q over the same tests

    @property
    def description(self) -> bool:
        """min / max over the seeds: a statement about these seeds, decided without a test."""
        return self.verdict != NOT_RUN and self.claim.statistic in ("min", "max")

    @property
    def tested(self) -> bool:
        """Decided by a test with a p-value (counted in the multiplicity adjustment)."""
        return self.verdict != NOT_RUN and not self.description and not math.isnan(
            self.p_claim)

    def as_dict(self) -> dict:
        c = self.claim

        def number(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {"id": c.id, "statement": c.statement, "source": c.source, "paper": c.paper,
                "verdict": self.verdict, "reproduced": self.shown,
                "value": number(self.value),
                "bounds": None if math.isnan(self.low) else [self.low, self.high],
                "method": self.method, "n": self.n, "sides": c.sides, "level": c.level,
                "alpha": number(self.alpha), "p": number(self.p),
                "bootstrap95": None if self.bootstrap is None else list(self.bootstrap),
                "seeds_to_decide": self.seeds_to_decide,
                "quantity": self.quantity, "assumption": self.assumption,
                "shape": self.shape, "description": self.description,
                "p_claim": number(self.p_claim), "p_holm": number(self.p_holm),
                "q_bh": number(self.q_bh),
                "coverage": self.coverage, "note": self.note, "cells": self.cells,
                "excluded": self.excluded, "runs": self.runs}


def _fmt(value: float, low: float, high: float, alpha: float = math.nan) -> str:
    """'0.972 [0.951, 0.993] (each end one-sided 97.5%)': the bounds' level said."""
    text = f"{value:.4g}"
    if math.isnan(low):
        return text
    level = "" if math.isnan(alpha) else f" (each end one-sided {_percent(1 - alpha)})"
    return f"{text} [{low:.4g}, {high:.4g}]{level}"


def _percent(x: float) -> str:
    return f"{100 * x:.4g}%"


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


def _known_columns(claim: Claim, columns, source: str) -> None:
    """Every column the claim names exists in its table: a typo is a usage error with a
    did-you-mean, never a crash or a misleading 'not run'."""
    named = [("by", c) for c in claim.by] + [("along", claim.along)] * (claim.along is not None)
    named += [(side, c) for side in ("a", "b") for c in getattr(claim, side)]
    for where, column in named:
        if column not in columns:
            raise UserError(f"{source}: {where}: no column '{column}' in table "
                            f"'{claim.table}'{_did_you_mean(str(column), columns)}")


def _alpha(claim: Claim) -> float:
    """Each side's level: a one-sided claim tests its side at 1 - level; sides = 'two'
    splits it between both (the rule 'a two-sided interval lies on the claimed side')."""
    return round(1.0 - claim.level, 12) / (2.0 if claim.sides == "two" else 1.0)


def _bounded(rows: pd.DataFrame, metric: str) -> bool:
    """A metric whose values all lie in [0, 1] (accuracies, rates) is treated as bounded:
    skewed near its bounds (perencode.analysis.stats.mean_test)."""
    values = pd.to_numeric(rows[metric], errors="coerce").dropna()
    return bool(len(values)) and bool(values.between(0.0, 1.0).all())


def evaluate(claim: Claim, results: Results, done: dict[str, Outcome]) -> Outcome:
    source = f"claim {claim.id}"
    every = results.table(claim.table)
    rows = every
    if claim.table != "curves":  # training curves of unfinished runs count too
        rows = rows[rows["complete"].astype(bool)]
    if rows.empty:  # e.g. no run wrote stability.csv: its columns do not exist either
        return _count_diverged(Outcome(claim, NOT_RUN, note=_no_table(claim.table, results)),
                               results)
    _known_columns(claim, rows.columns, source)
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
    bounded = _bounded(rows, claim.metric)
    if claim.test == "difference":
        outcome = _difference(claim, rows, done, source, bounded)
    else:
        values = per_run(rows, keys, claim.metric)
        if claim.test in ("trend", "lowest"):
            outcome = _along(claim, values, bounded)
        else:
            scored = [(_near if claim.test == "approx" else _threshold)(claim, cell, vals,
                                                                        bounded)
                      for cell, vals in _cells(values, claim.by)]
            outcome = _verdict(claim, scored) if scored else Outcome(
                claim, NOT_RUN, note=f"no matching run has a value of {claim.metric}")
    without = 0
    if outcome.verdict != NOT_RUN:  # a difference rests on its groups' runs alone
        grouped = _groups(rows, claim, source)[0]
        outcome.runs = sorted(set(grouped["run"]))
        valued = pd.to_numeric(grouped[claim.metric], errors="coerce").notna()
        without = grouped.loc[~grouped["run"].isin(grouped.loc[valued, "run"]), "run"].nunique()
    return _count_diverged(outcome, results, without)


def _count_diverged(outcome: Outcome, results: Results, without: int = 0) -> Outcome:
    """Name the diverged runs of the claim's cells (the `where` fields of the runs table
    they match): counted there, never as numbers. A decided claim counts them on its
    verdict's line (`method`), with the finished runs that lack a value of the metric
    (`without`): both left out before the test."""
    diverged = results.diverged()
    where = {k: v for k, v in outcome.claim.where.items() if k in diverged.columns}
    found = len(select(diverged, where, f"claim {outcome.claim.id}")) if len(diverged) else 0
    if outcome.verdict != NOT_RUN and (found or without):
        left = [f"{found} diverged run{'s' * (found != 1)}"] * bool(found) + [
            f"{without} finished run{'s' * (without != 1)} without a value of "
            f"{outcome.claim.metric}"] * bool(without)
        outcome.method += f"; left out before the test: {' and '.join(left)}"
    elif found:
        said = f"{found} diverged run(s) match, counted without a value"
        outcome.note = f"{outcome.note}; {said}" if outcome.note else said
    return outcome


def _no_table(table: str, results: Results) -> str:
    finished = int(results.runs["complete"].sum())
    if table == "stability":
        return (f"none of the {finished} finished runs has stability.csv (`perencode "
                "stability RUN` writes it; grids with `after = [\"stability\"]` run it)")
    return f"none of the {finished} finished runs has rows of table '{table}'"


def _observed(claim: Claim, cell: tuple, value: float, holds: bool, n: tuple[int, ...],
              margin: float, groups: tuple[np.ndarray, ...]) -> Scored:
    """min / max over seeds: a statement about these seeds, decided on the value itself."""
    return Scored(cell, value, math.nan, math.nan, 0.0 if holds else 1.0,
                  1.0 if holds else 0.0, _alpha(claim),
                  f"observed {claim.statistic} over the seeds (no test)", n, margin, groups)


def _one_seed(claim: Claim, cell: tuple, value: float, n: tuple[int, ...], margin: float,
              groups: tuple[np.ndarray, ...]) -> Scored:
    return Scored(cell, value, math.nan, math.nan, 1.0, 1.0, _alpha(claim), NO_TEST, n,
                  margin, groups, note=ONE_SEED)


def _from_test(claim: Claim, cell: tuple, test: HypothesisTest,
               groups: tuple[np.ndarray, ...]) -> Scored:
    """A cell decided by a test of `quantity OP value`."""
    up = claim.op in (">", ">=")
    p_pass, p_fail = (test.p_above, test.p_below) if up else (test.p_below, test.p_above)
    exact = test.method.startswith("exact")
    low, high = (math.nan, math.nan) if exact else (test.low, test.high)
    margin = (test.estimate - claim.value) * (1 if up else -1)
    return Scored(cell, test.estimate, low, high, p_pass, p_fail, test.alpha, test.method,
                  test.n, margin, groups, test)


def _threshold(claim: Claim, cell: tuple, values: np.ndarray, bounded: bool) -> Scored:
    """statistic(values) OP value: Student's t for the mean (perencode.analysis.stats.mean_test)."""
    up = claim.op in (">", ">=")
    if claim.statistic == "median":
        v = float(np.median(values))
        above, below = sign_test(values, claim.value)
        return Scored(cell, v, math.nan, math.nan, above if up else below,
                      below if up else above, _alpha(claim), SIGN_TEST, (len(values),),
                      (v - claim.value) * (1 if up else -1), (values,))
    if claim.statistic != "mean":
        v = float(getattr(np, claim.statistic)(values))
        return _observed(claim, cell, v, OPS[claim.op](v, claim.value), (len(values),),
                         (v - claim.value) * (1 if up else -1), (values,))
    if len(values) < 2:
        v = float(values.mean())
        return _one_seed(claim, cell, v, (len(values),), (v - claim.value) * (1 if up else -1),
                         (values,))
    return _from_test(claim, cell, mean_test(values, claim.value, _alpha(claim), bounded),
                      (values,))


def _compare(claim: Claim, cell: tuple, a: np.ndarray, b: np.ndarray,
             bounded: bool) -> Scored:
    """statistic(a) - statistic(b) OP value: Welch's t for means
    (perencode.analysis.stats.difference_test)."""
    up = claim.op in (">", ">=")
    if claim.statistic == "median":
        d = float(np.median(a) - np.median(b))
        above, below = rank_test(a, b, claim.value)
        return Scored(cell, d, math.nan, math.nan, above if up else below,
                      below if up else above, _alpha(claim), RANK_TEST, (len(a), len(b)),
                      (d - claim.value) * (1 if up else -1), (a, b))
    if claim.statistic != "mean":
        stat = getattr(np, claim.statistic)
        d = float(stat(a) - stat(b))
        return _observed(claim, cell, d, OPS[claim.op](d, claim.value), (len(a), len(b)),
                         (d - claim.value) * (1 if up else -1), (a, b))
    if min(len(a), len(b)) < 2:
        d = float(a.mean() - b.mean())
        return _one_seed(claim, cell, d, (len(a), len(b)),
                         (d - claim.value) * (1 if up else -1), (a, b))
    return _from_test(claim, cell, difference_test(a, b, claim.value, _alpha(claim), bounded),
                      (a, b))


def _near(claim: Claim, cell: tuple, values: np.ndarray, bounded: bool) -> Scored:
    """approx: two one-sided tests (TOST): pass when the mean is shown above value -
    tolerance and below value + tolerance, each at alpha; fail when it is shown outside the
    band on either side (each side at alpha / 2: a union of two tests). min / max decide on
    the value itself."""
    band = (claim.value - claim.tolerance, claim.value + claim.tolerance)
    v = float(getattr(np, claim.statistic)(values))
    margin = -abs(v - claim.value)
    if claim.statistic != "mean":
        return _observed(claim, cell, v, band[0] <= v <= band[1], (len(values),), margin,
                         (values,))
    if len(values) < 2:
        return _one_seed(claim, cell, v, (len(values),), margin, (values,))
    alpha = _alpha(claim)
    lower, upper = (mean_test(values, edge, alpha, bounded) for edge in band)
    p_pass = max(lower.p_above, upper.p_below)
    p_fail = 2 * min(lower.p_below, upper.p_above)
    exact = lower.method.startswith("exact")
    low, high = (math.nan, math.nan) if exact else (lower.low, upper.high)
    nearer = lower if v - band[0] < band[1] - v else upper
    return Scored(cell, v, low, high, p_pass, p_fail, lower.alpha, f"{lower.method} (two "
                  "one-sided tests against value +- tolerance)", (len(values),), margin,
                  (values,), nearer)


RANK = {FAIL: 0, INCONCLUSIVE: 1, PASS: 2}


def _edge(claim: Claim, present: list) -> Any:
    """The value of `by[0]` a `cells = "first"` / `"last"` claim is about: the smallest /
    largest value its `where` lists for that column, else of the values the runs have
    (the union of both groups' cells for a difference)."""
    named = claim.where.get(claim.by[0])
    pool = named if isinstance(named, list) and named else (
        [named] if named is not None and not isinstance(named, (dict, list)) else present)
    return (min if claim.cells == "first" else max)(pool)


def _missing_edge(claim: Claim, edge: Any, groups: dict[str, list[tuple]]) -> str:
    """The reason a `first` / `last` claim is not run when a group has no cell at its edge
    (or, over several `by` columns, the groups' cells there differ); "" when all are there.
    `groups`: group name ("" for a claim of one group) -> the cells it has."""
    at = {g: {c for c in cells if c[0] == edge} for g, cells in groups.items()}
    every = set().union(*at.values())
    where = f"{short_key(claim.by[0])}={_text(edge)}"
    for g, cells in at.items():
        if not every or not cells or cells != every:
            who = f"group {g}" if g else "the claim"
            lacking = sorted(every - cells, key=str) if cells else []
            has = _shown(_values(pd.Series([c[0] for c in groups[g]], dtype=object))) or \
                "no value"
            what = ("no finished run" if not cells else
                    f"no finished run in cell {_describe(claim.by, lacking[0])}")
            named = "the claim's" if isinstance(claim.where.get(claim.by[0]), list) else \
                "the runs'"
            return (f"cells = '{claim.cells}': {what} of {who} at {where} ({named} "
                    f"{claim.cells} value of {claim.by[0]}; {who} has {has}): never decided "
                    "at another value")
    return ""


def _verdict(claim: Claim, scored: list[Scored]) -> Outcome:
    """Combine the cells. 'all' passes when every cell passes (an intersection of tests at
    alpha each keeps alpha) and fails when one fails at alpha / k (Bonferroni over the k
    cells); 'any' passes when one passes at alpha / k and fails when all fail; 'first' and
    'last' are 'all' over the cells at the first / last value of `by[0]`. The cell shown is
    the one that decides (the worst for 'all', the best for 'any')."""
    chosen = scored
    if claim.cells in ("first", "last") and claim.by:
        edge = _edge(claim, [s.cell[0] for s in scored])
        chosen = [s for s in scored if s.cell[0] == edge]
        if not chosen:
            return Outcome(claim, NOT_RUN, note=_missing_edge(
                claim, edge, {"": [s.cell for s in scored]}))
    k = len(chosen)
    pass_cells, fail_cells = (k, 1) if claim.cells == "any" else (1, k)
    verdicts = [_verdict_of(s, pass_cells, fail_cells) for s in chosen]
    ranked = list(zip(verdicts, chosen))
    deciding = {id(s) for s in chosen}
    key = lambda item: (RANK[item[0]], item[1].margin)  # noqa: E731
    verdict, pick = (max if claim.cells == "any" else min)(ranked, key=key)
    where = _describe(claim.by, pick.cell)
    details = [{"cell": _describe(claim.by, s.cell), "value": s.value,
                "bounds": None if math.isnan(s.low) else [s.low, s.high],
                "n": list(s.n), "runs": s.runs, "p": s.p_pass,
                "verdict": _verdict_of(s, pass_cells, fail_cells) if id(s) in deciding else "-"}
               for s in scored]
    outcome = Outcome(claim, verdict, pick.value, pick.low, pick.high,
                      _fmt(pick.value, pick.low, pick.high, pick.alpha)
                      + (f" ({where})" if where else ""),
                      _coverage(claim, [s.cell for s in scored]), note=pick.note,
                      cells=details)
    # The claim's own p-value: 'all' holds when every cell does (the largest p), 'any' when
    # one does (the smallest, times k: Bonferroni); it passes when p_claim <= alpha.
    p_cells = [s.p_pass for s in chosen]
    outcome.p_claim = max(p_cells) if claim.cells != "any" else min(1.0, k * min(p_cells))
    if all(s.method == NO_TEST or s.note == ONE_SEED for s in chosen):
        outcome.p_claim = math.nan  # nothing tested: not counted among the tests
    return _explain(outcome, pick, k, claim.cells)


NEAR_NORMAL = ("seeds near-normal, or skewed as accuracies near a bound are; not seeds "
               "split between a plateau and success, nor piled at a bound")
EXACT = "none on the seeds' shape: exact for any distribution of independent seeds"


def _quantity(claim: Claim, pick: Scored) -> tuple[str, str]:
    """What the verdict is about, and the assumption under which its level holds."""
    two = len(pick.n) == 2
    if claim.statistic in ("min", "max"):
        return (f"the {claim.statistic} over these seeds (a description)",
                "none: no test, a statement about these seeds")
    if pick.method in (SIGN_TEST, RANK_TEST):
        return ("on most seeds: a seed of a beats a seed of b more often than not" if two
                else "the median over seeds: most seeds on the claimed side", EXACT)
    if pick.method.startswith("exact sign test"):
        return ("the median over seeds (every seed scored the same: no spread for a test of "
                "the mean)", EXACT)
    if pick.method.startswith("exact permutation test"):
        return "the two groups (each constant: no spread for a test of the means)", EXACT
    if pick.note == ONE_SEED or pick.method == NO_TEST:
        return "the mean over seeds", "no test: one run per group"
    if claim.test == "trend":
        what = f"the mean at the last value of {claim.along} minus the mean at the first"
    elif claim.test == "lowest":
        what = f"the mean at each other value of {claim.along} minus at {claim.expect}"
    elif two:
        what = "the mean over seeds of a minus that of b" if claim.test == "difference" \
            else "the means over seeds"
    else:
        what = "the mean over seeds"
    assumption = NEAR_NORMAL if not two else (
        "each group near-normal, or both of one shape; not seeds split between a plateau "
        "and success, nor a group piled at a bound or skewed beside a tight one")
    return what, assumption


def _decide(p_pass: float, p_fail: float, alpha: float) -> str:
    return PASS if p_pass <= alpha else FAIL if p_fail <= alpha else INCONCLUSIVE


def _shape(claim: Claim, pick: Scored, verdict: str) -> str:
    """Whether the runs contradict a t-test's assumption, said with the other readings: the
    seeds Dixon's Q test splits off (a plateau beside success), the seeds exactly at 0 or 1
    (a bound); then the verdict without the outlying seeds and the distribution-free
    verdict (sign test of the median, exact rank test of a difference), each at the
    claim's alpha."""
    if pick.test is None or pick.method.startswith("exact") or pick.method == NO_TEST or \
            claim.test not in ("threshold", "difference", "trend") or claim.cells == "any":
        return ""
    names = ("group a", "group b") if claim.test == "difference" else (
        (f"the last {short_key(str(claim.along))}", f"the first {short_key(str(claim.along))}")
        if claim.test == "trend" else ("",))
    bounded = pick.test.bounded
    found, kept = [], []
    for name, values in zip(names, pick.groups):
        who = f"{name}: " if name else ""
        split = outliers(values)
        if split:
            rest = np.delete(values, split)
            found.append(f"{who}{len(split)} of {len(values)} seeds set apart from the "
                         f"others by Dixon's Q test ("
                         f"{_shown([round(float(values[i]), 4) for i in split])} vs "
                         f"{float(rest.min()):.4g}-{float(rest.max()):.4g}: a plateau beside "
                         "success, or an outlier)")
        piled = at_bound(values) if bounded else 0
        if piled:
            found.append(f"{who}{piled} of {len(values)} seeds exactly at a bound (0 or 1)")
        kept.append(np.delete(values, split) if split else values)
    if not found:
        return ""
    up = claim.op in (">", ">=")
    alpha = _alpha(claim)
    readings = []
    if any(len(k) != len(g) for k, g in zip(kept, pick.groups)) and min(map(len, kept)) >= 2:
        test = (mean_test(kept[0], claim.value, alpha, bounded) if len(kept) == 1 else
                difference_test(kept[0], kept[1], claim.value, alpha, bounded))
        p_pass, p_fail = (test.p_above, test.p_below) if up else (test.p_below, test.p_above)
        readings.append(f"without the outlying seeds {_decide(p_pass, p_fail, test.alpha)} "
                        f"(p = {p_pass:.2g})")
    above, below = (sign_test(pick.groups[0], claim.value) if len(pick.groups) == 1 else
                    rank_test(pick.groups[0], pick.groups[1], claim.value))
    p_pass, p_fail = (above, below) if up else (below, above)
    free = "sign test of the median" if len(pick.groups) == 1 else "exact rank test"
    readings.append(f"distribution-free ({free}, on most seeds) {_decide(p_pass, p_fail, alpha)}"
                    f" (p = {p_pass:.2g})")
    return (f"shape: {'; '.join(found)}: the t-test's level does not hold for such runs "
            f"(docs/claims.md#shapes); this verdict '{verdict}' reads the mean; "
            + "; ".join(readings))


def _explain(outcome: Outcome, pick: Scored, k: int, cells: str) -> Outcome:
    """Name how the verdict was decided (method, sides, alpha, n, p), the paper's bootstrap
    interval beside it, and for an inconclusive verdict the seeds that would decide it."""
    claim = outcome.claim
    outcome.deciding, outcome.n, outcome.alpha = pick, list(pick.n), pick.alpha
    decided = outcome.verdict != INCONCLUSIVE or pick.note == ONE_SEED
    p = pick.p_fail if outcome.verdict == FAIL else pick.p_pass
    outcome.p = p if pick.note != ONE_SEED and not pick.method.startswith("observed") \
        else math.nan
    n = " + ".join(map(str, pick.n)) if len(pick.n) > 1 else str(pick.n[0])
    if pick.method.startswith("observed"):
        outcome.method = f"{pick.method}, n = {n}"
    elif pick.note == ONE_SEED:
        outcome.method = f"no test: one run per group (n = {n})"
    elif pick.method == NO_TEST:  # e.g. lowest: no run at the expected value
        outcome.method, outcome.p = f"no test: {pick.note}", math.nan
    else:
        method = pick.method
        if claim.test == "trend":
            method = (f"{method} of the mean at the last value of {claim.along} minus at the "
                      "first (two ends; the values between are not tested)")
        parts = [method, "one-sided", f"alpha = {pick.alpha:.3g}"]
        if pick.test is not None and pick.test.bounded and len(pick.n) == 1 and \
                not pick.method.startswith("exact"):
            parts[-1] += " (a threshold on a metric in [0, 1]: halved)"
        parts += [f"n = {n}", f"p = {outcome.p:.2g}"]
        if k > 1:
            parts.append(
                f"{k} cells: passes when one passes at alpha / {k} (Bonferroni), fails when "
                "every one fails" if cells == "any" else
                f"{k} cells: passes when every one passes at alpha, fails when one fails at "
                f"alpha / {k} (Bonferroni)")
        outcome.method = ", ".join(parts)
    outcome.quantity, outcome.assumption = _quantity(claim, pick)
    outcome.shape = _shape(claim, pick, outcome.verdict)
    if claim.statistic == "mean" and len(pick.groups) in (1, 2) and all(
            len(g) for g in pick.groups) and claim.test != "lowest":
        ci = bootstrap_ci(pick.groups[0]) if len(pick.groups) == 1 else bootstrap_diff_ci(
            pick.groups[0], pick.groups[1])
        outcome.bootstrap = (ci[1], ci[2])
    if not decided and pick.test is not None:
        outcome.seeds_to_decide = seeds_to_decide(pick.test, POWER)
        per = " per group" if len(pick.n) > 1 else ""
        power = (f" by a power calculation: {POWER:.0%} power at alpha = "
                 f"{pick.test.alpha:.3g} if the observed difference and spread were the truth")
        if outcome.seeds_to_decide:
            said = f"about {outcome.seeds_to_decide} runs{per} would decide it{power}"
        elif pick.test.estimate == pick.test.threshold:
            said = "the estimate equals the threshold: no number of runs decides it there"
        else:
            said = f"more than 1,000 runs{per} would decide it{power}"
        outcome.note = f"{outcome.note}; {said}" if outcome.note else said
    elif pick.note == ONE_SEED:
        outcome.note = f"{ONE_SEED}; at least 2 runs per group are needed"
    return outcome


def _difference(claim: Claim, rows: pd.DataFrame, done: dict[str, Outcome],
                source: str, bounded: bool) -> Outcome:
    a = per_run(select(rows, claim.a, source), claim.by, claim.metric)
    b = per_run(select(rows, claim.b, source), claim.by, claim.metric)
    if a.empty or b.empty:
        missing = "a" if a.empty else "b"
        found = excluded(rows, getattr(claim, missing), source)
        some = not select(rows, getattr(claim, missing), source).empty
        return Outcome(claim, NOT_RUN, note=because(found, missing) or (
            f"no run of group {missing} has a value of {claim.metric}" if some else
            f"no finished run in group {missing}"), excluded=found)
    b_cells = dict(_cells(b, claim.by))
    a_cells = dict(_cells(a, claim.by))
    if claim.cells in ("first", "last") and claim.by:
        edge = _edge(claim, [c[0] for c in (*a_cells, *b_cells)])
        missing = _missing_edge(claim, edge, {"a": list(a_cells), "b": list(b_cells)})
        if missing:
            return Outcome(claim, NOT_RUN, note=missing)
    scored = [_compare(claim, cell, vals, b_cells[cell], bounded)
              for cell, vals in a_cells.items() if cell in b_cells]
    if not scored:
        return Outcome(claim, NOT_RUN, note="groups a and b share no cell")
    if claim.than is not None:
        return _than(claim, scored, done.get(claim.than), bounded)
    return _verdict(claim, scored)


def _abs_interval(low: float, high: float) -> tuple[float, float]:
    """The range of |x| for x in [low, high]."""
    if low >= 0:
        return low, high
    if high <= 0:
        return -high, -low
    return 0.0, max(-low, high)


def _than(claim: Claim, scored: list[Scored], other: Outcome | None,
          bounded: bool) -> Outcome:
    """|this difference| - |the other claim's deciding difference| OP value. Each
    difference gets Welch bounds at alpha / 4 per end, and the range of |d1| - |d2| over
    them is the interval decided on (Bonferroni over the four ends: the claim's alpha
    holds, conservatively)."""
    chosen = scored
    if claim.cells in ("first", "last") and claim.by:
        edge = _edge(claim, [s.cell[0] for s in scored])
        chosen = [s for s in scored if s.cell[0] == edge]
        if not chosen:
            return Outcome(claim, NOT_RUN, note=_missing_edge(
                claim, edge, {"": [s.cell for s in scored]}))
    if len(chosen) > 1:
        raise UserError(f"claim {claim.id}: with `than`, the claim must decide in one cell "
                        "(set cells = 'first' or 'last' over one `by` column, or narrow "
                        "`where`)")
    if other is None or other.verdict == NOT_RUN or other.deciding is None:
        why = f" ({other.note})" if other is not None and other.note else ""
        return Outcome(claim, NOT_RUN, note=f"claim {claim.than} was not run{why}")
    pick, theirs = chosen[0], other.deciding
    d, v = pick.value, abs(pick.value) - abs(theirs.value)
    alpha = _alpha(claim) / 4
    one_seed = pick.note == ONE_SEED or theirs.note == ONE_SEED
    p_claim = math.nan
    if claim.statistic != "mean" or one_seed:
        low = high = v
        method = (f"observed {claim.statistic} over the seeds (no test)" if not one_seed
                  else "no test: one run per group")
    else:
        def interval(at: float) -> tuple[float, float, HypothesisTest]:
            mine_t, their_t = (difference_test(s.groups[0], s.groups[1], 0.0, at, bounded)
                               for s in (pick, theirs))
            mine = _abs_interval(*((mine_t.estimate,) * 2 if mine_t.method.startswith(
                "exact") else (mine_t.low, mine_t.high)))
            their = _abs_interval(*((their_t.estimate,) * 2 if their_t.method.startswith(
                "exact") else (their_t.low, their_t.high)))
            return mine[0] - their[1], mine[1] - their[0], mine_t

        low, high, mine_t = interval(alpha)
        p_claim = _than_p(lambda at: interval(at / 4)[:2], claim)
        method = (f"{mine_t.method} bounds of both differences at alpha / 4 = "
                  f"{mine_t.alpha:.3g} per end, combined (Bonferroni), n = "
                  f"{' + '.join(map(str, pick.n))} and {' + '.join(map(str, theirs.n))}")
    holds = lambda x: OPS[claim.op](x, claim.value)  # noqa: E731
    where = _describe(claim.by, pick.cell)
    return Outcome(claim, INCONCLUSIVE if one_seed else three_way(holds, low, high), v,
                   low if low != high else math.nan, high if low != high else math.nan,
                   shown=f"|{d:.4g}|{' (' + where + ')' if where else ''} - "
                   f"|{theirs.value:.4g}| ({claim.than}) = {_fmt(v, low, high)}",
                   note=ONE_SEED if one_seed else "", method=method,
                   n=[*pick.n, *theirs.n], alpha=_alpha(claim), p=p_claim,
                   quantity="|this claim's difference of means| - |that claim's|",
                   assumption="each group near-normal (Welch bounds of both differences)",
                   p_claim=p_claim)


def _than_p(bounds, claim: Claim) -> float:
    """The smallest alpha at which the combined bounds (`bounds(alpha)`: low, high) lie
    on the claimed side: the claim's p-value, by bisection on log alpha (the bounds widen
    as alpha falls). 1 when they never do."""
    holds = lambda x: OPS[claim.op](x, claim.value)  # noqa: E731
    up = claim.op in (">", ">=")

    def passes(at: float) -> bool:
        low, high = bounds(at)
        return holds(low) if up else holds(high)

    if not passes(0.999):
        return 1.0
    lo, hi = math.log(1e-12), math.log(0.999)  # passes(exp(hi)); maybe not at exp(lo)
    if passes(math.exp(lo)):
        return 1e-12
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if passes(math.exp(mid)) else (mid, hi)
    return math.exp(hi)


def _lowest(claim: Claim, cell: tuple, series: dict, bounded: bool) -> Scored:
    """`expect` has the lowest statistic of the values of `along`: every other value's mean
    minus the expected one's is tested > 0 (Welch). Pass when all are shown above (an
    intersection of tests, alpha each), fail when one is shown below (a union: alpha /
    (k - 1) each). min / max decide on the values themselves."""
    stat = getattr(np, claim.statistic)
    expected = next((k for k in series if str(k) == str(claim.expect)), None)
    others = [k for k in series if k != expected]
    runs = tuple(len(series[k]) for k in series)
    if expected is None or not others:
        return Scored(cell, math.nan, math.nan, math.nan, 1.0, 0.0, _alpha(claim), NO_TEST,
                      runs, -math.inf, note=f"no run at {claim.along} = {claim.expect}")
    nearest = min(others, key=lambda k: float(stat(series[k])))
    gap = float(stat(series[nearest]) - stat(series[expected]))
    n = (len(series[nearest]), len(series[expected]))
    groups = (series[nearest], series[expected])
    if claim.statistic != "mean":
        holds = all(float(stat(series[k])) > float(stat(series[expected])) for k in others)
        shown = any(float(stat(series[k])) < float(stat(series[expected])) for k in others)
        return Scored(cell, gap, math.nan, math.nan, 0.0 if holds else 1.0,
                      0.0 if shown else 1.0, _alpha(claim),
                      f"observed {claim.statistic} over the seeds (no test)", n, gap, groups)
    if min(len(v) for v in series.values()) < 2:
        return _one_seed(claim, cell, gap, n, gap, groups)
    tests = {k: difference_test(series[k], series[expected], 0.0, _alpha(claim), bounded)
             for k in others}
    p_pass = max(t.p_above for t in tests.values())
    p_fail = min(t.p_below for t in tests.values()) * len(others)
    deciding = max(tests.values(), key=lambda t: t.p_above)
    return Scored(cell, gap, math.nan, math.nan, p_pass, min(1.0, p_fail),
                  tests[nearest].alpha, f"{tests[nearest].method} of each other value "
                  f"against {claim.expect} ({len(others)} tests)", n, gap, groups, deciding)


def _along(claim: Claim, values: pd.DataFrame, bounded: bool) -> Outcome:
    assert claim.along is not None  # Claim requires it for trend and lowest
    scored = []
    for cell, part in (values.groupby(claim.by, dropna=False, sort=True) if claim.by
                       else [((), values)]):
        cell = cell if isinstance(cell, tuple) else (cell,)
        series = {key[0]: vals for key, vals in _cells(part, [claim.along])}
        order = sorted(series)
        if claim.test == "lowest":
            scored.append(_lowest(claim, cell, series, bounded))
        elif len(order) >= 2:
            scored.append(_compare(claim, cell, series[order[-1]], series[order[0]], bounded))
    if not scored:
        return Outcome(claim, NOT_RUN, note=f"fewer than two values of {claim.along}")
    outcome = _verdict(claim, scored)
    if claim.test == "lowest":
        outcome.shown = f"next lowest minus {claim.expect}: {outcome.shown}"
    return outcome


RULE = ("Verdicts are one-sided tests at each claim's level: alpha = 1 - level on the "
        "claimed side (default level 95%: alpha = 0.05; sides = 'two' splits it), and half "
        "of that for a threshold on a metric in [0, 1] (an accuracy: 0.025 by default, the "
        "skew of a mean near a bound). Pass when the test of the claim rejects its negation, "
        "fail when the test of the opposite rejects the claim, inconclusive otherwise. Each "
        "verdict names the quantity it tests and the assumption under which its level holds "
        "(docs/claims.md#statistics). Means over seeds: Student's t against a threshold (the "
        "variance of a metric in [0, 1] taken at the threshold), Welch's t for a difference "
        "or for 'trend' (the mean at the last value of `along` minus at the first; the "
        "values between are not tested); constant cells: the exact sign test (a median) or "
        "permutation test; statistic = 'median': the exact sign or rank test, for any shape. "
        "Runs that contradict a t-test's assumption (seeds split off by Dixon's Q test, "
        "seeds at exactly 0 or 1) are named on the verdict's line with the verdict without "
        "those seeds and the distribution-free one. Several cells: 'all' passes when every "
        "cell passes at alpha and fails when one fails at alpha / k (Bonferroni); 'any' the "
        "reverse; 'first' / 'last' decide at the edge the claim names (never at another "
        "value). Reproduced: value [low, high], each end a one-sided (1 - alpha) bound, its "
        "level said. Multiplicity: p_holm (Holm, family-wise) and q_bh (Benjamini-Hochberg, "
        "false-discovery rate) adjust each tested claim's p over the claims of this call. "
        "min / max over seeds describe these seeds, decide on the value itself and are "
        "counted apart. Inconclusive: the runs per group that would decide it (power "
        "calculation). The paper's 95% percentile bootstrap (10,000 resamples) is shown "
        "beside each verdict for comparison and decides nothing; the figures' error bars "
        "follow it.")


def tested(o: Outcome) -> str:
    """What a verdict tests, for people: 'the mean over seeds; level holds if: ...'."""
    if not o.quantity:
        return "-"
    if o.description:
        return f"{o.quantity}: no test, no level"
    return f"{o.quantity}; level holds if: {o.assumption}"


def adjusted(o: Outcome) -> str:
    """'p 0.0024, Holm 0.0096, BH q 0.0048' for a tested claim, '-' otherwise."""
    if not o.tested:
        return "-"
    return f"p {o.p_claim:.2g}, Holm {o.p_holm:.2g}, BH q {o.q_bh:.2g}"


def reproduced(o: Outcome) -> str:
    """The reproduced value for people: value [bounds] (deciding cell) (coverage; note)."""
    extra = "; ".join(x for x in (o.coverage, o.note, o.shape) if x)
    return (o.shown or "-") + (f" ({extra})" if extra else "")


def paper_interval(o: Outcome) -> str:
    """The paper's method beside the verdict: its 95% percentile-bootstrap CI."""
    return "-" if o.bootstrap is None else f"[{o.bootstrap[0]:.4g}, {o.bootstrap[1]:.4g}]"


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
        45 not run (reasons below).' and `multiplicity`; the pass / fail / inconclusive
        counts are of the claims (tested or not run for lack of seeds), descriptions apart."""
        runs = self.results.runs
        finished = int(runs["complete"].sum())
        diverged = int((runs["status"] == "diverged").sum())
        unfinished = len(runs) - finished - diverged
        others = ", ".join(f"{n} {what}" for n, what in ((unfinished, "unfinished"),
                                                          (diverged, "diverged")) if n)
        given = f"{finished} finished run{'s' * (finished != 1)} given" + (
            f" ({others})" if others else "")
        decided = self.decided
        claims = [o for o in decided if not o.description]
        verdicts = ", ".join(f"{sum(o.verdict == v for o in claims)} {v}"
                             for v in (PASS, FAIL, INCONCLUSIVE))
        left = len(self.outcomes) - len(decided)
        multiplicity = self.multiplicity()
        return (f"{len(self.outcomes)} claims; {len(decided)} concern the {given}"
                + (f": {verdicts}" if decided else "")
                + (f"; {left} not run (reasons below)" if left else "") + "."
                + (f" {multiplicity}" if multiplicity else ""))

    def multiplicity(self) -> str:
        """How many of the passes could be chance: the passes that stay passes with the
        family-wise error held (Holm) and with the false-discovery rate held
        (Benjamini-Hochberg) over this call's tests, the false passes expected if every
        tested claim were false at its boundary; the descriptions counted apart."""
        tests = [o for o in self.decided if o.tested]
        passes = [o for o in tests if o.verdict == PASS]
        holm = sum(o.p_holm <= o.alpha for o in passes)
        bh = sum(o.q_bh <= o.alpha for o in passes)
        said = []
        if tests:
            said.append(
                f"Of the {len(tests)} tested claims' {len(passes)} passes, {holm} remain with "
                f"the family-wise error held at each claim's alpha (Holm) and {bh} with the "
                f"false-discovery rate held (Benjamini-Hochberg); were every tested claim "
                f"false at its boundary, {sum(o.alpha for o in tests):.2g} false passes "
                "would be expected by chance.")
        descriptions = [o for o in self.decided if o.description]
        if descriptions:
            said.append(
                f"{len(descriptions)} description{'s' * (len(descriptions) != 1)} of these "
                f"seeds without a test (min / max), counted apart: "
                f"{sum(o.verdict == PASS for o in descriptions)} hold"
                f"{'s' * (sum(o.verdict == PASS for o in descriptions) == 1)}, "
                f"{sum(o.verdict == FAIL for o in descriptions)} do not.")
        return " ".join(said)

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
                 results: Results | None = None, accept_code_change: bool = False,
                 alpha_shares: dict[str, float] | None = None) -> Checked:
    """Every claim of `claims` evaluated on the runs under `runs` (or on `results`, already
    collected from them); nothing is written. `alpha_shares`: by claim id, the share of its
    alpha this look of a staged plan spends (perencode.analysis.sequential)."""
    claims_path = claims_file(claims)
    parsed = [c.model_copy(update={"level": 1 - (alpha_shares or {})[c.id] * (1 - c.level)})
              if c.id in (alpha_shares or {}) else c for c in load_claims(claims_path)]
    results = collect([Path(p) for p in runs], "verify", accept_code_change) \
        if results is None else results
    done: dict[str, Outcome] = {}
    for claim in sorted(parsed, key=lambda c: c.than is not None):  # referenced ones first
        try:
            done[claim.id] = evaluate(claim, results, done)
        except UserError as exc:  # a column the claim names that the runs lack
            raise UserError(f"{claims_path}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - exit 1 means "a claim fails", never a crash
            raise UserError(f"{claims_path}: claim {claim.id} could not be evaluated "
                            f"({type(exc).__name__}: {exc}); please report it with the "
                            "claims file") from exc
    outcomes = [done[c.id] for c in parsed]
    adjust(outcomes)
    return Checked(claims_path, outcomes, results)


def adjust(outcomes: list[Outcome]) -> None:
    """Holm's step-down adjusted p (family-wise error) and the Benjamini-Hochberg q
    (false-discovery rate) of each tested claim's p_claim, over the tested claims of one
    call; the others keep NaN."""
    tests = [o for o in outcomes if o.tested]
    m = len(tests)
    if not m:
        return
    order = sorted(tests, key=lambda o: o.p_claim)
    running = 0.0
    for i, o in enumerate(order):
        running = max(running, min(1.0, (m - i) * o.p_claim))
        o.p_holm = running
    running = 1.0
    for i in range(m - 1, -1, -1):
        running = min(running, min(1.0, m * order[i].p_claim / (i + 1)))
        order[i].q_bh = running


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
