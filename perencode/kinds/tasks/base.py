"""What every task shares: the batch layout, held-out exclusion by hashing, scoring.

A task draws raw rows (`draw`), identifies a row by its key (`key`, the raw row by
default) and turns rows into model inputs and targets (`build`). Everything runs on the
task's device, vectorised: no per-sample Python loop, no DataLoader.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from pydantic import Field, model_validator
from torch import Tensor

from perencode.common.errors import UserError
from perencode.config.recipe import TaskConfig
from perencode.kinds.scoring import sequence_scores
from perencode.kinds.shapes import Shapes

# Odd 64-bit multiplier of the polynomial hash (wrapping int64 arithmetic).
_HASH_BASE = 0x100000001B3
# Above this chance that a random row is held out, a training batch is drawn from the list
# of the rows left (SyntheticTask.sample), and training is warned that it sees a small part
# of the task.
DENSE_SHARE = 0.25
# A task of more rows than this is never listed (its held-out set would hold millions).
LISTED_ROWS = 1 << 22


class HeldOutConfig(TaskConfig):
    """[task] of a task that draws `held_out` distinct test rows before training: reverse,
    sort, reverse_add, predecessor and variable_length (whose rows are per length)."""

    held_out: int = Field(
        1024, ge=1,
        description="Distinct held-out test sequences drawn before training and never "
        "trained on (per length for variable_length).",
    )

    def distinct_sequences(self) -> int:
        """K^L: the distinct rows of L free tokens (a task whose rows differ says so)."""
        return self.vocab_size ** self.length

    def check(self) -> None:
        """The task's own rules, checked before its held-out count: raise
        ValueError("field 'x': why") on a mistake."""

    @model_validator(mode="after")
    def _consistent(self) -> HeldOutConfig:
        """The task's rules, then: the held-out rows must leave some to train on."""
        self.check()
        distinct = self.distinct_sequences()
        if self.held_out >= distinct:
            raise ValueError(
                f"field 'held_out': {self.held_out} held-out sequences leave nothing to "
                f"train on: only {distinct} distinct sequences exist (must be < {distinct})")
        return self


@dataclass
class Batch:
    """One batch. The model reads `inputs`; the loss reads `output_targets` at the outputs.

    sequences: the random tokens drawn (reverse: [B, L]; reverse_add: [B, 2L] = x then y;
        variable length: [B, longest l], -1 beyond each length).
    inputs: [B, T] token ids (id K is the command token where the task has one).
    targets: the task's targets in its natural shape (reverse: [B, L]; predecessor: [B]).
    output_targets: [B, T_out] the targets aligned with the output steps.
    output_steps: [B, T_out] the time step of each output; None = the last T_out steps.
    output_mask: [B, T_out] True where an output counts; None = all count.
    lengths: [B] input length of each row (variable length only).
    queries: [B] 0-based index of the queried element (predecessor query only).
    """

    sequences: Tensor
    inputs: Tensor
    targets: Tensor
    output_targets: Tensor
    output_steps: Tensor | None = None
    output_mask: Tensor | None = None
    lengths: Tensor | None = None
    queries: Tensor | None = None

    def __len__(self) -> int:
        return self.inputs.shape[0]


@functools.lru_cache(maxsize=32)
def _hash_powers(m: int, device: torch.device) -> Tensor:
    """BASE^(m-1-j) mod 2^64 as int64, j = 0..m-1 (the Horner form's weights)."""
    mask = (1 << 64) - 1
    values = [pow(_HASH_BASE, m - 1 - j, 1 << 64) & mask for j in range(m)]
    return torch.tensor([v - (1 << 64) if v >= 1 << 63 else v for v in values],
                        dtype=torch.long, device=device)


def sequence_hash(keys: Tensor) -> Tensor:
    """Polynomial hash of each row of an integer tensor [N, M] -> int64 [N] (mod 2^64).

    One multiply and one sum (int64 arithmetic wraps), so it is two kernels on a GPU.
    """
    return (keys.long() * _hash_powers(keys.shape[1], keys.device)).sum(1)


class Exclusion:
    """Membership test of rows in a fixed set: hash lookup, then an exact check on hits."""

    def __init__(self, keys: Tensor):
        self.sorted_hashes, order = torch.sort(sequence_hash(keys))  # [N]
        self.keys = keys[order]  # [N, M], in the order of their hashes

    def members(self, keys: Tensor) -> Tensor:
        """keys [B, M] -> the indices [n] of the rows that are in the set.

        One host-device sync (`nonzero`) when no hash hits, the usual case in training.
        """
        if self.keys.shape[0] == 0:
            return torch.zeros(0, dtype=torch.long, device=keys.device)
        h = sequence_hash(keys)
        idx = torch.searchsorted(self.sorted_hashes, h).clamp_max(len(self.sorted_hashes) - 1)
        rows = (self.sorted_hashes[idx] == h).nonzero().squeeze(1)
        if len(rows) == 0:
            return rows
        # Exact check of a hash hit against the set's row of that hash: one comparison a
        # row, whatever share of the draws the set holds.
        found = (keys[rows] == self.keys[idx[rows]]).all(1)
        unsure = (~found).nonzero().squeeze(1)
        # A hit on another row of the same hash (a collision, 2^-64 a pair) is checked
        # against the whole set, a chunk at a time.
        for start in range(0, self.keys.shape[0] if len(unsure) else 0, 4096):
            chunk = self.keys[start:start + 4096]
            found[unsure] |= (keys[rows[unsure]][:, None, :] == chunk[None]).all(-1).any(-1)
        return rows[found]

    def contains(self, keys: Tensor) -> Tensor:
        """keys [B, M] -> bool [B]: True where the row is in the set."""
        out = torch.zeros(keys.shape[0], dtype=torch.bool, device=keys.device)
        out[self.members(keys)] = True
        return out


def all_rows(K: int, width: int) -> Tensor:
    """Every row of `width` tokens in [0, K) [K^width, width], in counting order."""
    place = K ** torch.arange(width - 1, -1, -1)  # [width]
    return torch.arange(K ** width)[:, None] // place % K


def duplicated(rows: Tensor) -> Tensor:
    """bool [N]: True where a row of `rows` [N, M] repeats an earlier row."""
    index = torch.arange(len(rows), device=rows.device)
    keys = _packed(rows)
    _, inverse = (torch.unique(keys, return_inverse=True) if keys.dim() == 1
                  else torch.unique(keys, dim=0, return_inverse=True))
    first = torch.full((int(inverse.max()) + 1,), len(rows), dtype=torch.long,
                       device=rows.device)
    first.scatter_reduce_(0, inverse, index, reduce="amin")
    return first[inverse] != index


def _packed(rows: Tensor) -> Tensor:
    """Integer `rows` [N, M] as one int64 each [N] (its digits in base `span`, the values'
    range), equal exactly where the rows are, when that number fits; else `rows`. Finding
    equal numbers sorts one column: on a dense held-out set, redrawn a row at a time, that
    is hundreds of times faster than torch.unique over rows (dim=0)."""
    if rows.is_floating_point() or rows.dim() != 2 or 0 in rows.shape:
        return rows
    low = int(rows.min())
    span = int(rows.max()) - low + 1
    width = rows.shape[1]
    if span ** width >= 1 << 63:
        return rows
    weights = torch.tensor([span ** (width - 1 - j) for j in range(width)], dtype=torch.long,
                           device=rows.device)
    return ((rows.long() - low) * weights).sum(1)


def redraw_duplicates(rows: Tensor, redraw: Callable[[Tensor], Tensor]) -> Tensor:
    """Make the rows distinct: each repeat of an earlier row is replaced by `redraw(idx)`.

    `redraw` gets the indices of the repeats, so a row keeps what its index stands for
    (a length, a test-set cell); rows are never reordered.
    """
    while True:
        idx = duplicated(rows).nonzero().squeeze(1)
        if len(idx) == 0:
            return rows
        rows[idx] = redraw(idx)


class SyntheticTask:
    """Base of the synthetic tasks: held-out drawn from the seed, excluded from training."""

    has_command_token = True

    def __init__(self, cfg, seed: int, device: torch.device | str = "cpu"):
        self.cfg = cfg
        self.K = cfg.vocab_size
        self.L = cfg.length
        self.device = torch.device(device)
        self.command = self.K
        gen = torch.Generator().manual_seed(seed)
        self.held_out = self.make_held_out(gen).to(self.device)
        self._exclusion = Exclusion(self.key(self.held_out))

    # -- what a task defines ------------------------------------------------------------
    @property
    def steps(self) -> int:
        """Longest model input T (sizes the learnable/random encodings)."""
        return 2 * self.L

    @property
    def outputs(self) -> int:
        """Most scored outputs of a sequence (the head runs on these only)."""
        return self.L

    def draw(self, n: int, generator: torch.Generator) -> Tensor:
        raise NotImplementedError

    def key(self, rows: Tensor) -> Tensor:
        return rows

    def build(self, rows: Tensor) -> Batch:
        raise NotImplementedError

    # -- shared machinery ---------------------------------------------------------------
    @property
    def shapes(self) -> Shapes:
        """What it feeds a model: K tokens (and the command token where it has one), K
        classes, no padding row."""
        return Shapes(num_embeddings=self.K + int(self.has_command_token), num_classes=self.K,
                      steps=self.steps, outputs=self.outputs,
                      held_out_rows=len(self.held_out))

    def make_held_out(self, generator: torch.Generator) -> Tensor:
        """`held_out` distinct rows drawn on the CPU from the seed (device independent)."""
        rows = self.draw(self.cfg.held_out, generator)
        return redraw_duplicates(rows, lambda idx: self.draw(len(idx), generator))

    def space(self) -> int | None:
        """How many distinct rows `draw` can return (each with a chance above zero); None
        where the task's config does not count them."""
        return self.cfg.distinct_sequences() if isinstance(self.cfg, HeldOutConfig) else None

    def every_row(self) -> Tensor | None:
        """Every row `draw` can return [space, W] on the CPU, in any fixed order; None where
        the task cannot list them (then a dense held-out set is redrawn row by row)."""
        return None

    def chance(self, rows: Tensor) -> Tensor:
        """float64 [N]: the chance that one `draw` returns each row (uniform by default)."""
        space = self.space()
        return torch.full((len(rows),), 1.0 / space if space else 0.0, dtype=torch.float64)

    @functools.cached_property
    def held_out_share(self) -> float:
        """The chance that a row `draw` returns is a held-out row (0 where not counted)."""
        return float(self.chance(self.held_out.cpu()).sum())

    def held_out_warning(self, batch_size: int) -> str | None:
        """One line for a held-out set that leaves little to train on, else None."""
        space = self.space()
        if space is None:
            return None
        left = space - len(self.held_out)
        if left < batch_size:
            return (f"only {left} distinct sequence{'s' * (left != 1)} of the task's {space} "
                    f"{'are' if left != 1 else 'is'} not held out, fewer than a batch "
                    f"({batch_size}): every batch repeats them")
        if self.held_out_share > DENSE_SHARE:
            return (f"{self.held_out_share:.0%} of random sequences are held out "
                    f"({len(self.held_out)} of {space}): training sees the other {left}, "
                    "drawn from their list (not as a sparse held-out set draws them)")
        return None

    @functools.cached_property
    def _rows_left(self) -> tuple[Tensor, Tensor] | None:
        """(the rows that are not held out [n, W], their cumulative chances [n]) where
        most random rows are held out (held_out_share > DENSE_SHARE, a rule of the recipe,
        so a resumed run draws as the uninterrupted one) and the task lists its rows."""
        space = self.space()
        if self.held_out_share <= DENSE_SHARE or space is None or space > LISTED_ROWS:
            return None
        rows = self.every_row()
        if rows is None:
            return None
        rows = rows.to(self.device)
        left = rows[~self._exclusion.contains(self.key(rows))]  # [n, W]
        return left, torch.cumsum(self.chance(left.cpu()), 0).to(self.device)  # [n]

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """A training batch on the generator's device; held-out rows are redrawn.

        Where most random rows are held out, redrawing them would take thousands of
        rounds a batch: the batch is drawn from the list of the rows left instead, each
        with its chance under `draw` (the same distribution, other random numbers), at
        the cost of one uniform number a row whatever the held-out share.
        """
        if self._rows_left is not None:
            left, cumulative = (t.to(generator.device) for t in self._rows_left)
            u = torch.rand(batch_size, generator=generator, device=generator.device,
                           dtype=torch.float64) * cumulative[-1]  # [B]
            pick = torch.searchsorted(cumulative, u, right=True).clamp_max(len(left) - 1)
            return self.build(left[pick])
        rows = self.draw(batch_size, generator)
        idx = self._exclusion.members(self.key(rows))
        while len(idx):
            fresh = self.draw(len(idx), generator)
            rows[idx] = fresh
            idx = idx[self._exclusion.members(self.key(fresh))]
        return self.build(rows)

    def held_out_batches(self, batch_size: int) -> Iterator[Batch]:
        for start in range(0, self.held_out.shape[0], batch_size):
            yield self.build(self.held_out[start:start + batch_size])

    def evaluate(self, logits_fn: Callable[[Batch], Tensor], batch_size: int,
                 **options) -> dict:
        """Score the held-out set; `logits_fn(batch)` gives logits at the outputs [B, T_out, K]."""
        if options:
            raise UserError(f"{', '.join(options)}: not an option of the {self.cfg.name} task "
                            f"(only language models have one)")
        batches, predictions = [], []
        for batch in self.held_out_batches(batch_size):
            batches.append(batch)
            predictions.append(logits_fn(batch).argmax(-1))
        return self.score(batches, predictions)

    def score(self, batches: list[Batch], predictions: list[Tensor]) -> dict:
        """eval.json metrics from held-out batches and argmax predictions [B, T_out]."""
        return sequence_scores(batches, predictions)
