"""Time the real training step, and a bare PyTorch loop of the same shapes for comparison.
A grid's cost from these timings is `perencode.commands.sweep.estimates` (`sweep --estimate`)."""

from __future__ import annotations

import functools
import resource
import sys

import torch
import torch.nn.functional as F
from torch import nn

from perencode.common import defaults
from perencode.common.device import free_running_seconds
from perencode.common.errors import UserError
from perencode.config import registry
from perencode.config.recipe import OptimConfig, Recipe
from perencode.kinds.encoding import PositionalEncoding
from perencode.kinds.models.rnn import CELLS
from perencode.kinds.tasks import make, shapes
from perencode.kinds.tasks.base import HeldOutConfig
from perencode.training.session import Session, make_optimizer, training_generator


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # Linux reports KiB


def _time(step, iterations: int, warmup: int, device: torch.device) -> float:
    return free_running_seconds(step, iterations, warmup, device)


# `bench --baseline` times the two loops in alternating blocks of this many steps, each
# free-running (one synchronisation at its end, as training runs): a host sync inside a
# step shows in its time, where a sync around every step would hide it.
BASELINE_BLOCK = 10


def bench(recipe: Recipe, device: torch.device, iterations: int = defaults.BENCH_ITERATIONS,
          warmup: int = defaults.BENCH_WARMUP, baseline: bool = False) -> dict:
    """Seconds per training iteration of `recipe` (batch sampling included)."""
    # The bare loop stands in for the recurrent models only (their PyTorch cells); another
    # model is refused in one line, not a KeyError.
    tasks = registry.having("task", "baseline")
    if baseline and (recipe.model.arch not in CELLS or recipe.task.name not in tasks):
        raise UserError(f"--baseline: the bare reference loop exists for "
                        f"{' and '.join(CELLS)} on the fixed-length {' and '.join(tasks)} "
                        "tasks only")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    session = Session(recipe, device)
    B = recipe.train.batch_size

    def step():
        session.step()

    if baseline:
        # Interleaved blocks of steps, so that a change in the machine's load (other jobs on
        # a shared CPU) weighs on both sides alike; both printed times come from these
        # blocks, so the printed ratio is the ratio of the printed times.
        bare_step = bare_loop(recipe, device)
        for _ in range(warmup):
            step()
            bare_step()
        ours = bare = 0.0
        for start in range(0, iterations, BASELINE_BLOCK):
            n = min(BASELINE_BLOCK, iterations - start)
            ours += n * _time(step, n, 0, device)
            bare += n * _time(bare_step, n, 0, device)
        seconds = ours / iterations
    else:
        seconds = _time(step, iterations, warmup, device)
    result = {
        "seconds_per_iteration": seconds,
        "sequences_per_second": B / seconds,
        "peak_memory_bytes": _peak_memory(device),
        "device": str(device),
        "arch": recipe.model.arch,
        "encoding": recipe.encoding.kind,
        "vocab_size": recipe.task.vocab_size,
        "length": recipe.task.length,
        "batch_size": B,
        "hidden_size": recipe.model.hidden_size,
        "threads": torch.get_num_threads(),
    }
    if baseline:
        result["bare_seconds_per_iteration"] = bare / iterations
        result["ratio_to_bare"] = ours / bare
    return result


# `bench --sampling` builds held-out sets of up to this many sequences (all but a batch).
SAMPLING_SPACE = 1 << 20


def sampling(recipe: Recipe, device: torch.device, iterations: int = defaults.BENCH_ITERATIONS,
             warmup: int = defaults.BENCH_WARMUP) -> list[dict]:
    """Seconds to draw one training batch of the recipe's task (held-out rows excluded)
    with held-out sets of growing density: one sequence (about 0), half, 99% and all but a
    batch of the task's distinct sequences; `ratio` is each to the first's, timed in turn
    on the same device."""
    cfg, B = recipe.task, recipe.train.batch_size
    if not isinstance(cfg, HeldOutConfig):
        raise UserError(f"--sampling: task.name = '{cfg.name}' has no task.held_out to vary")
    space = cfg.distinct_sequences()
    if space > SAMPLING_SPACE:
        raise UserError(f"--sampling: the task has {space} distinct sequences, more than "
                        f"the {SAMPLING_SPACE} a held-out set may hold here; set a smaller "
                        "task.vocab_size or task.length (e.g. --set task.vocab_size=2 --set "
                        "task.length=10)")
    cases = [("none", 1), ("50%", space // 2), ("99%", int(0.99 * space)),
             ("all but one batch", space - B)]
    rows: list[dict] = []
    for label, held_out in cases:
        if not 1 <= held_out < space or any(r["held_out"] == held_out for r in rows):
            continue
        task = make(type(cfg).model_validate(cfg.model_dump() | {"held_out": held_out}),
                    recipe.train.seed, device)
        seconds = _time(functools.partial(task.sample, B, training_generator(recipe, device)),
                        iterations, warmup, device)
        rows.append({"density": label, "held_out": held_out, "share": task.held_out_share,
                     "seconds_per_batch": seconds,
                     "ratio": seconds / rows[0]["seconds_per_batch"] if rows else 1.0})
    return rows


def bare_loop(recipe: Recipe, device: torch.device):
    """The reference: a hand-written step of the same shapes, PyTorch's own cell and loop
    around the package's encoding module.

    randint batch + command tokens -> embedding -> the recipe's encoding (its own module, so
    the cell reads the model's input width: 2E concatenated, E added or vanilla) ->
    nn.GRU/LSTM -> head on the output half -> CE -> backward -> clip -> Adam. Reverse-task
    shapes. The step returns its loss, unsynchronised.
    """
    K, L, B = recipe.task.vocab_size, recipe.task.length, recipe.train.batch_size
    E, H = recipe.model.embed_size, recipe.model.hidden_size
    sizes = shapes(recipe.task)  # K + 1 embedding rows (the command token), 2L steps
    torch.manual_seed(0)
    emb = nn.Embedding(sizes.num_embeddings, E).to(device)
    encode = PositionalEncoding(recipe.encoding, E, sizes.steps).to(device)
    rnn = CELLS[recipe.model.arch](encode.out_features, H, batch_first=True).to(device)
    head = nn.Linear(H, K).to(device)
    modules = nn.ModuleList([emb, encode, rnn, head])
    o = OptimConfig()  # the defaults (the authors' Adam), whatever the recipe's
    opt = make_optimizer(modules, o)
    command = torch.full((B, L), K, device=device)
    gen = torch.Generator(device=device).manual_seed(0)

    def step():
        x = torch.randint(0, K, (B, L), generator=gen, device=device)
        out, _ = rnn(encode(emb(torch.cat([x, command], 1))))  # [B, 2L, H]
        loss = F.cross_entropy(head(out[:, L:]).reshape(-1, K), x.flip(1).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(modules.parameters(), o.clip_norm)
        opt.step()
        return loss.detach()  # not synchronised, as Session.step's

    return step
