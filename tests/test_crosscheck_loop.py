"""`perencode crosscheck`'s training loop, initialisation, recipe and seed checks against the
authors' code, and faults planted on our side that each must turn to disagree."""

import pytest
import torch
from test_crosscheck import AUTHORS, needs_authors, needs_timm

from perencode import train
from perencode.crosscheck import authors as au
from perencode.crosscheck import loop
from perencode.crosscheck.report import AGREE, DISAGREE


@pytest.fixture(scope="module")
def authors():
    with au.authors_code(au.locate(AUTHORS)) as a:
        yield a


# -- the training loop ---------------------------------------------------------------------


@needs_authors
@needs_timm
def test_loop_agrees_and_clipping_fires(authors):
    checks = loop.check_loop(authors)
    assert [c.name for c in checks] == ["training loop: gru", "training loop: lstm"]
    for c in checks:
        assert c.verdict == AGREE, c.reason
        assert c.error["fp64"] < 1e-12 and c.error["fp32"] < 1e-5
        assert "clipping fired on" in c.compared and "clipping never fired" not in c.compared


def clip_step(clip):
    """train.train_step with its clipping replaced by `clip(parameters, clip_norm)`."""
    def step(model, optimizer, batch, clip_norm, count_hits=False):
        loss, hits = train.loss_fn(model, batch, count_hits)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip(model.parameters(), clip_norm)
        optimizer.step()
        return loss, hits
    return step


def lr_iteration(rate):
    """train.iteration with the lr of iteration k set by `rate(k, recipe, optimizer)`."""
    def iteration(model, optimizer, task, recipe, generator, k, count_hits=False):
        rate(k, recipe, optimizer)
        lr = optimizer.param_groups[0]["lr"]
        batch = task.sample(recipe.train.batch_size, generator)
        loss, hits = train.train_step(model, optimizer, batch, recipe.optim.clip_norm,
                                      count_hits)
        return lr, batch, loss, hits
    return iteration


def set_lr(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr


def one_step_early(k, recipe, optimizer):
    set_lr(optimizer, train.learning_rate(k, recipe.optim, recipe.train.iterations))


def per_log_interval(k, recipe, optimizer):
    if (k - 1) % recipe.train.log_every == 0:
        set_lr(optimizer, train.learning_rate(k - 1, recipe.optim, recipe.train.iterations))


PLANTED = {
    "clip by value": ("train_step", clip_step(torch.nn.utils.clip_grad_value_)),
    "max-norm clip (norm_type=inf)": ("train_step", clip_step(
        lambda p, c: torch.nn.utils.clip_grad_norm_(p, c, norm_type=float("inf")))),
    "lr of iteration k+1 applied at k": ("iteration", lr_iteration(one_step_early)),
    "schedule set once per log interval": ("iteration", lr_iteration(per_log_interval)),
}


@needs_authors
@needs_timm
@pytest.mark.parametrize("fault", PLANTED)
def test_planted_loop_fault_disagrees(authors, monkeypatch, fault):
    name, replacement = PLANTED[fault]
    monkeypatch.setattr(train, name, replacement)
    checks = loop.check_loop(authors)
    assert [c.verdict for c in checks] == [DISAGREE, DISAGREE], fault
    assert all(c.error["fp64"] > 1e-8 for c in checks)
