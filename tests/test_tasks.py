"""Task generators (docs/paper-facts.md#tasks): known answers for inputs and targets, the held-out
structures, exclusion of held-out rows from training, scoring, and recipe validation."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from perencode.common.errors import UserError
from perencode.config.recipe import TaskConfig, validate
from perencode.kinds.tasks import TASKS, make
from perencode.kinds.tasks.base import Exclusion, duplicated, redraw_duplicates, sequence_hash
from perencode.kinds.tasks.dual_frequency import DualFrequencyTask, structured_cells
from perencode.kinds.tasks.predecessor import PredecessorTask
from perencode.kinds.tasks.reverse import ReverseTask, VariableLengthReverseTask
from perencode.kinds.tasks.reverse_add import ReverseAddTask
from perencode.kinds.tasks.sort import SortTask
from perencode.training.session import output_logits


def task(seed: int = 0, **cfg):
    return make(TaskConfig.of(**cfg), seed)


def gen(seed: int = 1) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def perfect(batch):
    """Logits that predict every output target (masked outputs predict class 0)."""
    target = batch.output_targets.clamp(min=0)
    return nn.functional.one_hot(target, 64).float()


# -- dispatch ---------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg, cls", [
    (dict(name="reverse", held_out=4), ReverseTask),
    (dict(name="variable_length", min_length=4, length=8, held_out=4),
     VariableLengthReverseTask),
    (dict(name="dual_frequency", vocab_size=8, length=8, held_out_per_cell=1),
     DualFrequencyTask),
    (dict(name="sort", held_out=4), SortTask),
    (dict(name="reverse_add", length=4, held_out=4), ReverseAddTask),
    (dict(name="predecessor", length=4, held_out=4), PredecessorTask),
])
def test_make_dispatches(cfg, cls):
    assert type(task(**{"vocab_size": 16} | cfg)) is cls


# -- known answers ----------------------------------------------------------------------------
def test_reverse_known_answer():
    t = task(name="reverse", vocab_size=5, length=3, held_out=2)
    b = t.build(torch.tensor([[1, 2, 3]]))
    assert b.inputs.tolist() == [[1, 2, 3, 5, 5, 5]]
    assert b.output_targets.tolist() == [[3, 2, 1]]
    assert (t.shapes.num_embeddings, t.shapes.num_classes, t.shapes.steps) == (6, 5, 6)
    assert b.output_steps is None and b.output_mask is None and t.shapes.pad_id is None


def test_sort_known_answer_keeps_ties():
    t = task(name="sort", vocab_size=5, length=5, held_out=2)
    b = t.build(torch.tensor([[3, 1, 3, 0, 4]]))
    assert b.inputs.tolist() == [[3, 1, 3, 0, 4, 5, 5, 5, 5, 5]]
    assert b.targets.tolist() == [[0, 1, 3, 3, 4]]
    assert b.output_targets.tolist() == b.targets.tolist()
    assert t.shapes.num_embeddings == 6


def test_reverse_add_known_answer():
    t = task(name="reverse_add", vocab_size=10, length=3, held_out=2)
    b = t.build(torch.tensor([[1, 2, 3, 4, 5, 9]]))  # x = 1 2 3, y = 4 5 9
    assert b.inputs.tolist() == [[1, 2, 3, 4, 5, 9]]  # y is the output phase: no command
    assert b.targets.tolist() == [[(3 + 4) % 10, (2 + 5) % 10, (1 + 9) % 10]]
    assert (t.shapes.num_embeddings, t.shapes.num_classes, t.shapes.steps) == (10, 10, 6)
    assert t.held_out.shape == (2, 6) and t.draw(3, gen()).shape == (3, 6)


def test_predecessor_known_answer():
    t = task(name="predecessor", vocab_size=10, length=4, held_out=2)
    b = t.build(torch.tensor([[5, 2, 7, 1, 2], [5, 2, 7, 1, 3]]))  # queries x_3, x_4 (1-based)
    assert b.sequences.tolist() == [[5, 2, 7, 1], [5, 2, 7, 1]]
    assert b.inputs.tolist() == [[5, 2, 7, 1, 7], [5, 2, 7, 1, 1]]
    assert b.queries.tolist() == [2, 3]
    assert b.targets.tolist() == [2, 7]
    assert b.output_targets.tolist() == [[2], [7]]
    assert (t.shapes.num_embeddings, t.shapes.num_classes, t.shapes.steps) == (10, 10, 5)


def test_predecessor_draws_distinct_tokens_and_valid_queries():
    t = task(name="predecessor", vocab_size=16384, length=16, held_out=8)
    rows = t.draw(64, gen())
    x, q = rows[:, :16], rows[:, 16]
    assert rows.shape == (64, 17)
    assert ((x >= 0) & (x < 16384)).all()
    assert all(len(set(r)) == 16 for r in x.tolist())
    assert ((q >= 1) & (q <= 15)).all()


def test_predecessor_orders_and_queries_are_uniform():
    # K = L = 3: the 6 permutations and the 2 query positions are equally likely.
    t = task(name="predecessor", vocab_size=3, length=3, held_out=1)
    rows = t.draw(60_000, gen())
    perm = rows[:, 0] * 9 + rows[:, 1] * 3 + rows[:, 2]
    counts = torch.bincount(perm, minlength=27)
    counts = counts[counts > 0].double()
    assert len(counts) == 6
    assert (counts - 10_000).abs().max() < 4 * math.sqrt(10_000)
    assert abs(float((rows[:, 3] == 1).double().mean()) - 0.5) < 4 * math.sqrt(0.25 / 60_000)


def test_variable_length_known_answer():
    t = task(name="variable_length", vocab_size=6, length=4, min_length=2, held_out=2)
    b = t.build(torch.tensor([[1, 2, -1, -1], [3, 4, 5, -1]]))  # lengths 2, 3: padded to 6
    assert b.lengths.tolist() == [2, 3]
    assert b.sequences.tolist() == [[1, 2, -1], [3, 4, 5]]
    assert b.inputs.tolist() == [[1, 2, 6, 6, 6, 6], [3, 4, 5, 6, 6, 6]]
    assert b.output_targets.tolist() == [[2, 1, -1], [5, 4, 3]]
    assert b.output_steps.tolist() == [[2, 3, 4], [3, 4, 5]]
    assert b.output_mask.tolist() == [[True, True, False], [True, True, True]]
    assert (t.shapes.num_embeddings, t.shapes.steps) == (7, 8)


class StepModel(nn.Module):
    """Features = the time step, head = identity: logits reveal which steps were read."""

    def __init__(self):
        super().__init__()
        self.head = nn.Identity()

    def forward(self, tokens):
        B, T = tokens.shape
        return torch.arange(T, dtype=torch.float)[None, :, None].expand(B, T, 1)


def test_variable_length_outputs_are_read_at_each_rows_own_steps():
    t = task(name="variable_length", vocab_size=6, length=4, min_length=1, held_out=1)
    b = t.build(torch.tensor([[1, -1, -1, -1], [3, 4, 5, 0]]))
    steps = output_logits(StepModel(), b)[..., 0]  # type: ignore[arg-type]  # duck-typed
    assert steps[b.output_mask].tolist() == [1, 4, 5, 6, 7]


def test_variable_length_draws_and_held_out_per_length():
    t = task(name="variable_length", vocab_size=4, length=6, min_length=3, held_out=5)
    rows = t.draw(2000, gen())
    lengths = (rows >= 0).sum(1)
    # -1 exactly beyond each length, every length drawn
    assert ((rows >= 0) == (torch.arange(6) < lengths[:, None])).all()
    assert set(lengths.tolist()) == {3, 4, 5, 6}
    held = t.held_out
    held_lengths = (held >= 0).sum(1)
    assert held.shape == (4 * 5, 6)
    assert held_lengths.tolist() == sorted([3, 4, 5, 6] * 5)
    assert not duplicated(held).any()


def test_variable_length_scores_by_length():
    t = task(name="variable_length", vocab_size=6, length=4, min_length=2, held_out=3)
    result = t.evaluate(perfect, batch_size=4)  # batches mix lengths
    assert result["token_accuracy"] == 1.0 and result["sequence_accuracy"] == 1.0
    assert result["n_sequences"] == 9 and result["n_tokens"] == 3 * (2 + 3 + 4)
    assert [row["length"] for row in result["by_length"]] == [2, 3, 4]
    assert all(row["n"] == 3 and row["token_accuracy"] == 1.0 and row["dl_distance"] == 0
               for row in result["by_length"])


def test_variable_length_paper_sizes():
    t = task(name="variable_length", vocab_size=16384, length=64, min_length=32, held_out=1024)
    assert t.held_out.shape == (33 * 1024, 64)
    b = next(t.held_out_batches(1024))  # held-out batches of one length each
    assert b.lengths.unique().tolist() == [32] and b.inputs.shape == (1024, 64)


# -- dual frequency ---------------------------------------------------------------------------
def test_dual_frequency_rare_fraction():
    t = task(name="dual_frequency", vocab_size=64, length=64,
             held_out_per_cell=1)
    tokens = t.sample(2048, gen()).sequences  # 131,072 tokens
    rare = (tokens >= 32).double()
    se = math.sqrt(0.125 * 0.875 / rare.numel())
    assert abs(float(rare.mean()) - 0.125) < 4 * se
    assert tokens.min() == 0 and tokens.max() == 63
    # uniform within each half: every id of the half appears
    assert len(tokens[tokens < 32].unique()) == 32 and len(tokens[tokens >= 32].unique()) == 32


@pytest.mark.parametrize("per_cell, size", [(16, 4096), (4, 1024)])
def test_dual_frequency_structured_set(per_cell, size):
    K, L = 64, 64
    t = task(name="dual_frequency", vocab_size=K, length=L,
             held_out_per_cell=per_cell)
    rows, cells = t.held_out, t.cells
    assert rows.shape == (size, L) and cells.shape == (size, 3)
    assert not duplicated(rows).any()
    target_rare, disturbants_rare, position = cells.unbind(1)
    # every (target type, disturbant type, position) cell holds per_cell sequences
    cell_id = (target_rare * 2 + disturbants_rare) * L + position - 1
    assert torch.bincount(cell_id, minlength=4 * L).tolist() == [per_cell] * (4 * L)
    rare = rows >= K // 2
    at_target = torch.arange(L)[None, :] == (position - 1)[:, None]
    assert (rare[at_target] == target_rare.bool()).all()
    assert (rare[~at_target].view(size, L - 1) == disturbants_rare.bool()[:, None]).all()


def test_structured_cells_order():
    cells = structured_cells(length=2, per_cell=2)
    assert cells.tolist()[:6] == [[0, 0, 1], [0, 0, 1], [0, 0, 2], [0, 0, 2], [0, 1, 1],
                                  [0, 1, 1]]
    assert len(cells) == 16


def test_dual_frequency_scores_the_target_token():
    K, L = 8, 8
    t = task(name="dual_frequency", vocab_size=K, length=L, held_out_per_cell=2)
    position = t.cells[:, 2]
    seen = 0

    def wrong_on_rare_targets_in_first_quarter(batch):
        nonlocal seen  # held-out batches come in held-out order
        cells = t.cells[seen:seen + len(batch)]
        seen += len(batch)
        logits = perfect(batch)
        bad = ((cells[:, 0] == 1) & (cells[:, 2] <= 2)).nonzero().squeeze(1)
        j = L - cells[bad, 2]  # output index of the target token
        logits[bad, j] = nn.functional.one_hot((batch.output_targets[bad, j] + 1) % K,
                                               64).float()
        return logits

    result = t.evaluate(wrong_on_rare_targets_in_first_quarter, batch_size=5)
    assert len(result["by_condition"]) == 4 * L
    for row in result["by_condition"]:
        expected = 0.0 if row["target"] == "rare" and row["position"] <= 2 else 1.0
        assert row["accuracy"] == expected and row["n"] == 2
    bands = [(r["target"], r["disturbants"], r["band"], r["accuracy"], r["n"])
             for r in result["by_band"]]
    assert bands[:4] == [("frequent", "frequent", "1-2", 1.0, 4),
                         ("frequent", "frequent", "3-4", 1.0, 4),
                         ("frequent", "frequent", "5-6", 1.0, 4),
                         ("frequent", "frequent", "7-8", 1.0, 4)]
    assert ("rare", "rare", "1-2", 0.0, 4) in bands and len(bands) == 16
    assert result["target_accuracy"] == 1 - 8 / len(position)  # 2 conditions x 2 t x 2
    assert result["n_sequences"] == 4 * L * 2
    assert result["token_accuracy"] == 1 - 8 / (len(position) * L)


def test_dual_frequency_bands_of_length_64():
    t = task(name="dual_frequency", vocab_size=64, length=64,
             held_out_per_cell=1)
    result = t.evaluate(perfect, batch_size=1024)
    assert [r["band"] for r in result["by_band"][:4]] == ["1-16", "17-32", "33-48", "49-64"]
    assert all(r["n"] == 16 and r["accuracy"] == 1.0 for r in result["by_band"])


# -- held-out sets and exclusion --------------------------------------------------------------
EXCLUSION_CASES = [  # held-out sets that cover a large part of all rows
    dict(name="reverse", vocab_size=2, length=4, held_out=12),  # 12 of 16
    dict(name="sort", vocab_size=2, length=4, held_out=12),
    dict(name="reverse_add", vocab_size=2, length=2, held_out=12),
    dict(name="predecessor", vocab_size=3, length=3, held_out=9),  # 9 of 12 (x, q) pairs
    dict(name="variable_length", vocab_size=2, length=3, min_length=1, held_out=1),
    dict(name="dual_frequency", vocab_size=4, length=2, held_out_per_cell=1),
]


@pytest.mark.parametrize("cfg", EXCLUSION_CASES)
def test_training_never_draws_held_out(cfg):
    t = task(**cfg)
    held = {tuple(r) for r in t.key(t.held_out).tolist()}
    assert len(held) == len(t.held_out)  # distinct
    g = gen()
    for _ in range(20):
        b = t.sample(256, g)
        rows = b.sequences if cfg["name"] != "predecessor" else torch.cat(
            [b.sequences, b.queries[:, None]], 1)
        if b.lengths is not None:  # re-pad to full length to compare with held-out keys
            rows = torch.nn.functional.pad(rows, (0, t.L - rows.shape[1]), value=-1)
        drawn = {tuple(r) for r in rows.tolist()}
        assert not drawn & held


@pytest.mark.parametrize("cfg", EXCLUSION_CASES)
def test_held_out_is_fixed_by_the_seed(cfg):
    assert torch.equal(task(seed=5, **cfg).held_out, task(seed=5, **cfg).held_out)


def test_held_out_differs_between_seeds():
    cfg = dict(name="predecessor", vocab_size=64, length=8, held_out=16)
    assert not torch.equal(task(seed=1, **cfg).held_out, task(seed=2, **cfg).held_out)


@pytest.mark.parametrize(("low", "high", "width"), [
    (0, 2, 10),             # a dense reverse task's rows: one int64 each
    (-1, 64, 16),           # variable length: -1 pads the rows
    (0, 16384, 64),         # the paper's widest rows do not fit one int64: compared as rows
    (0, 1 << 40, 3)])
def test_duplicated_are_the_rows_seen_before(low, high, width):
    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(low, high, (300, width), generator=generator)
    rows[::7] = rows[3]  # repeats, before and after their first
    rows[5::11, :-1] = rows[6, :-1]  # rows alike but in their last token
    seen: set = set()
    expected = []
    for row in map(tuple, rows.tolist()):
        expected.append(row in seen)
        seen.add(row)
    assert duplicated(rows).tolist() == expected
    assert 40 < sum(expected) < 100


def test_duplicated_rows_of_floats_are_compared_as_rows():
    rows = torch.tensor([[0.5, 1.0], [1.0, 0.5], [0.5, 1.0], [0.5, 0.25]])
    assert duplicated(rows).tolist() == [False, False, True, False]


def test_redraw_duplicates_keeps_order_and_index():
    rows = torch.tensor([[1, 1], [2, 2], [1, 1], [3, 3], [2, 2]])
    assert duplicated(rows).tolist() == [False, False, True, False, True]
    fresh = iter([torch.tensor([[7, 7], [3, 3]]), torch.tensor([[9, 9]])])
    out = redraw_duplicates(rows, lambda idx: next(fresh)[:len(idx)])
    assert out.tolist() == [[1, 1], [2, 2], [7, 7], [3, 3], [9, 9]]


# -- scoring ----------------------------------------------------------------------------------
def test_sequence_scores_known_answer():
    t = task(name="reverse", vocab_size=4, length=3, held_out=2)

    def one_wrong(batch):  # swap the first two outputs of every row
        logits = perfect(batch)
        return logits[:, [1, 0, 2]]

    rows = t.held_out
    result = t.evaluate(one_wrong, batch_size=8)
    same = (rows[:, 2] == rows[:, 1]).double()  # swapping equal tokens costs nothing
    assert result["token_accuracy"] == pytest.approx(float(same.mean() * 1 + (1 - same.mean())
                                                           * (1 / 3)))
    assert result["dl_distance"] == pytest.approx(float((1 - same).mean()))  # a transposition


def test_predecessor_scores_accuracy():
    t = task(name="predecessor", vocab_size=16, length=4, held_out=10)
    result = t.evaluate(perfect, batch_size=3)
    assert result == {"accuracy": 1.0, "token_accuracy": 1.0, "n_sequences": 10}


def test_evaluate_rejects_language_model_options():
    t = task(name="sort", vocab_size=4, length=3, held_out=2)
    with pytest.raises(UserError, match="per_position: not an option of the sort task"):
        t.evaluate(perfect, 8, per_position=True)


def test_the_package_registers_its_seven_tasks():
    assert set(TASKS) == {"reverse", "sort", "reverse_add", "predecessor", "dual_frequency",
                          "variable_length", "lm"}
    for name, kind in TASKS.items():
        assert kind.name == name and kind.label and kind.make.__name__.endswith("Task")


# -- validation -------------------------------------------------------------------------------
@pytest.mark.parametrize("task_cfg, where, words", [
    (dict(name="dual_frequency", rarity=0.0), "task.rarity", "greater than 0"),
    (dict(name="dual_frequency", rarity=1.0), "task.rarity", "less than 1"),
    (dict(rarity=0.25), "task.rarity",
     "not an option of task.name = 'reverse' (only of 'dual_frequency')"),
    (dict(name="dual_frequency", vocab_size=63), "task.vocab_size", "even K"),
    (dict(name="dual_frequency", length=1, vocab_size=8), "task.length", "L >= 2"),
    (dict(name="dual_frequency", vocab_size=4, length=2, held_out_per_cell=3),
     "task.held_out_per_cell", "only (K/2)^L = 4 exist"),
    (dict(dual_frequency=True), "task.dual_frequency",
     'the task is named now: task.name = "dual_frequency"'),
    (dict(min_length=2), "task.min_length", 'task.name = "variable_length"'),
    (dict(name="variable_length"), "task.min_length", "needs task.min_length"),
    (dict(name="variable_length", min_length=65, length=64), "task.min_length",
     "65 > task.length = 64"),
    (dict(min_length=2, name="sort"), "task.min_length",
     "not an option of task.name = 'sort' (only of 'variable_length')"),
    (dict(name="predecessor", vocab_size=8, length=16), "task.vocab_size", "K >= L"),
    (dict(name="reverse", vocab_size=2, length=3, held_out=8), "task.held_out", "only 8"),
    (dict(name="variable_length", vocab_size=2, length=8, min_length=2, held_out=4),
     "task.held_out", "only 4"),
    (dict(name="reverse_add", vocab_size=2, length=1, held_out=4), "task.held_out", "only 4"),
    (dict(name="predecessor", vocab_size=3, length=2, held_out=6), "task.held_out", "only 6"),
])
def test_validation_errors_are_one_line(task_cfg, where, words):
    with pytest.raises(UserError) as err:
        validate({"task": task_cfg}, "r.toml")
    message = str(err.value)
    assert message.startswith(f"r.toml: {where}: ") and words in message
    assert "\n" not in message


@pytest.mark.parametrize("cfg, distinct", [
    (dict(name="reverse", vocab_size=3, length=4), 3 ** 4),
    (dict(name="sort", vocab_size=3, length=4), 3 ** 4),
    (dict(name="variable_length", vocab_size=3, length=4, min_length=2), 3 ** 2),  # per length
    (dict(name="reverse_add", vocab_size=3, length=2), 3 ** 4),
    (dict(name="predecessor", vocab_size=5, length=3), 5 * 4 * 3 * 2),  # x and query
])
def test_distinct_sequences(cfg, distinct):
    assert TaskConfig.of(held_out=1, **cfg).distinct_sequences() == distinct


def test_paper_sized_configs_validate():
    TaskConfig.of(name="variable_length", vocab_size=16384, length=64, min_length=32)
    TaskConfig.of(name="dual_frequency", vocab_size=64, length=64)
    TaskConfig.of(name="predecessor", vocab_size=1024, length=16)
    TaskConfig.of(name="reverse_add", vocab_size=1088, length=16)


# -- reverse, held-out exclusion (formerly test_reverse.py) -----------------------------------
def test_held_out_is_distinct_and_seeded():
    cfg = TaskConfig.of(vocab_size=3, length=3, held_out=20)
    a, b = make(cfg, seed=7), make(cfg, seed=7)
    assert a.held_out.shape == (20, 3) and a.held_out.dtype == torch.long
    assert torch.equal(a.held_out, b.held_out)
    assert len(torch.unique(a.held_out, dim=0)) == 20
    assert not torch.equal(a.held_out, make(cfg, seed=8).held_out)


def test_training_never_draws_held_out_where_collisions_are_certain():
    # K = 2, L = 8: 256 distinct sequences, 64 held out, so a quarter of raw draws hit.
    task = make(TaskConfig.of(vocab_size=2, length=8, held_out=64), seed=1)
    gen = torch.Generator().manual_seed(0)
    raw = task.draw(4096, torch.Generator().manual_seed(0))
    exclusion = Exclusion(task.held_out)
    assert exclusion.contains(raw).float().mean() > 0.2  # the test is not vacuous
    batch = task.sample(4096, gen)
    assert not exclusion.contains(batch.sequences).any()
    held = {tuple(r) for r in task.held_out.tolist()}
    assert not any(tuple(r) in held for r in batch.sequences.tolist())
    # every non-held-out sequence still appears: exclusion removes only the held-out
    assert len({tuple(r) for r in batch.sequences.tolist()}) == 256 - 64


def test_exclusion_exact_check_on_hash_collisions():
    keys = torch.tensor([[1, 2], [3, 4]])
    ex = Exclusion(keys)
    # force a collision: same hash, different row
    ex.sorted_hashes = torch.sort(sequence_hash(torch.tensor([[1, 2], [9, 9]]))).values
    assert ex.contains(torch.tensor([[9, 9], [1, 2]])).tolist() == [False, True]


def test_duplicates_are_redrawn_in_place():
    rows = torch.tensor([[3], [1], [3], [2], [1]])
    assert duplicated(rows).tolist() == [False, False, True, False, True]
    fresh = iter([torch.tensor([[7], [1]]), torch.tensor([[8]])])
    out = redraw_duplicates(rows.clone(), lambda idx: next(fresh)[: len(idx)])
    assert out.tolist() == [[3], [1], [7], [2], [8]]
