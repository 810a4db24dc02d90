"""The learning-rate schedule against timm's CosineLRScheduler, configured as the authors'
training scripts configure it (docs/paper-facts.md#learning-rate-schedule)."""

from __future__ import annotations

import torch

from perencode.commands.crosscheck.authors import TIMM_VERSION, Authors, timm_version
from perencode.commands.crosscheck.models import script_literals
from perencode.commands.crosscheck.report import numeric
from perencode.config.recipe import OptimConfig
from perencode.training.session import learning_rate


def steps_to_compare(iterations: int, warmup: int) -> list[int]:
    """Every step of the warm-up and its neighbourhood, the last steps, and 2,000 between."""
    dense = set(range(0, warmup + 101)) | set(range(max(0, iterations - 100), iterations))
    spread = {round(i * (iterations - 1) / 1999) for i in range(2000)}
    return sorted(dense | spread)


def check_schedule(authors: Authors) -> list:
    cls = authors.cosine_scheduler()
    script = authors.repo.code / "train_palindrome.py"
    optim = OptimConfig()
    checks = []
    for iterations in (300_000, 600_000):
        config = script_literals(script, "scheduler_config") | {
            "t_initial": iterations, "warmup_t": optim.warmup}
        param = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([param], lr=optim.lr)
        scheduler = cls(opt, **config)
        worst = 0.0
        for k in steps_to_compare(iterations, optim.warmup):
            # Their loop calls scheduler.step(k) after the k-th step: iteration k+1 runs at
            # the lr it sets; iteration 1 at the lr the constructor set.
            if k:
                scheduler.step(k)
            theirs = opt.param_groups[0]["lr"]
            worst = max(worst, abs(learning_rate(k, optim, iterations) - theirs) / optim.lr)
        version = timm_version()
        note = "" if version == TIMM_VERSION else f"timm {version}, theirs was {TIMM_VERSION}"
        checks.append(numeric(
            f"schedule: {iterations:,} iterations",
            f"lr of {len(steps_to_compare(iterations, optim.warmup)):,} iterations "
            f"(all of the warm-up of {optim.warmup}, the last 100), relative to the peak",
            f"timm CosineLRScheduler({', '.join(f'{k}={v}' for k, v in config.items())}) "
            "stepped as train_palindrome.py does", {"fp32": 1e-12, "fp64": 1e-12},
            {"fp32": worst, "fp64": worst}, reason=note))
    return checks
