"""Hand-made run directories whose numbers are known, for results, figures and verify."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from perencode.config.recipe import Recipe, validate
from perencode.store.records import EvalRecord, MetricsRow, eval_identity
from perencode.store.runs import Run

SEEDS = (111, 222, 333)


def fake_run(root: Path, name: str, *, task: str = "reverse", arch: str = "gru",
             encoding: str = "none", vocab: int = 32, seed: int = 111, hidden: int = 512,
             task_extra: dict | None = None, metrics: dict | None = None,
             stability: pd.DataFrame | None = None, curve: list[float] | None = None,
             finished: bool = True, recipe: Recipe | None = None) -> Path:
    """A run directory as `perencode train` leaves it: recipe.toml, metrics.jsonl, the
    final checkpoint (its name is what makes a run complete) and eval.json. `recipe`, when
    given (a grid's cell), replaces the one built from the keyword arguments."""
    if recipe is None:
        task_cfg = {"name": task, "vocab_size": vocab, "length": 16 if task in (
            "reverse_add", "predecessor") else 64, **(task_extra or {})}
        if task == "lm":
            task_cfg["data"] = "data/none"
        recipe = validate({"task": task_cfg, "model": {"arch": arch, "hidden_size": hidden},
                           "encoding": {"kind": encoding},
                           "train": {"iterations": 200, "seed": seed, "log_every": 100}}, name)
    run = Run(root / name)
    run.claim(recipe)
    run.checkpoint_dir.mkdir()
    for i, loss in enumerate(curve or [2.0, 1.0]):
        run.log(MetricsRow(step=100 * (i + 1), loss=loss, accuracy=0.5, lr=1e-3,
                           seconds=10.0 * (i + 1)))
    if finished:
        run.checkpoint_path(recipe.train.iterations).write_bytes(b"")
        run.write_eval(EvalRecord(**{**eval_identity(recipe), **(metrics or {})},
                                  iteration=recipe.train.iterations))
    if stability is not None:
        stability.to_csv(run.dir / "stability.csv", index=False)
    return run.dir


def by_band(good: float, bad: float) -> list[dict]:
    """Dual-frequency rows (types spelt as perencode.kinds.tasks.dual_frequency writes them): `bad`
    accuracy for frequent targets among rare disturbants at t = 1..16, `good` elsewhere."""
    rows = []
    for target in ("frequent", "rare"):
        for dist in ("frequent", "rare"):
            for first in (1, 17, 33, 49):
                acc = bad if (target, dist, first) == ("frequent", "rare", 1) else good
                rows.append({"target": target, "disturbants": dist, "band": f"{first}-"
                             f"{first + 15}", "first": first, "last": first + 15,
                             "accuracy": acc, "n": 256})
    return rows


def stability_rows(start: float, end: float) -> pd.DataFrame:
    """Two checkpoints, two triplets per condition; RARE disturbants go from start to end."""
    rows = []
    for iteration, rare in ((100, start), (200, end)):
        for target in ("frequent", "rare"):
            for dist in ("frequent", "rare"):
                for triplet in range(2):
                    for comparison in ("target", "suffix"):
                        rows.append({"iteration": iteration, "comparison": comparison,
                                     "target": target, "disturbants": dist,
                                     "triplet": triplet,
                                     "stability": rare if dist == "rare" else 0.95})
    return pd.DataFrame(rows)


def paper_like_runs(root: Path) -> Path:
    """A small stand-in for the paper's grids: Fig. 2 (GRU, two K), Fig. 3 and 5 (GRU
    dual frequency), Fig. 11/14 (variable length), Fig. 12/13, Fig. 15 / Table 1, Fig. 7, 8,
    10; one GRU Fig. 2 cell (K = 64, PE, seed 333) is missing."""
    for i, seed in enumerate(SEEDS):
        for vocab, pe_acc, van_acc in ((32, 0.99, 0.98), (64, 0.97, 0.60)):
            for enc, acc in (("sinusoidal", pe_acc), ("none", van_acc)):
                if (vocab, enc, seed) == (64, "sinusoidal", 333):
                    continue
                fake_run(root, f"fig2/{vocab}/{enc}/{seed}", encoding=enc, vocab=vocab,
                         seed=seed, metrics={"token_accuracy": acc + 0.001 * i,
                                             "dl_distance": (1 - acc) * 64})
        for enc, good, bad, st_end in (("sinusoidal", 0.99, 0.97, 0.9), ("none", 0.95, 0.3, 0.2)):
            fake_run(root, f"fig3/{enc}/{seed}", encoding=enc, vocab=64, seed=seed,
                     task="dual_frequency",
                     metrics={"token_accuracy": good, "by_band": by_band(good, bad)},
                     stability=stability_rows(0.8, st_end))
        for enc, good in (("sinusoidal", 0.9), ("none", 0.4), ("random", 0.6),
                          ("learnable", 0.5)):
            lengths = [{"length": n, "token_accuracy": good - (n - 32) / 200,
                        "n": 1024} for n in (32, 48, 64)]
            fake_run(root, f"varlen/{enc}/{seed}", arch="lstm", encoding=enc, vocab=16384,
                     seed=seed, task="variable_length", task_extra={"min_length": 32},
                     metrics={"token_accuracy": good, "by_length": lengths})
        for enc, acc in (("none", 0.5), ("sinusoidal", 0.9), ("random", 0.8),
                         ("learnable", 0.7), ("duplicate", 0.5)):
            fake_run(root, f"fig13/{enc}/{seed}", arch="lstm", encoding=enc, vocab=16384,
                     seed=seed, metrics={"token_accuracy": acc, "dl_distance": 10.0})
        for enc, ppl, curve in (("none", 37.5, [6.0, 4.0, 3.6]), ("sinusoidal", 38.5,
                                                                   [5.0, 3.9, 3.65])):
            fake_run(root, f"lm/{enc}/{seed}", task="lm", arch="lstm", encoding=enc,
                     vocab=32768, seed=seed, curve=curve,
                     metrics={"test_perplexity": ppl + i, "valid_perplexity": ppl + i + 0.5})
        for task, vocabs, metric in (("reverse_add", (896, 1088), "token_accuracy"),
                                     ("sort", (32, 256), "token_accuracy"),
                                     ("predecessor", (512, 1024), "accuracy")):
            for vocab in vocabs:
                for enc in ("none", "sinusoidal"):
                    fake_run(root, f"{task}/{vocab}/{enc}/{seed}", task=task,
                             arch="lstm", encoding=enc, vocab=vocab, seed=seed,
                             metrics={metric: 0.9 if enc == "sinusoidal" else 0.6,
                                      "dl_distance": 3.0})
    fake_run(root, "unfinished", seed=999, finished=False)
    return root
