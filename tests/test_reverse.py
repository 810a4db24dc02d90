import torch

from perencode.recipe import TaskConfig
from perencode.tasks import make
from perencode.tasks.base import Exclusion, duplicated, redraw_duplicates, sequence_hash


def test_reverse_known_answer():
    task = make(TaskConfig(vocab_size=5, length=4, held_out=8), seed=0)
    batch = task.build(torch.tensor([[0, 1, 2, 3], [4, 4, 0, 1]]))
    assert batch.inputs.tolist() == [[0, 1, 2, 3, 5, 5, 5, 5], [4, 4, 0, 1, 5, 5, 5, 5]]
    assert batch.targets.tolist() == [[3, 2, 1, 0], [1, 0, 4, 4]]
    assert batch.output_steps is None and batch.output_mask is None
    assert task.num_embeddings == 6 and task.num_classes == 5 and task.max_steps == 8


def test_held_out_is_distinct_and_seeded():
    cfg = TaskConfig(vocab_size=3, length=3, held_out=20)
    a, b = make(cfg, seed=7), make(cfg, seed=7)
    assert a.held_out.shape == (20, 3) and a.held_out.dtype == torch.long
    assert torch.equal(a.held_out, b.held_out)
    assert len(torch.unique(a.held_out, dim=0)) == 20
    assert not torch.equal(a.held_out, make(cfg, seed=8).held_out)


def test_training_never_draws_held_out_where_collisions_are_certain():
    # K = 2, L = 8: 256 distinct sequences, 64 held out, so a quarter of raw draws hit.
    task = make(TaskConfig(vocab_size=2, length=8, held_out=64), seed=1)
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
