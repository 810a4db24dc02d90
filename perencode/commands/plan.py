"""What a reproduction costs on a GPU, and what a budget buys (`perencode plan`).

For grids (or a folder of them, `recipes/paper`): the unique runs (a recipe shared by two
grids is one run, as the sweep links it), their device-hours on a GPU of the table in
perencode.training.planning (or as `bench` measured them on that GPU: `sweep --estimate`'s cache),
the wall time for the executor, the memory a run needs and the claims each grid's cells
serve. With a budget: the claims, headline first (the claims file's order), whose cells fit
in it, written as grid files `perencode sweep` runs as they are, and a plan.json that
`perencode verify --plan` reads to mark the claims left out.

Every figure says whether it is modelled (FLOPs at the table's rates) or measured; nothing
is timed here, so the same command gives the same numbers.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, get_args

import pandas as pd
import torch
from rich.table import Table

from perencode.analysis import sequential, stats
from perencode.analysis.results import collect, flatten
from perencode.analysis.verdicts import (
    FAIL,
    PASS,
    Claim,
    check_claims,
    claims_file,
    load_claims,
    select,
)
from perencode.common import defaults
from perencode.common.console import console, print_table
from perencode.common.errors import UserError
from perencode.common.files import atomic_write_json, atomic_write_text
from perencode.config.grid import Grid, SlurmConfig, SweepConfig, load_grid
from perencode.config.recipe import Recipe, run_key
from perencode.config.validation import validate_table
from perencode.training import planning
from perencode.training.planning import (
    EFFICIENCY,
    GPU,
    GPUS,
    PEAK,
    Estimates,
    Work,
    gpu,
    local_wall_hours,
    modelled_seconds,
    shape_key,
    slurm_jobs,
    work,
)
from perencode.training.session import CHUNK_LOGITS

PLAN_FILE = "plan.json"
# The analyses a grid runs on its runs (`[sweep] after`), each writing the table of its name.
ANALYSES = get_args(get_args(SweepConfig.model_fields["after"].annotation)[0])
SEED = "train.seed"


@dataclass
class Run:
    """A unique run: its recipe, the grids whose cells it is, its cost."""

    key: str
    recipe: Recipe
    grid: str                       # the grid that trains it (the first to name it)
    cells: list[tuple[str, str]]    # (grid, cell name) of every cell it is
    work: Work
    seconds: float                  # per iteration on the plan's GPU
    measured: str                   # "measured", "extrapolated" (from measured shapes) or ""
    memory: int                     # bytes
    # seconds per iteration at the model's slow and fast ends (EFFICIENCY_RANGE; the scored
    # positions' range of an unprepared corpus); a measured run: its measurement
    range_seconds: tuple[float, float] = (0.0, 0.0)

    @property
    def hours(self) -> float:
        return self.seconds * self.recipe.train.iterations / 3600

    @property
    def config(self) -> str:
        """The run's recipe less its seed: the cell a claim's seeds are drawn for."""
        data = self.recipe.identity()
        data["train"] = {k: v for k, v in data["train"].items() if k != "seed"}
        return json.dumps(data, sort_keys=True)


@dataclass
class GridCost:
    grid: Grid
    runs: list[Run] = field(default_factory=list)     # the runs it trains
    shared: int = 0                                   # its cells another grid trains

    @property
    def hours(self) -> float:
        return sum(r.hours for r in self.runs)


def grid_files(paths: list[Path]) -> list[Path]:
    """Grid files: each path, or a folder's *.toml in name order."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(path.glob("*.toml"))
            if not found:
                raise UserError(f"{path}: no grid files (*.toml) in this folder")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise UserError(f"{path}: no such grid file or folder")
    return files


def choose_gpu(name: str | None) -> tuple[GPU, str]:
    """The GPU the plan prices: --gpu's, else the one present; never this machine's CPU (a
    login node's CPU says nothing of a GPU sweep)."""
    if name is not None:
        return gpu(name), "--gpu"
    if torch.cuda.is_available():
        present = torch.cuda.get_device_name(0)
        for entry in GPUS.values():
            family = entry.name.split()[1].lower()  # "a100", "h100", ...
            if family in present.lower().replace(" ", ""):
                return entry, f"the GPU present ({present})"
        raise UserError(f"--gpu: the GPU present ({present}) is not in the table; name the "
                        f"nearest: {', '.join(GPUS)}")
    raise UserError("--gpu: no GPU on this machine; name the one the jobs will get: "
                    f"{', '.join(GPUS)}")


def measured_label(device: GPU, cache: Estimates) -> str | None:
    """The label under which `sweep --estimate` cached measurements of this GPU's family
    (torch's device name, e.g. 'NVIDIA A100-SXM4-80GB'), if any."""
    family = device.name.split()[1].lower()
    for label in sorted(cache.data):
        if family in label.lower() and not label.startswith("cpu"):
            return label
    return None


def cost_runs(grids: list[Grid], device: GPU, runs_root: Path, precision: str | None = None,
              sized: dict[str, tuple[Work, int]] | None = None,
              ) -> tuple[list[GridCost], dict[str, Run]]:
    """The unique runs of `grids` (linked by run_key, as the sweep links them) and what each
    grid trains of them. `precision`: price every run at this train.precision instead of its
    recipe's (what the lever saves). `sized`: FLOPs and memory by shape, filled as shapes
    are met (a second pass reuses them)."""
    cache = Estimates(runs_root)
    label = measured_label(device, cache)
    unique: dict[str, Run] = {}
    costs: list[GridCost] = []
    sized = {} if sized is None else sized
    for grid in grids:
        cost = GridCost(grid)
        for cell in grid.cells:
            key = run_key(cell.recipe)
            if key in unique:
                unique[key].cells.append((grid.name, cell.name))
                cost.shared += 1
                continue
            recipe = cell.recipe
            shape = shape_key(recipe)
            if shape not in sized:
                sized[shape] = (work(recipe), planning.estimate(recipe, CHUNK_LOGITS).total)
            flops, memory = sized[shape]
            seconds, how = None, ""
            if label is not None and precision is None:
                seconds, was_measured = cache.seconds(label, recipe)
                how = "measured" if was_measured else "extrapolated"
            if seconds is None:
                seconds, how = modelled_seconds(flops, device,
                                                _precision(recipe, precision)), ""
            span = (seconds, seconds) if how else _span(flops, recipe, device,
                                                        _precision(recipe, precision))
            run = Run(key, recipe, grid.name, [(grid.name, cell.name)], flops, seconds, how,
                      memory, span)
            unique[key] = run
            cost.runs.append(run)
        costs.append(cost)
    return costs, unique


def _span(w: Work, recipe: Recipe, device: GPU, precision: str) -> tuple[float, float]:
    """Seconds per iteration at the slow and the fast end of the model's assumptions: the
    efficiencies of EFFICIENCY_RANGE, and for a corpus not prepared, its scored positions
    from the most (the input length, an upper bound) to the fewest expected."""
    slow = {k: v[0] for k, v in planning.EFFICIENCY_RANGE.items()}
    fast = {k: v[1] for k, v in planning.EFFICIENCY_RANGE.items()}
    most = least = w
    if w.scored_source.startswith("expected") and w.scored > 0:
        outputs = float(planning.shapes(recipe.task).outputs)
        fewest = planning.expected_lm_scored(int(outputs), 0)
        most = replace(w, head=w.head * outputs / w.scored)
        least = replace(w, head=w.head * fewest / w.scored)
    return (modelled_seconds(least, device, precision, fast),
            modelled_seconds(most, device, precision, slow))


def _precision(recipe: Recipe, override: str | None) -> str:
    return override or recipe.train.precision


# --------------------------------------------------------------------------------------
# Claims and the cells that decide them
# --------------------------------------------------------------------------------------

def recipe_filters(filters: dict[str, Any], columns: pd.Index) -> dict[str, Any]:
    """The filters on recipe fields (those on a table's own columns, a band or a condition,
    select rows within a run, not runs)."""
    return {k: v for k, v in filters.items() if k in columns}


def claim_runs(claim: Claim, table: pd.DataFrame, claims: dict[str, Claim]) -> set[str]:
    """The run keys whose runs the claim's verdict reads: its filters (and a difference's
    groups), only the first or last cell where the claim says so, and the runs of the claim
    it is compared with (`than`)."""
    rows = select(table, recipe_filters(claim.where, table.columns), f"claim {claim.id}")
    if claim.table in ANALYSES:  # an analysis's table: the runs a grid analyses, only
        rows = rows[rows["analyses"].map(lambda a: claim.table in a).astype(bool)]
    if claim.test == "difference":
        groups = [select(rows, recipe_filters(g, table.columns), f"claim {claim.id}")
                  for g in (claim.a, claim.b)]
        rows = pd.concat(groups) if any(len(g) for g in groups) else rows.iloc[:0]
    ends: tuple[str | None, list[str]] | None = None
    if claim.cells in ("first", "last") and claim.by and claim.by[0] in rows.columns:
        ends = (claim.by[0], [claim.cells])
    if claim.test == "trend" and claim.along in rows.columns:
        ends = (claim.along, ["first", "last"])
    if ends is not None and len(rows):
        column, which = str(ends[0]), ends[1]
        values = sorted(rows[column].dropna().unique())
        keep = [values[0] if w == "first" else values[-1] for w in which]
        rows = rows[rows[column].isin(keep)]
    keys = set(rows["key"])
    if claim.than is not None and claim.than in claims:
        keys |= claim_runs(claims[claim.than], table, claims)
    return keys


def runs_table(unique: dict[str, Run], grids: list[Grid]) -> pd.DataFrame:
    """One row a unique run: its recipe fields, its key and the analyses a grid of its cells
    runs on it (`[sweep] after`: a claim on their table reads those runs only)."""
    after = {g.name: set(g.sweep.after) for g in grids}
    return pd.DataFrame([{**flatten(r.recipe), "key": k,
                          "analyses": frozenset().union(*(after[g] for g, _ in r.cells))}
                         for k, r in unique.items()])


def groups_of(claim: Claim) -> int:
    """Groups the claim's test compares: two for a difference or a trend, one for a value
    against a threshold (threshold, approx, lowest)."""
    return 2 if claim.test in ("difference", "trend") else 1


def observed_effects(claims: list[Claim], paths: list[Path]) -> tuple[dict[str, float], str]:
    """Each claim's effect in standard deviations of the seeds, as finished runs under
    `paths` show it (claims on the runs table with a threshold, difference or approx test,
    where every cell has two runs or more): |mean - value| / sd for a value, |mean_a -
    mean_b| / the groups' root mean variance for a difference; the smallest over the
    claim's cells (the hardest cell decides how many seeds it needs); and how many finished
    runs there were."""
    runs = collect(paths, "plan").runs
    runs = runs[runs["complete"].astype(bool)]
    found: dict[str, float] = {}
    informing = f"{len(runs)} finished run(s)"
    for claim in claims:
        if claim.table != "runs" or claim.test not in ("threshold", "difference", "approx") \
                or claim.metric not in runs.columns:
            continue
        rows = select(runs, recipe_filters(claim.where, runs.columns), f"claim {claim.id}")
        keys = [k for k in claim.by if k in rows.columns]
        effects = []
        for _, cell in (rows.groupby(keys, dropna=False) if keys else [((), rows)]):
            if claim.test == "difference":
                a, b = (select(cell, recipe_filters(g, cell.columns), f"claim {claim.id}")
                        [claim.metric].astype(float) for g in (claim.a, claim.b))
                if min(len(a), len(b)) < 2:
                    continue
                spread = math.sqrt((a.var() + b.var()) / 2)
                gap = abs(a.mean() - b.mean()) - (claim.value if claim.than is None else 0)
            else:
                values = cell[claim.metric].astype(float)
                if len(values) < 2:
                    continue
                spread, gap = values.std(), abs(values.mean() - claim.value)
            effects.append(math.inf if spread == 0 else abs(gap) / spread)
        if effects:
            found[claim.id] = min(effects)
    return found, informing


def _seeds_by_config(unique: dict[str, Run]) -> dict[str, list[Run]]:
    by_config: dict[str, list[Run]] = {}
    for run in unique.values():
        by_config.setdefault(run.config, []).append(run)
    return by_config


# --------------------------------------------------------------------------------------
# A budget
# --------------------------------------------------------------------------------------

# The paper's own numbers where its text gives them (docs/paper-facts.md#effects): a claim's
# effect in standard deviations of the seeds (math.inf: the cells are expected constant, every
# seed at the same value, so the exact test decides), and where the number comes from.
_TABLE1_SD = {"vanilla": (38.916589 - 36.8257) / 2.326,  # range of 5 normal seeds: 2.326 sd
              "pe": (38.893656 - 38.0685) / 2.326}
PAPER_EFFECTS: dict[str, tuple[float, str]] = {
    **{c: (math.inf, "the text's 'above 95%' at every K (§4.1): seeds at 1.0 agree, so the "
                     "exact sign test decides") for c in ("1a-gru-pe-above-95",
                                                         "2a-lstm-pe-above-95")},
    **{c: (math.inf, "the text's 'nearly perfect' (§4.2): seeds at 1.0 agree, so the exact "
                     "sign test decides") for c in ("5e-lstm-pe-nearly-perfect",
                                                   "5f-gru-pe-nearly-perfect-frequent-targets",
                                                   "5g-gru-pe-nearly-perfect-rare-targets",
                                                   "5h-gru-pe-rare-targets-early-bands")},
    "8b-vanilla-mean": (2.0 / _TABLE1_SD["vanilla"],
                        "Table 1: tolerance 2 over the vanilla seeds' sd (range / 2.326)"),
    "8e-pe-mean": (2.0 / _TABLE1_SD["pe"], "Table 1: tolerance 2 over the PE seeds' sd "
                                           "(range / 2.326)"),
    "8g-pe-worse-mean": ((38.5384 - 37.7731) / math.sqrt((_TABLE1_SD["vanilla"] ** 2
                                                          + _TABLE1_SD["pe"] ** 2) / 2),
                         "Table 1: means 38.5384 - 37.7731 over the seeds' pooled sd"),
}
GRID_SEEDS = 5  # the paper's five trials (SPEC: seeds 111 ... 555)
BOUNDED_METRICS = ("accuracy", "token_accuracy", "sequence_accuracy")


@dataclass
class Sized:
    """The seeds a cell a claim is planned with, where they come from and the effect they
    are sized for (standard deviations; inf: constant cells; None: not known)."""

    seeds: int
    source: str        # observed, --seeds, paper, --effect, minimum
    effect: float | None
    why: str


def claim_alpha(claim: Claim, exact: bool = False) -> float:
    """The level each side of the claim's verdict is tested at (perencode.analysis.verdicts):
    1 - level, halved for sides = 'two', and for a t test of a metric in [0, 1] halved again
    (the exact tests of constant cells keep the full alpha)."""
    alpha = round(1.0 - claim.level, 12) / (2.0 if claim.sides == "two" else 1.0)
    return alpha if exact or claim.metric not in BOUNDED_METRICS else alpha / 2


def size_claim(claim: Claim, observed: dict[str, float], effect: float | None,
               seeds: int | None, alpha_scale: float = 1.0) -> Sized:
    """The seeds a cell that decide `claim` at its verdict's own test and level with 80%
    power, from the best source known: the runs observed, --seeds, the paper's numbers, the
    reviewer's --effect, else the fewest seeds its exact test can decide with (a first stage,
    to be topped up from what it shows). `alpha_scale`: the share of alpha this look spends
    (perencode.analysis.sequential)."""
    groups = groups_of(claim)
    alpha, exact = claim_alpha(claim) * alpha_scale, claim_alpha(claim, True) * alpha_scale
    floor = stats.exact_minimum(groups, exact)
    if seeds is not None:
        return Sized(seeds, "--seeds", None, f"--seeds {seeds}")
    for size, source, why in ((observed.get(claim.id), "observed", "the runs observed"),
                              (PAPER_EFFECTS.get(claim.id, (None, ""))[0], "paper",
                               PAPER_EFFECTS.get(claim.id, (None, ""))[1]),
                              (effect, "--effect", "--effect, the reviewer's assumption")):
        if size is None:
            continue
        if claim.statistic != "mean":  # min / max: statements about the seeds there are
            return Sized(GRID_SEEDS, source, size, "min/max over the paper's five seeds")
        if math.isinf(size):
            return Sized(floor, source, size, f"{why}: constant cells, the exact test's "
                                              f"fewest at alpha {exact:.3g}")
        n = stats.seeds_needed(size, groups, alpha=alpha, floor=floor)
        if n is None:
            return Sized(101, source, size, f"{why}: over 100 seeds")
        return Sized(n, source, size, f"{why}: {size:.2g} sd at alpha {alpha:.3g}, 80% power")
    return Sized(floor, "minimum", None, "no effect known: the fewest seeds its exact test "
                                         "decides with; power unknown until these runs show "
                                         "the effect (a first stage: top up with --observed)")


@dataclass
class Priced:
    """Hours of a set of runs by part, each (low, modelled, high)."""

    parts: dict[str, list[float]] = field(default_factory=dict)

    def add(self, part: str, low: float, mid: float, high: float) -> None:
        have = self.parts.setdefault(part, [0.0, 0.0, 0.0])
        for i, x in enumerate((low, mid, high)):
            have[i] += x

    def total(self, which: int = 1) -> float:
        return sum(v[which] for v in self.parts.values())


def run_parts(run: Run, executor: str, cfg: SlurmConfig | None) -> dict[str, tuple]:
    """A run's hours beside nothing else, by part, (low, modelled, high): training, its
    held-out scoring, its start-up and, on SLURM, its requeues (each a start-up and the
    iterations since the last checkpoint, half an interval on average)."""
    iters = run.recipe.train.iterations
    lo, hi = run.range_seconds
    train = (lo * iters / 3600, run.hours, hi * iters / 3600)
    e = planning.evaluation_iterations(run.recipe)
    evaluation = (lo * e / 3600, run.seconds * e / 3600, hi * e / 3600)
    start = tuple(m / 60 for m in planning.STARTUP_MINUTES)
    parts: dict[str, tuple] = {"training": train, "evaluation": evaluation, "start-up": start}
    if executor == "slurm" and cfg is not None:
        usable = cfg.time_min / 60 - cfg.signal_delay_s / 3600
        lost = run.recipe.train.checkpoint_every / 2 / 3600
        parts["requeues"] = tuple(
            (math.ceil(t / usable) - 1) * (start[i] + sec * lost)
            for i, (t, sec) in enumerate(zip(train, (lo, run.seconds, hi))))
    return parts


@dataclass
class Budgeted:
    hours: float
    seeds_source: str
    chosen: dict[str, Run]                                  # run key -> run
    analyses: dict[str, set[str]]                           # run key -> analyses its claims read
    decided: list[Claim]
    left_out: list[tuple[Claim, str]]                       # claim, why
    cost: float = 0.0                                       # modelled, everything priced
    seeds_per_claim: dict[str, Sized] = field(default_factory=dict)
    priced: Priced = field(default_factory=Priced)
    near: list[tuple[Claim, float, float]] = field(default_factory=list)  # needs, left
    order: str = "priority"


def within_budget(claims: list[Claim], unique: dict[str, Run], table: pd.DataFrame,
                  budget: float, seeds: int | None, effect: float | None,
                  observed: dict[str, float] | None = None, order: str = "priority",
                  executor: str = "local", cfg: SlurmConfig | None = None,
                  device: GPU | None = None, alpha_scale: float = 1.0,
                  done: set[str] | None = None,
                  served: dict[str, set[str]] | None = None) -> Budgeted:
    """The claims a budget decides, headline first: by the claims file's `priority` (the
    paper's Fig. 2 first), then within a priority the claim that costs the fewest hours
    more (claims decided per GPU-hour, runs shared by claims counted once), again and again
    until none fits (`order = "file"`: the file's order instead, the reviewer's own). A
    claim's cells get the seeds `size_claim` gives; every hour is priced (run_parts, the
    stability analysis of the runs a stability claim reads, the GPU check once). `done`:
    the keys of runs trained already (a first stage's), which cost nothing more; `served`:
    claim_runs of each claim where the caller has them already."""
    observed = observed or {}
    device = device or planning.gpu("a100")
    by_config: dict[str, list[Run]] = {}
    for run in unique.values():
        by_config.setdefault(run.config, []).append(run)
    for same in by_config.values():
        same.sort(key=lambda r: r.recipe.train.seed)
    index = {c.id: c for c in claims}
    parts_of = {k: run_parts(r, executor, cfg) for k, r in unique.items()}
    matmul = planning.EFFICIENCY_RANGE["matmul"]
    stab = {k: tuple(planning.stability_hours(r.recipe, device, {"matmul": m})
                     for m in (matmul[1], planning.EFFICIENCY["matmul"], matmul[0]))
            for k, r in unique.items()}
    priced = Priced()
    priced.add("GPU check", *(m / 60 for m in planning.GPU_CHECK_MINUTES))
    wanted: dict[str, tuple[set[str], Sized]] = {}
    left_out: list[tuple[Claim, str]] = []
    sized_all: dict[str, Sized] = {}
    for claim in claims:
        keys = (served or {}).get(claim.id)
        if keys is None:
            keys = claim_runs(claim, table, index)
        if not keys:
            left_out.append((claim, "no cell of these grids"))
            continue
        sized = size_claim(claim, observed, effect, seeds, alpha_scale)
        sized_all[claim.id] = sized
        needed: set[str] = set()
        short = 0
        for config in sorted({unique[k].config for k in keys}):
            have = by_config[config]
            short = max(short, sized.seeds - len(have))
            needed |= {r.key for r in have[:sized.seeds]}
        if short > 0:
            left_out.append((claim, f"needs {sized.seeds} seeds a cell ({sized.why}); the grids "
                                    f"have {sized.seeds - short}: add seeds to train.seed"))
            continue
        wanted[claim.id] = (needed, sized)

    chosen: set[str] = set(done or ()) & set(unique)
    analysed: set[tuple[str, str]] = {(k, "stability") for k in chosen}
    trained_before = set(chosen)

    def marginal(cid: str, which: int = 1) -> float:
        need, _ = wanted[cid]
        # in key order, rounded: the same sum whatever the order of a set (ties between
        # claims of equal cost go to the file's order, on every machine)
        more = sum(sum(v[which] for v in parts_of[k].values()) for k in sorted(need - chosen))
        if index[cid].table == "stability":
            more += sum(stab[k][which] for k in sorted(need)
                        if (k, "stability") not in analysed)
        return round(more, 9)

    decided: list[Claim] = []
    spent = priced.total()
    tiers: dict[int, list[str]] = {}
    for claim in claims:
        if claim.id in wanted:
            tier = claim.priority if order == "priority" else 0
            tiers.setdefault(tier, []).append(claim.id)
    for tier in sorted(tiers):
        pending = list(tiers[tier])
        while pending:
            if order == "priority":
                fits = [c for c in pending if spent + marginal(c) <= budget]
                if not fits:
                    break
                pick = min(fits, key=marginal)  # stable: ties in the file's order
            else:
                pick = pending[0]
                if spent + marginal(pick) > budget:
                    pending.pop(0)
                    continue
            spent += marginal(pick)
            picked, _ = wanted[pick]
            for k in sorted(picked - chosen):
                for part, v in parts_of[k].items():
                    priced.add(part, *v)
            if index[pick].table == "stability":
                for k in sorted(picked):
                    if (k, "stability") not in analysed:
                        priced.add("stability analysis", *stab[k])
                        analysed.add((k, "stability"))
            chosen |= picked
            decided.append(index[pick])
            pending.remove(pick)
    near: list[tuple[Claim, float, float]] = []
    taken = {c.id for c in decided}
    for claim in claims:
        if claim.id in wanted and claim.id not in taken:
            needs, left = marginal(claim.id), budget - spent
            left_out.append((claim, f"needs {_h(needs)}; {_h(left)} left"))
            if needs - left <= 0.25 * budget:
                near.append((claim, needs, left))
    left_out.sort(key=lambda item: [c.id for c in claims].index(item[0].id))
    analyses: dict[str, set[str]] = {}
    for claim in decided:
        if claim.table in ANALYSES:
            for key in wanted[claim.id][0]:
                analyses.setdefault(key, set()).add(claim.table)
    sources = sorted({sized_all[c.id].source for c in decided})
    used = set().union(*(wanted[c.id][0] for c in decided)) if decided else set()
    return Budgeted(budget, ", ".join(sources) or "-",
                    {k: unique[k] for k in sorted(used | (chosen - trained_before))},
                    analyses, decided, left_out,
                    priced.total(), {c.id: sized_all[c.id] for c in decided}, priced,
                    sorted(near, key=lambda x: x[1] - x[2]), order)


def budget_doc(b: Budgeted, stages: int, notes: list[str], at: int = 1) -> dict[str, Any]:
    """The budget's part of the plan's document."""
    low, mid, high = (b.priced.total(i) for i in range(3))
    look = {"looks": stages, "look": at, "rule": sequential.RULE,
            "fractions": sequential.look_fractions(stages),
            "alpha_share": sequential.share(at, stages)}
    return {
        "hours": b.hours, "modelled_hours": mid, "range_hours": [low, high],
        "margin_hours": b.hours - mid, "over_budget_at_high": max(0.0, high - b.hours),
        "parts": {k: v for k, v in b.priced.parts.items()}, "runs": len(b.chosen),
        "order": b.order, "seeds": b.seeds_source, "stages": look,
        "decided": [c.id for c in b.decided],
        "seeds_per_claim": {k: {"seeds": z.seeds, "source": z.source,
                                "effect_sd": None if z.effect is None or math.isinf(z.effect)
                                else z.effect, "constant": z.effect is not None
                                and math.isinf(z.effect), "why": z.why}
                            for k, z in b.seeds_per_claim.items()},
        "near_misses": [{"id": c.id, "needs_hours": needs, "left_hours": left}
                        for c, needs, left in b.near],
        "left_out": [{"id": c.id, "why": why} for c, why in b.left_out],
        "notes": notes,
        "measure_first": "perencode sweep GRID --estimate on one cell of each grid, on the "
                         "GPU the jobs get: its seconds per iteration replace the model here"}


def first_stage(path: Path, claims: list[Claim], observed: list[Path],
                claims_path: Path) -> tuple[dict[str, str], set[str], list[Claim]]:
    """A top-up after the first stage of a plan of two looks (its plan.json at `path`, its
    runs under `observed`): the claims that stage planned, verified on those runs at the
    first look's alpha; those decided (pass or fail) are settled, the rest are planned
    again at the second look, the first stage's runs counted as done (no hours)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        looks, planned, keys = data["looks"], data["decided"], data["run_keys"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"--top-up {path}: not a plan.json of `perencode plan --stages 2 "
                        "--write`") from None
    if looks.get("of") != 2 or looks.get("look") != 1:
        raise UserError(f"--top-up {path}: look {looks.get('look')} of {looks.get('of')}; "
                        "expected the first stage of a plan of two looks (--stages 2)")
    if not observed:
        raise UserError(f"--top-up {path}: give the first stage's runs with --observed RUNS")

    shares = {cid: sequential.share(1, 2, looks.get("rule", sequential.RULE))
              for cid in planned}
    checked = check_claims(observed, claims_path, alpha_shares=shares)
    settled = {o.claim.id: o.verdict for o in checked.outcomes
               if o.claim.id in planned and o.verdict in (PASS, FAIL)}
    return settled, set(keys), [c for c in claims if c.id in planned and c.id not in settled]


def _clear_earlier(out: Path) -> None:
    """A folder that held an earlier plan: its grid files and plan.json go, so that a sweep
    of the folder trains this plan only; grid files no plan wrote there: refused."""
    earlier = out / PLAN_FILE
    listed: set[str] = set()
    if earlier.exists():
        try:
            listed = set(json.loads(earlier.read_text(encoding="utf-8"))["grids"])
        except (OSError, ValueError, KeyError, TypeError):
            raise UserError(f"--write {out}: {earlier} is no plan.json of `perencode plan`; "
                            "give another folder") from None
    strangers = sorted(p.name for p in out.glob("*.toml") if p.name not in listed)
    if strangers:
        raise UserError(f"--write {out}: holds grid files no plan wrote ({', '.join(strangers)})"
                        "; give a new folder or one holding only an earlier plan")
    for name in sorted(listed):
        (out / name).unlink(missing_ok=True)
    earlier.unlink(missing_ok=True)


def write_plan(budgeted: Budgeted, grids: list[Grid], out: Path, claims_path: Path,
               device: GPU, stages: int = 1, look: int = 1,
               settled: dict[str, str] | None = None) -> list[Path]:
    """Grid files of the chosen cells, one per source grid whose chosen cells form a
    product of axis values (else one per cell less its seed), and plan.json. A run is
    written in the first of its grids that runs the analyses its claims read (Fig. 5's
    stability grids for Fig. 3's runs)."""
    out.mkdir(parents=True, exist_ok=True)
    _clear_earlier(out)
    written: list[Path] = []
    after = {g.name: set(g.sweep.after) for g in grids}
    home = {key: next((g for g, _ in run.cells
                       if budgeted.analyses.get(key, set()) <= after[g]), run.grid)
            for key, run in budgeted.chosen.items()}
    for grid in grids:
        cells = [c for c in grid.cells if home.get(run_key(c.recipe)) == grid.name]
        if not cells:
            continue
        axes = list(cells[0].coords)
        values = {a: _unique([c.coords[a] for c in cells]) for a in axes}
        product = {tuple(map(_frozen, combo)) for combo in
                   itertools.product(*(values[a] for a in axes))}
        chosen = {tuple(_frozen(c.coords[a]) for a in axes) for c in cells}
        if product == chosen:
            parts = [cells]
        else:
            groups: dict[str, list] = {}
            for c in cells:
                rest = json.dumps({a: v for a, v in c.coords.items() if a != SEED},
                                  sort_keys=True)
                groups.setdefault(rest, []).append(c)
            parts = list(groups.values())
        for i, part in enumerate(parts):
            name = grid.path.stem if len(parts) == 1 else f"{grid.path.stem}-{i + 1}"
            path = out / f"{name}.toml"
            base = os.path.relpath(grid.path.resolve(), out.resolve())
            lines = [f"# perencode plan: the cells of {grid.path.name} a budget of "
                     f"{budgeted.hours:g} GPU-hours on {device.name} trains",
                     f"base = {json.dumps(base)}", "", "[grid]"]
            for axis in axes:
                lines.append(f"{json.dumps(axis)} = "
                             f"{json.dumps(_unique([c.coords[axis] for c in part]))}")
            atomic_write_text(path, "\n".join(lines) + "\n")
            written.append(path)
    atomic_write_json(out / PLAN_FILE, {
        "format": "perencode plan", "claims": str(claims_path), "gpu": device.name,
        "budget_hours": budgeted.hours, "modelled_hours": round(budgeted.cost, 3),
        "seeds": budgeted.seeds_source, "runs": len(budgeted.chosen),
        "grids": [p.name for p in written],
        "decided": [c.id for c in budgeted.decided],
        "seeds_per_claim": {k: z.seeds for k, z in budgeted.seeds_per_claim.items()},
        "looks": {"look": look, "of": stages, "rule": sequential.RULE,
                  "fractions": sequential.look_fractions(stages)},
        "settled": settled or {}, "run_keys": sorted(budgeted.chosen),
        "left_out": [{"id": c.id, "why": why} for c, why in budgeted.left_out]})
    return written


def _frozen(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _unique(values: list) -> list:
    seen: list = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


# --------------------------------------------------------------------------------------
# Executors: wall time and the SLURM view
# --------------------------------------------------------------------------------------

def local_wall(runs: list[Run], gpus: int, runs_per_gpu: int) -> float:
    """Hours until the last of `runs` ends on the local executor (planning.local_wall_hours)."""
    return local_wall_hours([r.hours for r in runs], gpus, runs_per_gpu)


def slurm_view(runs: list[Run], cfg: SlurmConfig) -> dict[str, Any]:
    """The SLURM jobs of `runs` (planning.slurm_jobs)."""
    return slurm_jobs([r.hours for r in runs], cfg)


# --------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------

def _h(hours: float) -> str:
    if hours < 1:
        return f"{hours * 60:.3g} min"
    return f"{hours:,.0f} h" if hours >= 100 else f"{hours:.3g} h"


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def plan(paths: list[Path], gpu_name: str | None = None, claims: str | Path = defaults.CLAIMS,
         budget: float | None = None, seeds: int | None = None, effect: float | None = None,
         executor: str = "local", gpus: int = 1, runs_per_gpu: int = defaults.SWEEP_RUNS_PER_GPU,
         slurm: dict[str, Any] | None = None, runs_root: Path = defaults.RUNS,
         write: Path | None = None, as_json: bool = False,
         observed: list[Path] | None = None, order: str = "priority",
         stages: int = 1, top_up: Path | None = None) -> dict[str, Any]:
    """The plan's document (what --json prints), printed for people unless `as_json`."""
    if executor not in ("local", "slurm"):
        raise UserError(f"--executor '{executor}': expected local or slurm")
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise UserError(f"--budget {budget:g}: expected a finite number of GPU-hours above 0")
    if effect is not None and not (math.isfinite(effect) and effect > 0):
        raise UserError(f"--effect {effect:g}: expected a finite effect above 0 standard "
                        "deviations")
    if seeds is not None and seeds < 2:
        raise UserError(f"--seeds {seeds}: expected at least 2 (a t test needs two per group)")
    if order not in ("priority", "file"):
        raise UserError(f"--order '{order}': expected priority or file")
    if stages not in (1, 2):
        raise UserError(f"--stages {stages}: expected 1 (one look) or 2 (a first stage, then "
                        "a top-up)")
    if write is not None and write.exists() and not write.is_dir():
        raise UserError(f"--write {write}: a file; expected a folder (new, or one holding an "
                        "earlier plan)")
    grids = [load_grid(p) for p in grid_files(paths)]
    device, device_source = choose_gpu(gpu_name)
    sized: dict[str, tuple[Work, int]] = {}
    costs, unique = cost_runs(grids, device, runs_root, sized=sized)
    _, as_tf32 = cost_runs(grids, device, runs_root, precision="tf32", sized=sized)
    claims_path = claims_file(claims)
    parsed = load_claims(claims_path)
    index = {c.id: c for c in parsed}
    table = runs_table(unique, grids)
    served = {c.id: claim_runs(c, table, index) for c in parsed}
    runs = list(unique.values())
    total = sum(r.hours for r in runs)
    floor = sum(modelled_seconds(r.work, device, _precision(r.recipe, None), PEAK)
                * r.recipe.train.iterations for r in runs if not r.measured) / 3600
    measured = sum(bool(r.measured) for r in runs)
    doc: dict[str, Any] = {
        "gpu": {"name": device.name, "from": device_source, "fp32_tflops": device.fp32,
                "tf32_tflops": device.tf32, "half_tflops": device.half,
                "memory_gb": device.memory_gb, "bandwidth_gbs": device.bandwidth_gbs},
        "model": {"efficiency": EFFICIENCY, "efficiency_range": planning.EFFICIENCY_RANGE,
                  "measured_runs": measured, "modelled_runs": len(runs) - measured},
        "grids": [], "cells": sum(len(g.cells) for g in grids), "runs": len(runs),
        "gpu_hours": total, "gpu_hours_at_peak": floor,
        "gpu_hours_tf32": sum(r.hours for r in as_tf32.values()),
        "layer_eflop": sum(r.work.layer * r.recipe.train.iterations for r in runs) / 1e18,
        "head_eflop": sum(r.work.head * r.recipe.train.iterations for r in runs) / 1e18,
        "scored": sorted({f"{r.work.scored:g} ({r.work.scored_source})" for r in runs
                          if r.work.scored_source != "task"}),
    }
    slurm_cfg = None
    for cost_ in costs:
        grid_keys = {run_key(c.recipe) for c in cost_.grid.cells}
        entry = {"grid": cost_.grid.name, "cells": len(cost_.grid.cells),
                 "runs": len(cost_.runs), "shared": cost_.shared, "gpu_hours": cost_.hours,
                 "memory_bytes": max((r.memory for r in cost_.runs), default=0),
                 "claims": [c.id for c in parsed if served[c.id] & grid_keys]}
        cfg = validate_table(SlurmConfig, {**cost_.grid.slurm.model_dump(exclude_unset=True),
                                           **(slurm or {})}, "--slurm options", "slurm")
        slurm_cfg = slurm_cfg or cfg
        entry["wall_hours"] = local_wall(cost_.runs, gpus, runs_per_gpu)
        if executor == "slurm":
            entry["slurm"] = slurm_view(cost_.runs, cfg)
        doc["grids"].append(entry)
    doc["wall_hours"] = local_wall(runs, gpus, runs_per_gpu)
    if executor == "slurm":
        doc["slurm"] = {k: sum(g["slurm"][k] for g in doc["grids"])
                        for k in ("jobs", "over_limit", "requeues", "gpu_hours_charged")}
    if budget is not None:
        if seeds is not None:
            fewest = min(len(v) for v in _seeds_by_config(unique).values())
            if seeds > fewest:
                raise UserError(f"--seeds {seeds}: the grids have {fewest} seeds a cell "
                                "(train.seed); give at most that, or add seeds to the grids")
        effects: dict[str, float] = {}
        notes: list[str] = []
        if observed:
            effects, informing = observed_effects(parsed, observed)
            if not effects:
                notes.append(f"--observed {', '.join(map(str, observed))}: {informing}; "
                             "they inform no claim of " f"{claims_path.name}, so no seeds "
                             "follow from them")
        look = 1
        settled: dict[str, str] = {}
        done: set[str] = set()
        planned = parsed
        if top_up is not None:
            look, stages = 2, 2
            settled, done, planned = first_stage(top_up, parsed, observed or [], claims_path)
        scale = sequential.share(look, stages)
        budgeted = within_budget(planned, unique, table, budget, seeds, effect, effects,
                                 order, executor, slurm_cfg, device, scale, done, served)
        for cid, verdict in settled.items():
            budgeted.left_out.append((index[cid], f"decided at look 1 of 2: {verdict}"))
        doc["budget"] = budget_doc(budgeted, stages, notes, look)
        if top_up is not None:
            doc["budget"]["settled"] = settled
        if write is not None:
            doc["budget"]["written"] = [str(p) for p in write_plan(
                budgeted, grids, write, claims_path, device, stages, look, settled)]
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        _print(doc, executor, gpus, runs_per_gpu, write)
    return doc


def _print(doc: dict[str, Any], executor: str, gpus: int, runs_per_gpu: int,
           write: Path | None) -> None:
    g = doc["gpu"]
    table = Table(title=f"plan on {g['name']} ({g['from']})")
    # 100 columns: the claims fold onto more lines; runs/cells says what other grids train
    columns = ["grid", "runs/cells", "GPU-hours", "memory", "claims"]
    if executor == "slurm":
        columns[4:4] = ["jobs", "limit", "over", "requeues"]
    for col in columns:
        table.add_column(col, justify="left" if col in ("grid", "claims") else "right",
                         overflow="fold", max_width=17 if col == "claims" else None)
    for entry in doc["grids"]:
        row = [entry["grid"], f"{entry['runs']}/{entry['cells']}",
               _h(entry["gpu_hours"]) if entry["runs"] else "-",
               _gb(entry["memory_bytes"]) if entry["runs"] else "-",
               ", ".join(c.split("-")[0] for c in entry["claims"]) or "-"]
        if executor == "slurm":
            s = entry["slurm"]
            row[4:4] = [str(s["jobs"]), f"{s['time_limit_min']} min", str(s["over_limit"]),
                        str(s["requeues"])]
        table.add_row(*row)
    print_table(table)
    model = doc["model"]
    how = (f"modelled: FLOPs at the datasheet's peak rates (fp32 {g['fp32_tflops']:g}, TF32 "
           f"{g['tf32_tflops']:g} TFLOP/s) x an assumed efficiency, cuDNN's recurrent "
           f"layers {EFFICIENCY['cudnn']:g} (TF32, torch's default), matmuls (heads, S4D) "
           f"{EFFICIENCY['matmul']:g} (fp32)")
    if model["measured_runs"]:
        how = (f"{model['measured_runs']} run(s) measured by `sweep --estimate` on this GPU "
               f"(or extrapolated from its measured shapes by FLOPs), "
               f"{model['modelled_runs']} {how}")
    console.print(
        f"{doc['runs']} unique runs of {doc['cells']} cells (a run shared by grids counted "
        f"once); {_h(doc['gpu_hours'])} on {g['name']} ({how}); at the peak "
        f"rates, a floor: {_h(doc['gpu_hours_at_peak'])}. Recurrent layers "
        f"{doc['layer_eflop']:,.3g} EFLOP, heads {doc['head_eflop']:,.3g} EFLOP.",
        highlight=False, soft_wrap=True)
    for entry in doc["grids"]:
        if entry["memory_bytes"] > g["memory_gb"] * 1e9:
            console.print(f"[yellow]warning:[/] {entry['grid']}: a run needs "
                          f"{_gb(entry['memory_bytes'])}, more than the {g['memory_gb']:g} GB "
                          f"of {g['name']}", highlight=False)
    for scored in doc["scored"]:
        console.print(f"language model: {scored} scored positions a sequence", highlight=False)
    console.print(f"train.precision = \"tf32\" (heads in TF32): {_h(doc['gpu_hours_tf32'])} "
                  f"(saves {_h(doc['gpu_hours'] - doc['gpu_hours_tf32'])})",
                  highlight=False)
    if executor == "slurm":
        s = doc["slurm"]
        console.print(f"slurm: {s['jobs']} jobs (one run each), {_h(s['gpu_hours_charged'])} "
                      f"charged; {s['over_limit']} run(s) exceed their job's time "
                      f"limit and rely on requeue ({s['requeues']} requeues expected)",
                      highlight=False)
    else:
        console.print(f"wall time on {gpus} GPU(s), {runs_per_gpu} run(s) a GPU: "
                      f"{_h(doc['wall_hours'])} (runs sharing a GPU share its throughput)",
                      highlight=False)
    budget = doc.get("budget")
    if budget is None:
        return
    low, high = budget["range_hours"]
    over = budget["over_budget_at_high"]
    above = f", {_h(over)} over the budget at the high end" if over else ""
    console.print(f"budget {budget['hours']:g} GPU-hours: {len(budget['decided'])} claim(s) "
                  f"decided by {budget['runs']} runs, {_h(budget['modelled_hours'])} modelled "
                  f"({_h(low)} to {_h(high)}{above}); margin "
                  f"{_h(budget['margin_hours'])}. Priced: "
                  + ", ".join(f"{k} {_h(v[1])}" for k, v in budget["parts"].items()),
                  highlight=False, soft_wrap=True)
    table = Table(title=f"claims decided, in the order planned ({budget['order']})")
    for col in ("claim", "seeds a cell", "sized from"):
        table.add_column(col, overflow="fold")
    why: dict[str, str] = {}
    for cid in budget["decided"]:
        z = budget["seeds_per_claim"][cid]
        table.add_row(cid, str(z["seeds"]), z["source"])
        why.setdefault(z["source"], z["why"])
    print_table(table)
    for source, words in why.items():
        console.print(f"  {source}: {words}", highlight=False, soft_wrap=True)
    for item in budget["near_misses"]:
        short = item["needs_hours"] - item["left_hours"]
        console.print(f"near miss: {item['id']} needs {_h(item['needs_hours'])}; "
                      f"{_h(item['left_hours'])} left ({_h(short)} short)", highlight=False,
                      soft_wrap=True)
    for item in budget["left_out"]:
        console.print(f"left out: {item['id']}: {item['why']}", highlight=False, soft_wrap=True)
    for note in budget["notes"]:
        console.print(f"[yellow]note:[/] {note}", highlight=False, soft_wrap=True)
    console.print(f"before the request: {budget['measure_first']}.", highlight=False,
                  soft_wrap=True)
    if write is not None:
        console.print(f"wrote {write / PLAN_FILE} and {len(budget['written'])} grid file(s): "
                      f"`perencode sweep FILE` each, then `perencode verify RUNS --plan "
                      f"{write / PLAN_FILE}`", highlight=False, soft_wrap=True)


# --------------------------------------------------------------------------------------
# REPRODUCE.md's cost section
# --------------------------------------------------------------------------------------

SECTION_BEGIN = "<!-- perencode plan: generated by tools/cost_section.py, do not edit -->"
SECTION_END = "<!-- perencode plan: end -->"


def cost_section(paths: list[Path], gpu_name: str = "a100",
                 budgets: tuple[float, ...] = (24, 100, 500, 1e9),
                 claims: str | Path = defaults.CLAIMS) -> str:
    """The markdown of `plan` for the whole of `paths` and each budget, as REPRODUCE.md
    shows it (between SECTION_BEGIN and SECTION_END); paths as given, relative ones
    printed as given."""
    grids = [load_grid(p) for p in grid_files(paths)]
    device = gpu(gpu_name)
    sized: dict[str, tuple[Work, int]] = {}
    # No measurement is read (a runs root that cannot exist): the section is the model's.
    nowhere = Path("/nonexistent/perencode-plan")
    costs, unique = cost_runs(grids, device, nowhere, sized=sized)
    _, tf32 = cost_runs(grids, device, nowhere, precision="tf32", sized=sized)
    parsed = load_claims(claims_file(claims))
    table = runs_table(unique, grids)
    index = {c.id: c for c in parsed}
    served = {c.id: claim_runs(c, table, index) for c in parsed}
    runs = list(unique.values())
    total = sum(r.hours for r in runs)
    floor = sum(modelled_seconds(r.work, device, r.recipe.train.precision, PEAK)
                * r.recipe.train.iterations for r in runs) / 3600
    command = f"perencode plan {' '.join(str(p) for p in paths)} --gpu {gpu_name}"
    lines = [SECTION_BEGIN, "", f"`{command}` (modelled: {device.name}, datasheet peak rates "
             f"fp32 {device.fp32:g} and TF32 {device.tf32:g} TFLOP/s, assumed efficiency "
             f"{EFFICIENCY['cudnn']:g} for cuDNN's recurrent layers in TF32 and "
             f"{EFFICIENCY['matmul']:g} for the fp32 matmuls of the heads and the S4D):",
             "",
             "| grid | cells | runs trained | GPU-hours | memory a run | claims its cells serve |",
             "|---|---|---|---|---|---|"]
    for gc in costs:
        keys = {run_key(c.recipe) for c in gc.grid.cells}
        ids = [c.id.split("-")[0] for c in parsed if served[c.id] & keys]
        trained = (str(len(gc.runs)) if not gc.shared else
                   f"{len(gc.runs)} ({gc.shared} shared)")
        lines.append(f"| `{gc.grid.name}` | {len(gc.grid.cells)} | {trained} | "
                     f"{_h(gc.hours) if gc.runs else '-'} | "
                     f"{_gb(max(r.memory for r in gc.runs)) if gc.runs else '-'} | "
                     f"{', '.join(ids) or '-'} |")
    layer = sum(r.work.layer * r.recipe.train.iterations for r in runs) / 1e18
    head = sum(r.work.head * r.recipe.train.iterations for r in runs) / 1e18
    scored = sorted({f"{r.work.scored:g} a sequence ({r.work.scored_source.split(':')[0]})"
                     for r in runs if r.work.scored_source != "task"})
    lines += [f"| all | {sum(len(g.cells) for g in grids)} | {len(runs)} | {_h(total)} | | |",
              "", f"At the peak rates (a floor no run beats): {_h(floor)}. With "
              f"`train.precision = \"tf32\"` (the heads' matmuls in TF32): "
              f"{_h(sum(r.hours for r in tf32.values()))}. Recurrent layers {layer:,.0f} "
              f"EFLOP, heads {head:,.0f} EFLOP. Language model's scored positions: "
              f"{'; '.join(scored) or '-'}.", "",
              "What a budget decides (`perencode plan recipes/paper --gpu a100 --budget "
              "HOURS`): every hour priced (training, held-out scoring, start-up, the "
              "stability analysis of the runs a stability claim reads, the GPU check once), "
              "the modelled figure within the budget, the range from the model's assumed "
              "efficiencies (and, for the language model, its scored positions). Three plans "
              "of the same claims: one look with each claim's seeds sized from its best source "
              "(the default; with no effect known, the fewest its exact test decides with), "
              "the first stage of two looks (`--stages 2`: a share of alpha at the first look, "
              "so exact tests need more seeds; a top-up, `--top-up`, follows only for the "
              "claims left undecided, at most to the grid's 5 seeds), and the paper's fixed 5 "
              "seeds a cell (`--seeds 5`). Claims in planning order, Fig. 2 first.", "",
              "| budget | plan | runs | GPU-hours (range) | claims decided |",
              "|---|---|---|---|---|"]
    for hours in budgets:
        for name, seeds, stages in (("one look, sized", None, 1),
                                    ("first stage of two", None, 2),
                                    ("5 seeds a cell", 5, 1)):
            b = within_budget(parsed, unique, table, hours, seeds, None, device=device,
                              alpha_scale=sequential.share(1, stages), served=served)
            label = "whole paper" if hours >= 1e6 else f"{hours:g}"
            lines.append(f"| {label} | {name} | {len(b.chosen)} | {_h(b.cost)} "
                         f"({_h(b.priced.total(0))}-{_h(b.priced.total(2))}) | "
                         f"{len(b.decided)}: "
                         f"{', '.join(c.id.split('-')[0] for c in b.decided) or '-'} |")
    lines += ["", SECTION_END]
    return "\n".join(lines) + "\n"


def with_section(text: str, section: str) -> str:
    """`text` (REPRODUCE.md) with its generated cost section replaced by `section`."""
    start, end = text.find(SECTION_BEGIN), text.find(SECTION_END)
    if start < 0 or end < start:
        raise UserError(f"no section between '{SECTION_BEGIN}' and '{SECTION_END}'")
    return text[:start] + section + text[end + len(SECTION_END) + 1:]
