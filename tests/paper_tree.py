"""A finished run tree of every grid of recipes/paper/, made without training.

Every grid is expanded and planned by the package's own code (perencode.config.grid.load_grid,
perencode.commands.sweep.cells.plan and prepare: cells claimed, cells of one recipe linked to one
run, as `perencode sweep` does), then each run gets what `perencode train` and
`perencode stability` leave: metrics.jsonl, the final checkpoint's file, eval.json with
the task's keys and stability.csv with its columns. The numbers are chosen so that every
claim of perencode/claims/paper.toml passes its one-sided test (docs/claims.md#statistics),
seed by seed a little apart (a t-test needs spread).

Thinner than a real tree where nothing reads the difference: metrics.jsonl has a row per
checkpoint (every 5,000 iterations) instead of per 100, except the language models'
(Fig. 15 draws them); stability.csv has 8 triplets per checkpoint instead of 1,024.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from perencode.commands.stability import COLUMNS
from perencode.commands.sweep.cells import RunState, plan, prepare
from perencode.config.grid import load_grid
from perencode.config.recipe import Recipe
from perencode.kinds.tasks.dual_frequency import TYPES, DualFrequencyConfig
from perencode.kinds.tasks.reverse import VariableLengthConfig
from perencode.store.records import EvalRecord, eval_identity
from perencode.store.runs import Run

ROOT = Path(__file__).resolve().parents[1]
GRIDS = sorted((ROOT / "recipes" / "paper").glob("*.toml"))
SEEDS = (111, 222, 333, 444, 555)
TRIPLETS = 8


def jitter(recipe: Recipe, scale: float = 0.002) -> float:
    """A small per-seed offset, -2..+2 times `scale`."""
    return (SEEDS.index(recipe.train.seed) - 2) * scale


def grid_vocabularies(task: str, arch: str) -> list[int]:
    """The vocabulary sizes of the grids of one task and model (the vanilla models degrade
    along them)."""
    sizes = set()
    for path in GRIDS:
        for cell in load_grid(path).cells:
            r = cell.recipe
            if (r.task.name, r.model.arch) == (task, arch):
                sizes.add(r.task.vocab_size)
    return sorted(sizes)


def accuracy(recipe: Recipe, vocabularies: dict) -> float:
    """Token accuracy (or the predecessor's accuracy) of a vocabulary-size run: PE near
    1; vanilla down by 0.08 per step of the grid's vocabulary sizes; the Fig. 12-14
    encodings in the order the paper reports (sinusoidal > random > learnable >
    duplicate ~ vanilla), and larger gaps at variable length (Fig. 14)."""
    task, encoding = recipe.task.name, recipe.encoding.kind
    key = (task, recipe.model.arch)
    if key not in vocabularies:
        vocabularies[key] = grid_vocabularies(*key)
    step = vocabularies[key].index(recipe.task.vocab_size)
    vanilla = 0.9 - 0.08 * step
    if task == "variable_length":
        base = {"none": 0.3, "sinusoidal": 0.95, "random": 0.5, "learnable": 0.4}[encoding]
    else:
        base = {"none": vanilla, "duplicate": vanilla + 0.005, "sinusoidal": 0.99,
                "random": 0.8, "learnable": 0.7}[encoding]
    return base + jitter(recipe)


def sequence_eval(recipe: Recipe, token_accuracy: float) -> dict:
    """perencode.kinds.scoring.summarise's keys for a sequence task of 1,024 held-out rows."""
    n, length = 1024, recipe.task.length
    return {"token_accuracy": token_accuracy, "sequence_accuracy": token_accuracy ** length,
            "dl_distance": (1 - token_accuracy) * length * 0.8, "n_sequences": n,
            "n_tokens": n * length}


def band_accuracy(recipe: Recipe, target: str, disturbants: str, band: int) -> float:
    """Fig. 3: among RARE disturbants the vanilla models lose targets early in the input
    (the GRU and LSTM worst in the first quarter, the S4D in the second); PE is near
    perfect everywhere."""
    if recipe.encoding.kind == "sinusoidal" or disturbants == "frequent":
        return 0.99 + jitter(recipe, 0.001) if recipe.encoding.kind == "sinusoidal" \
            else 0.97 + jitter(recipe, 0.001)
    worst = {"gru": {0: 0.3}, "lstm": {0: 0.3}, "s4d": {0: 0.6, 1: 0.3}}[recipe.model.arch]
    return worst.get(band, 0.9) + jitter(recipe)


def dual_frequency_eval(recipe: Recipe) -> dict:
    """DualFrequencyTask.score's keys: target_accuracy, by_condition, by_band."""
    task = recipe.task
    assert isinstance(task, DualFrequencyConfig)
    length, per_cell = task.length, task.held_out_per_cell
    by_condition: list[dict] = []
    by_band: list[dict] = []
    for target in TYPES:
        for disturbants in TYPES:
            names = {"target": target, "disturbants": disturbants}
            for t in range(1, length + 1):
                acc = band_accuracy(recipe, target, disturbants, (t - 1) * 4 // length)
                by_condition.append(names | {"position": t, "accuracy": acc, "n": per_cell})
            for band in range(4):
                first, last = band * length // 4 + 1, (band + 1) * length // 4
                by_band.append(names | {"band": f"{first}-{last}", "first": first,
                                        "last": last,
                                        "accuracy": band_accuracy(recipe, target,
                                                                  disturbants, band),
                                        "n": per_cell * (last - first + 1)})
    target_accuracy = sum(r["accuracy"] * r["n"] for r in by_band) / sum(
        r["n"] for r in by_band)
    return {**sequence_eval(recipe, target_accuracy), "n_sequences": 4 * length * per_cell,
            "target_accuracy": target_accuracy, "by_condition": by_condition,
            "by_band": by_band}


def variable_length_eval(recipe: Recipe, token_accuracy: float) -> dict:
    task = recipe.task
    assert isinstance(task, VariableLengthConfig) and task.min_length is not None
    lengths = range(task.min_length, task.length + 1)
    by_length = [{"length": n, "token_accuracy": token_accuracy,
                  "sequence_accuracy": token_accuracy ** n,
                  "dl_distance": (1 - token_accuracy) * n, "n": 1024} for n in lengths]
    return {**sequence_eval(recipe, token_accuracy), "by_length": by_length}


# Table 1: five seeds near the paper's min / mean / max (within its 2-point tolerance).
TEST_PERPLEXITY = {"none": (36.9, 37.0, 37.1, 37.2, 37.3),
                   "sinusoidal": (38.1, 38.3, 38.5, 38.7, 38.9)}


def lm_loss(recipe: Recipe, step: int) -> float:
    """Fig. 15: PE's training perplexity is lower early on and the gap closes."""
    start = 2.0 if recipe.encoding.kind == "sinusoidal" else 2.5
    return 3.6 + start * math.exp(-step / 8000) + jitter(recipe, 0.001)


def lm_eval(recipe: Recipe) -> dict:
    """LanguageModelTask.evaluate's keys for the valid and test splits."""
    test = TEST_PERPLEXITY[recipe.encoding.kind][SEEDS.index(recipe.train.seed)]
    out: dict[str, float] = {}
    for split, ppl in (("valid", test + 0.6), ("test", test)):
        out |= {f"{split}_perplexity": ppl, f"{split}_cross_entropy": math.log(ppl),
                f"{split}_tokens": 240_000, f"{split}_paragraphs": 2_400}
    return out


def stability_rows(recipe: Recipe) -> list[dict]:
    """stability.csv rows at every checkpoint: vanilla GRU and LSTM lose stability with
    RARE disturbants over training; the vanilla S4D starts low with them and recovers; PE
    keeps it high."""
    tc = recipe.train
    iterations = list(range(tc.checkpoint_every, tc.iterations + 1, tc.checkpoint_every))
    rows = []
    for iteration in iterations:
        progress = iteration / tc.iterations
        for triplet in range(TRIPLETS):
            condition = triplet // (TRIPLETS // 4)
            target, disturbants = TYPES[condition >= 2], TYPES[condition % 2]
            if disturbants == "frequent" or recipe.encoding.kind == "sinusoidal":
                value = 0.95
            elif recipe.model.arch == "s4d":
                value = 0.5 + 0.4 * progress
            else:
                value = 0.8 - 0.6 * progress
            value += jitter(recipe, 0.001)
            for comparison in ("target", "suffix"):
                rows.append({
                    "iteration": iteration, "comparison": comparison, "target": target,
                    "disturbants": disturbants, "triplet": triplet, "stability": value,
                    "stability_weighted": value, "stability_printed": value,
                    "stability_mean": value, "stability_frobenius": value,
                    "frobenius_distance": 1 - value, "forward_distance": 0.1,
                    "forward_cosine": 0.9, "metric": "weighted",
                    "model": recipe.model.arch, "encoding": recipe.encoding.kind,
                    "seed": recipe.train.seed})
    return rows


def finish(run_dir: Path, recipe: Recipe, vocabularies: dict) -> None:
    """What `perencode train` leaves in a finished run directory."""
    run = Run(run_dir)
    tc = recipe.train
    task = recipe.task.name
    every = tc.log_every if task == "lm" else tc.checkpoint_every
    lines = []
    for step in range(every, tc.iterations + 1, every):
        loss = lm_loss(recipe, step) if task == "lm" else 2.0 * (1 - step / tc.iterations)
        lines.append({"step": step, "loss": loss, "accuracy": 0.5, "lr": 1e-3,
                      "seconds": step * 0.05})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in lines))
    run.checkpoint_dir.mkdir(exist_ok=True)
    run.checkpoint_path(tc.iterations).write_bytes(b"")
    if task == "dual_frequency":
        metrics = dual_frequency_eval(recipe)
    elif task == "lm":
        metrics = lm_eval(recipe)
    elif task == "variable_length":
        metrics = variable_length_eval(recipe, accuracy(recipe, vocabularies))
    elif task == "predecessor":
        acc = accuracy(recipe, vocabularies)
        metrics = {"accuracy": acc, "token_accuracy": acc, "n_sequences": 1024}
    else:
        metrics = sequence_eval(recipe, accuracy(recipe, vocabularies))
    run.write_eval(EvalRecord(**{**eval_identity(recipe), **metrics}, iteration=tc.iterations))


def paper_tree(out: Path) -> dict[str, int]:
    """Every grid of recipes/paper/ planned into `out` and its runs finished; the number of
    cells and of runs."""
    cells = trained = 0
    vocabularies: dict = {}
    for path in GRIDS:
        grid = load_grid(path)
        planned = plan(grid, out)
        prepare(planned)
        cells += len(planned)
        for run in planned:
            if run.state == RunState.NEW:
                trained += 1
                finish(run.dir, run.cell.recipe, vocabularies)
            if "stability" in grid.sweep.after:
                target = run.twin or run.dir
                if not (target / "stability.csv").exists():
                    rows = pd.DataFrame(stability_rows(run.cell.recipe), columns=list(COLUMNS))
                    rows.to_csv(target / "stability.csv", index=False)
    return {"cells": cells, "runs": trained}
