"""Training equivalence (`crosscheck --train`): S seeds of each implementation trained for M
iterations on the reverse task at one shape, final held-out token accuracies compared by an
equivalence test: two one-sided Welch t-tests (TOST) against a stated margin.

Three verdicts: equivalent (the 90% confidence interval of the difference of means lies
within +-margin: TOST p < ALPHA), different (Welch's two-sided test rejects equal means at
ALPHA and equivalence is not shown), undecided with the seeds given (neither; the check
says how many seeds per side the equivalence test needs for POWER at the spread seen).

Ours: a perencode.training.session.Session (task, model, optimizer, schedule, step). Theirs: their
`model.RNN` initialised by their code from the seed, their `data.dataset.RandomSequence`
(held-out set and rejection sampling, one `__getitem__` per row as their DataLoader's
workers did, drawn here in the main process), their `train_palindrome.Learner`'s
`train_per_iteration` (loss, clipping, Adam, timm's scheduler) with the per-iteration
reseeding of their `train` loop, and their `Learner.test` for the accuracy.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from perencode.analysis.stats import t_quantile, t_sf
from perencode.commands.crosscheck.authors import Authors
from perencode.commands.crosscheck.models import script_literals
from perencode.commands.crosscheck.report import AGREE, DISAGREE, UNDECIDED, Comparison
from perencode.commands.crosscheck.tasks import Log
from perencode.common.console import console
from perencode.common.progress import Reporter
from perencode.config.recipe import OptimConfig, Recipe
from perencode.training.session import Session

ALPHA = 0.05  # both one-sided tests of TOST, and Welch's test for "different"
POWER = 0.8  # the power the seeds needed are computed for (true difference 0)


@dataclass(frozen=True)
class Shape:
    """What the two implementations train: a PE GRU on the reverse task."""

    name: str
    vocab_size: int
    length: int
    embed: int
    batch: int
    iterations: int
    warmup: int
    held_out: int
    margin: float  # equivalence margin: |difference of mean token accuracies|

    def describe(self) -> str:
        return (f"reverse, GRU + sinusoidal PE, K={self.vocab_size}, L={self.length}, "
                f"E=H={self.embed}, batch {self.batch}, {self.iterations:,} iterations "
                f"(warm-up {self.warmup}), {self.held_out} held out")


SHAPES = {
    # About a minute on a laptop core; accuracies end mid-way (about 0.4 against chance
    # 0.125), where a difference between the implementations would show most.
    # The margin: 0.05 token accuracy, a tenth of the gap between PE and vanilla that the
    # paper's claims rest on, and about 3 seed standard deviations at this shape.
    "cpu": Shape("cpu", vocab_size=8, length=8, embed=32, batch=32, iterations=1000,
                 warmup=50, held_out=256, margin=0.05),
    # The paper's sizes (Fig. 2 GRU at K = 256); the iterations are the user's choice.
    "paper": Shape("paper", vocab_size=256, length=64, embed=512, batch=512, iterations=2000,
                   warmup=1000, held_out=1024, margin=0.05),
}


def welch(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Welch's two-sample t-test: (t, degrees of freedom, two-sided p)."""
    na, nb = len(a), len(b)
    ma, mb = sum(a) / na, sum(b) / nb
    va = sum((x - ma) ** 2 for x in a) / (na - 1)
    vb = sum((x - mb) ** 2 for x in b) / (nb - 1)
    se2 = va / na + vb / nb
    if se2 == 0.0:  # both constant: equal means cannot differ, unequal ones surely do
        return (0.0, math.inf, 1.0) if ma == mb else (math.inf, math.inf, 0.0)
    t = (ma - mb) / math.sqrt(se2)
    df = se2 ** 2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    return t, df, 2.0 * float(t_sf(abs(t), df))


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function (perencode.analysis.stats computes the tail)."""
    return 1.0 - float(t_sf(t, df))


@dataclass(frozen=True)
class Equivalence:
    verdict: str  # "equivalent", "different" or "undecided"
    difference: float  # mean(a) - mean(b)
    low: float  # the (1 - 2 ALPHA) confidence interval of the difference
    high: float
    p_tost: float  # the larger of the two one-sided p-values
    p_welch: float  # Welch's two-sided p-value
    df: float
    seeds_needed: int  # per side, for POWER at the pooled spread seen


def seeds_needed(sd: float, margin: float, alpha: float = ALPHA, power: float = POWER) -> int:
    """Seeds per side for TOST to show equivalence with `power` when the true difference is
    0 and both sides spread by `sd` (equal sizes, df = 2n - 2)."""
    if sd == 0.0:
        return 2
    for n in range(2, 100_000):
        df = 2 * n - 2
        need = (t_quantile(1 - alpha, df) + t_quantile(1 - (1 - power) / 2, df)) ** 2
        if n >= 2 * need * sd ** 2 / margin ** 2:
            return n
    return 100_000


def tost(a: list[float], b: list[float], margin: float, alpha: float = ALPHA) -> Equivalence:
    """Two one-sided Welch t-tests of |mean(a) - mean(b)| < margin, and Welch's test."""
    na, nb = len(a), len(b)
    ma, mb = sum(a) / na, sum(b) / nb
    va = sum((x - ma) ** 2 for x in a) / (na - 1)
    vb = sum((x - mb) ** 2 for x in b) / (nb - 1)
    d, se = ma - mb, math.sqrt(va / na + vb / nb)
    _, df, p_welch = welch(a, b)
    needed = seeds_needed(math.sqrt((va + vb) / 2), margin, alpha)
    if se == 0.0:
        inside = abs(d) < margin
        return Equivalence("equivalent" if inside else "different", d, d, d,
                           0.0 if inside else 1.0, p_welch, df, needed)
    p_low = 1.0 - t_cdf((d + margin) / se, df)  # H0: d <= -margin
    p_high = t_cdf((d - margin) / se, df)  # H0: d >= margin
    p_tost = max(p_low, p_high)
    half = t_quantile(1 - alpha, df) * se
    verdict = ("equivalent" if p_tost < alpha else "different" if p_welch < alpha
               else "undecided")
    return Equivalence(verdict, d, d - half, d + half, p_tost, p_welch, df, needed)


def _ours(shape: Shape, seed: int, device: torch.device):
    """Returns (one_step(k), accuracy())."""
    recipe = Recipe.model_validate({
        "task": {"name": "reverse", "vocab_size": shape.vocab_size, "length": shape.length,
                 "held_out": shape.held_out},
        "model": {"arch": "gru", "hidden_size": shape.embed, "embed_size": shape.embed},
        "encoding": {"kind": "sinusoidal"}, "optim": {"warmup": shape.warmup},
        "train": {"iterations": shape.iterations, "batch_size": shape.batch, "seed": seed,
                  "eval_batch_size": 1024}})
    session = Session(recipe, device)
    # Batches from a stream of this check's own (seed + 1), as when it was first written.
    gen = torch.Generator(device=device).manual_seed(seed + 1)

    def step(k: int) -> None:
        session.step(session.task.sample(shape.batch, gen))

    def accuracy() -> float:
        return session.evaluate()["token_accuracy"]

    return step, accuracy


def _theirs(authors: Authors, shape: Shape, seed: int, device: torch.device):
    module = authors.script("train_palindrome.py")
    dataset_module = authors.module("data.dataset")
    rnn = authors.module("model.rnn")
    script = authors.repo.code / "train_palindrome.py"
    torch.manual_seed(seed)  # their Learner seeds before building the model
    model = rnn.RNN(shape.vocab_size, shape.embed, "GRU", embed_size=shape.embed,
                    time_encoding="concat", time_encoding_form="sinusoidal",
                    max_length=2 * shape.length, learnable_padding_token=True).to(device)
    learner = module.Learner.__new__(module.Learner)
    learner.rnn, learner.device, learner.logger, learner.seed = model, device, Log(), seed
    learner.checkpoint = {"modules": {"rnn": {"init_args": {"vocab_size": shape.vocab_size}}}}
    learner.optimizer = torch.optim.Adam(learner.get_parameters(), **(
        script_literals(script, "optim_config") | {"lr": OptimConfig().lr}))
    learner.scheduler = authors.cosine_scheduler()(learner.optimizer, **(
        script_literals(script, "scheduler_config")
        | {"t_initial": shape.iterations, "warmup_t": shape.warmup}))
    dataset = dataset_module.RandomSequence(shape.vocab_size, shape.length, shape.held_out)

    def step(k: int) -> None:
        model.train()
        rows = torch.stack([dataset[i] for i in range(shape.batch)])
        torch.manual_seed(k + seed)  # their train loop reseeds every iteration
        learner.train_per_iteration(rows, {}, k)

    def accuracy() -> float:
        model.eval()
        learner.logger = Log()
        with torch.no_grad():
            learner.test(dataset.held_out)
        return learner.logger.number(r"Test accuracy \(token\)")

    return step, accuracy


def check_training(authors: Authors, shape: Shape, seeds: int, device: torch.device,
                   progress: bool = True, margin: float | None = None) -> list[Comparison]:
    margin = shape.margin if margin is None else margin
    sides = {"ours": lambda s: _ours(shape, s, device),
             "theirs": lambda s: _theirs(authors, shape, s, device)}
    console.print(f"crosscheck --train: {seeds} seeds x 2 implementations x "
                  f"{shape.iterations:,} iterations ({shape.describe()}) on {device}; "
                  f"equivalence margin {margin} (token accuracy); the time is measured on "
                  "the first seed", highlight=False)
    accuracies: dict[str, list[float]] = {"ours": [], "theirs": []}
    started = time.perf_counter()
    with Reporter("crosscheck --train", 2 * seeds * shape.iterations, log_every=
                  max(1, shape.iterations // 4), enabled=progress) as reporter:
        for i, seed in enumerate(range(111, 111 * (seeds + 1), 111)):  # 111, 222, ...
            for name, build in sides.items():
                step, accuracy = build(seed)
                for k in range(1, shape.iterations + 1):
                    step(k)
                    reporter.advance(1)
                accuracies[name].append(accuracy())
            if i == 0 and seeds > 1:
                took = time.perf_counter() - started
                console.print(f"crosscheck --train: seed 111 took {took:.0f} s (both sides, "
                              f"evaluation included): about {took * (seeds - 1) / 60:.1f} min "
                              f"more for the other {seeds - 1}", highlight=False)
    wall = time.perf_counter() - started
    result = tost(accuracies["ours"], accuracies["theirs"], margin)
    listed = "; ".join(f"{k} " + ", ".join(f"{a:.4f}" for a in v) for k, v in accuracies.items())
    check = Comparison(
        f"training: {shape.name}", f"held-out token accuracy after training ({shape.describe()}"
        f", seeds 111..{111 * seeds}, {wall / 60:.1f} min): {listed}",
        "train_palindrome.Learner.train_per_iteration and .test, data.dataset.RandomSequence,"
        " model.rnn.RNN", error={"fp32": abs(result.difference), "fp64": abs(result.difference)},
        tolerance={"fp32": margin, "fp64": margin},
        unit="|difference of mean accuracies|",
        reason=f"{result.verdict}: TOST with margin {margin}: difference "
        f"{result.difference:+.4f}, {100 * (1 - 2 * ALPHA):.0f}% CI [{result.low:+.4f}, "
        f"{result.high:+.4f}], p = {result.p_tost:.3g} (equivalent: p < {ALPHA}); Welch "
        f"p = {result.p_welch:.3g}, df = {result.df:.3g}; {result.seeds_needed} seeds per side "
        f"give {POWER:.0%} power at the spread seen (--seeds, --margin)")
    check.verdict = {"equivalent": AGREE, "different": DISAGREE}.get(result.verdict, UNDECIDED)
    return [check]
