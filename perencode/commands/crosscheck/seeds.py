"""Seeds: the run's seed decides its held-out set and its training batches, on both sides.
Ours as `perencode train` builds them (perencode.training.session.Session: its task and its
training stream); theirs as their scripts do (the seed their Learner sets
before the dataset draws its held-out set, their DataLoader's sampler seeded with it, and
their loop's reseeding at every iteration, in the main process).

Seeds 111, 222 and 111 again: the first two must give different held-out sets and different
training batches, the first and the third identical ones.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from perencode.commands.crosscheck.authors import Authors
from perencode.commands.crosscheck.report import AGREE, DISAGREE, Comparison
from perencode.commands.crosscheck.tasks import Z_TOL, Log, _z
from perencode.config.recipe import Recipe
from perencode.training import session

K, L, HELD_OUT, BATCH, STEPS = 16, 8, 32, 8, 3
SEEDS = (111, 222, 111)


def ours(seed: int) -> tuple[Tensor, list[Tensor]]:
    """(held-out rows, the first STEPS training batches' rows) of our run with `seed`."""
    recipe = Recipe.model_validate({
        "task": {"name": "reverse", "vocab_size": K, "length": L, "held_out": HELD_OUT},
        "model": {"arch": "gru", "hidden_size": 8, "embed_size": 8},
        "train": {"seed": seed, "batch_size": BATCH}})
    ours = session.Session(recipe, torch.device("cpu"))
    return ours.task.held_out, [ours.batch().sequences for _ in range(STEPS)]


def theirs(authors: Authors, seed: int) -> tuple[Tensor, list[Tensor]]:
    """The same from their train_palindrome.py's order of events."""
    dataset_module = authors.module("data.dataset")
    loader_module = authors.module("data.dataloader")
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # their Learner, before the model and the dataset
        dataset = dataset_module.RandomSequence(K, L, HELD_OUT, dummy_datasize=max(512, BATCH))
        loader = loader_module.get_data_loader(dataset, batch_size=BATCH, shuffle=True,
                                               num_iterations=STEPS, num_workers=0,
                                               random_seed=seed)
        rows = []
        for iteration, batch in enumerate(loader, start=1):
            rows.append(batch)
            torch.manual_seed(iteration + seed)  # their train loop, after each batch
        return dataset.held_out, rows


def _verdict(name: str, draws: list[tuple[Tensor, list[Tensor]]]) -> list[str]:
    (h1, b1), (h2, b2), (h3, b3) = draws
    wrong = []
    if torch.equal(h1, h2):
        wrong.append(f"{name}: seeds {SEEDS[0]} and {SEEDS[1]} give the same held-out set")
    if any(torch.equal(x, y) for x, y in zip(b1, b2)):
        wrong.append(f"{name}: seeds {SEEDS[0]} and {SEEDS[1]} give a same training batch")
    if not torch.equal(h1, h3):
        wrong.append(f"{name}: seed {SEEDS[0]} twice gives two held-out sets")
    if not all(torch.equal(x, y) for x, y in zip(b1, b3)):
        wrong.append(f"{name}: seed {SEEDS[0]} twice gives two training streams")
    return wrong


def check_seeds(authors: Authors) -> list[Comparison]:
    wrong = _verdict("ours", [ours(s) for s in SEEDS])
    wrong += _verdict("theirs", [theirs(authors, s) for s in SEEDS])
    check = Comparison(
        "seeds: held-out set and training stream", f"reverse K={K} L={L}: the held-out set "
        f"({HELD_OUT} rows) and the first {STEPS} training batches of seeds "
        f"{', '.join(map(str, SEEDS))}: different seeds differ, the same seed repeats, on "
        "both sides (ours: session.build, session.training_generator)",
        "data.dataset.RandomSequence, data.dataloader.get_data_loader, their per-iteration "
        "reseeding", {"fp32": 0.0, "fp64": 0.0},
        {"fp32": float(len(wrong)), "fp64": float(len(wrong))},
        unit="properties that fail", verdict=AGREE)
    if wrong:
        check.verdict, check.reason = DISAGREE, "; ".join(wrong)
    return [check]


# The stream check: the first STREAM batches of STREAM_BATCH rows, through Session.step.
STREAM, STREAM_BATCH, STREAM_SEED = 8, 32, 111


def our_stream(seed: int = STREAM_SEED) -> tuple[Tensor, list[Tensor]]:
    """(held-out rows, the rows of the batches the first STREAM iterations train on) of our
    run, each batch as Session.step draws it (`perencode train`'s iteration)."""
    recipe = Recipe.model_validate({
        "task": {"name": "reverse", "vocab_size": K, "length": L, "held_out": HELD_OUT},
        "model": {"arch": "gru", "hidden_size": 8, "embed_size": 8},
        "encoding": {"kind": "none"},
        "train": {"seed": seed, "batch_size": STREAM_BATCH, "iterations": STREAM}})
    run = session.Session(recipe, torch.device("cpu"))
    return run.task.held_out, [run.step().batch.sequences for _ in range(STREAM)]


def their_stream(authors: Authors, seed: int = STREAM_SEED) -> tuple[Tensor, list[Tensor]]:
    """The same from their own loop: train_palindrome.Learner.__call__ (their loader, their
    Learner.train with its reseeding before every iteration) with a recorder for a step.
    num_workers=0 draws their rows in the main process, where the reseeding reaches them
    (their runs used a worker process: other random numbers, the same distribution)."""
    dataset_module = authors.module("data.dataset")
    module = authors.script("train_palindrome.py")
    rows: list[Tensor] = []
    learner = module.Learner.__new__(module.Learner)
    learner.logger, learner.retrieval, learner.seed = Log(), False, seed
    learner.checkpoint = {"modules": {}}

    def record(batch, records, iteration):
        rows.append(batch.clone())
        return records

    learner.train_per_iteration = record
    learner.save_model = lambda iteration: None
    learner.test = lambda held_out: None
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        dataset = dataset_module.RandomSequence(K, L, HELD_OUT)
        learner(dataset, STREAM, STREAM_BATCH, saving_interval=STREAM + 1, num_workers=0)
    return dataset.held_out, rows


def _stream_facts(held: Tensor, batches: list[Tensor]) -> dict[str, float]:
    rows = torch.cat(batches)  # [STREAM * B, L]
    return {"batches": float(len(batches)),
            "distinct batches": float(len(torch.unique(torch.stack(batches), dim=0))),
            "rows drawn twice or more": float(len(rows) - len(torch.unique(rows, dim=0))),
            "held-out rows drawn": float((rows[:, None] == held[None]).all(-1).any(-1).sum())}


def check_stream(authors: Authors) -> list[Comparison]:
    """The first batches of a run's training stream against their loop's: as many, all
    distinct, no row drawn twice, none held out (K^L = 16^8: a repeat is a fault), and the
    same draws (token frequency at each position, two-sample z)."""
    ours_held, ours_b = our_stream()
    their_held, their_b = their_stream(authors)
    mine, other = _stream_facts(ours_held, ours_b), _stream_facts(their_held, their_b)
    wrong = [f"{key}: ours {mine[key]:g}, theirs {other[key]:g}" for key in mine
             if mine[key] != other[key]]
    if other["distinct batches"] != STREAM or other["rows drawn twice or more"]:
        wrong.append("their stream itself repeats (the check's premise fails)")

    def at_position(rows: Tensor) -> Tensor:
        return rows + K * torch.arange(L)

    z = _z(at_position(torch.cat(ours_b)), at_position(torch.cat(their_b)), K * L)
    check = Comparison(
        "training stream", f"the first {STREAM} batches of {STREAM_BATCH} rows (reverse "
        f"K={K} L={L}, seed {STREAM_SEED}) of Session.step against their loop: batches "
        f"{mine['batches']:g}/{other['batches']:g}, distinct {mine['distinct batches']:g}/"
        f"{other['distinct batches']:g}, rows drawn twice {mine['rows drawn twice or more']:g}/"
        f"{other['rows drawn twice or more']:g} (ours/theirs); token at each position: "
        f"largest two-sample z {z:.1f}", "train_palindrome.Learner.__call__ "
        "(data.dataloader.get_data_loader with num_workers=0, its rows drawn in the main "
        "process; utils.training_template.Learner.train)",
        Z_TOL, {"fp32": z + (math.inf if wrong else 0.0), "fp64": z + (math.inf if wrong else 0.0)},
        unit="largest two-sample z (inf: a count differs)", reason="; ".join(wrong))
    return [check.settle()]
