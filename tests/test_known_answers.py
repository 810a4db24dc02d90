"""Known answers from the paper for three paths the authors' code has no counterpart to run
(crosscheck cannot compare them): the statistic Fig. 5 plots, the S4D analysis's target
step (t = 23, the Fig. 5 caption) and the Damerau-Levenshtein distance of variable-length
rows. Each answer is worked out by hand in the test."""

import inspect
import math

import pytest
import torch

from perencode.analysis import gradient_stability as gs
from perencode.commands import stability as stability_command
from perencode.common import defaults
from perencode.config import registry
from perencode.config.recipe import EncodingConfig, TaskConfig
from perencode.kinds.models.s4d import S4DModel, s4d_jacobians
from perencode.kinds.scoring import dl_distance
from perencode.kinds.shapes import Shapes
from perencode.kinds.tasks import make

# -- the statistic Fig. 5 plots ---------------------------------------------------------

# Rows (1, 0) / (0, 2) against (1, 0) / (0, -1): row norms n^A = (1, 2), n^B = (1, 1),
# row cosines (1, -1). Weighted (the authors' weighted_mean_gradient_similarity):
# (1*1*1 + 2*1*(-1)) / (1*1 + 2*1) = -1/3. The unweighted mean is 0, the Frobenius cosine
# -1/sqrt(10), the printed Eq. 3-4 (1/3 * 1/2 - 2/3 * 2 * 1/2) = -1/2: only the plotted
# statistic gives -1/3.
J_A = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
J_B = torch.tensor([[1.0, 0.0], [0.0, -1.0]], dtype=torch.float64)
BY_HAND = {"weighted": -1 / 3, "mean": 0.0, "frobenius": -1 / math.sqrt(10), "printed": -0.5}


def test_the_plotted_statistic_is_the_norm_weighted_row_cosine():
    rows = gs._row_terms(J_A, J_B)
    for name, value in BY_HAND.items():
        assert float(gs.METRICS[name](*rows)) == pytest.approx(value, abs=1e-12), name
    # What `perencode stability` copies into its `stability` column (the figures' column).
    assert defaults.STABILITY_METRIC == "weighted"
    assert float(gs.gradient_stability(J_A, J_B)) == pytest.approx(-1 / 3, abs=1e-12)
    assert inspect.signature(stability_command.analyse_run).parameters["metric"].default \
        == defaults.STABILITY_METRIC
    assert float(gs.stability_metrics(J_A, J_B)[defaults.STABILITY_METRIC]) == \
        pytest.approx(-1 / 3, abs=1e-12)


def test_stability_is_one_for_identical_jacobians_blind_to_scale_and_within_minus_one_one():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(16, 6, 10, generator=gen, dtype=torch.float64)  # 16 pairs of 6 x 10
    b = torch.randn(16, 6, 10, generator=gen, dtype=torch.float64)
    ones = torch.ones(16, dtype=torch.float64)
    assert torch.allclose(gs.gradient_stability(a, a), ones, atol=1e-12)
    assert torch.allclose(gs.gradient_stability(-a, a), -ones, atol=1e-12)
    base = gs.gradient_stability(a, b)
    for scale in (1e-20, 0.5, 3.0, 1e20):  # vanishing and exploding Jacobians alike
        assert torch.allclose(gs.gradient_stability(scale * a, b), base, atol=1e-12)
        assert torch.allclose(gs.gradient_stability(a, scale * b), base, atol=1e-12)
    assert torch.allclose(gs.gradient_stability(a.float() * 1e-20, a.float()),
                          ones.float(), atol=1e-6)  # fp32 underflow would give 0
    values = torch.cat([base, gs.gradient_stability(a, a + 0.3 * b)])
    assert bool(((values >= -1) & (values <= 1)).all()) and float(values.abs().max()) < 1
    # Rows weighted by their norms: a pair that agrees only on a tiny row stays near -1.
    c = torch.tensor([[1e-6, 0.0], [0.0, 1.0]], dtype=torch.float64)
    d = torch.tensor([[1e-6, 0.0], [0.0, -1.0]], dtype=torch.float64)
    assert float(gs.gradient_stability(c, d)) == pytest.approx(-1.0, abs=1e-5)


# -- the S4D analysis's target step (t = 23) -------------------------------------------

def test_s4d_stability_target_is_step_23_of_106():
    """Fig. 5's caption: the S4D target at t = 23 after a 22-token prefix; 64 - 22 command
    tokens follow, so the last step is 106. The Jacobian is d y_106 / d z_23: checked by
    central differences of the step-by-step model from the state after 23 inputs."""
    prefix = registry.get("model", "s4d").stability_prefix
    assert prefix + 1 == 23
    K, L = 8, 64
    triplets = gs.make_triplets(K, L, count=4, seed=0, prefix_length=prefix)
    tokens = triplets.inputs(K)  # [4, 3, T]
    assert tokens.shape[-1] == 106 and bool((tokens[..., L:] == K).all())
    same = tokens[:, 0] == tokens[:, 1]  # the common-target pair: (x, s) and (x, s')
    assert bool(same[:, :23].all()) and not bool(same[:, 23:L].all(1).any())
    assert bool((tokens[:, 0, 23:] == tokens[:, 2, 23:]).all())  # (p', x', s) shares s
    assert not bool((tokens[:, 0, :22] == tokens[:, 2, :22]).all(1).any())  # but not p

    torch.manual_seed(0)
    shapes = Shapes(num_embeddings=K + 1, num_classes=K, steps=106, outputs=42)
    model = S4DModel(shapes, 4, 3, 4, EncodingConfig(kind="sinusoidal")).double().eval()
    row = tokens[:1, 0]  # [1, 106]
    jac, y = s4d_jacobians(model, row, prefix)  # [1, H, 2HN], [1, H]
    layer = model.s4d
    with torch.no_grad():
        u = model.in_proj(model.cell_inputs(row))[0]  # [106, H]
        z = layer.initial_state(1)[0]
        for t in range(23):  # the state right after the 23rd input
            z = layer.step_state(u[t], z)

        def last(z0: torch.Tensor) -> torch.Tensor:  # states [..., H, N] -> y_106 [..., H]
            state = z0
            for t in range(23, 105):
                state = layer.step_state(u[t], state)
            return layer.step(u[105], state)[0]

        assert torch.allclose(last(z), y[0], atol=1e-12)
        flat = torch.view_as_real(z).flatten()  # [2HN]
        eps = 1e-6
        moved = flat + eps * torch.cat([torch.eye(len(flat)), -torch.eye(len(flat))]).double()
        out = last(torch.view_as_complex(moved.view(-1, *z.shape, 2)))  # [2 * 2HN, H]
        by_hand = ((out[:len(flat)] - out[len(flat):]) / (2 * eps)).T  # [H, 2HN]
    assert torch.allclose(jac[0], by_hand, atol=1e-7)
    # The planted slip of one step (the state after 22 inputs, t = 22) is told apart.
    early, _ = s4d_jacobians(model, row, prefix - 1)
    assert not torch.allclose(early[0], by_hand, atol=1e-4)


# -- Damerau-Levenshtein distance on variable-length rows ------------------------------

def test_dl_distance_known_answers():
    assert dl_distance([1, 3, 0, 2], [0, 1, 2, 3]) == 3  # 4 for the restricted (OSA) variant
    assert dl_distance(list("ca"), list("abc")) == 2  # 3 for OSA
    assert dl_distance([2, 1], [1, 2]) == 1 and dl_distance([], [5, 5]) == 2


def test_dl_distance_of_variable_length_rows_reads_each_row_to_its_own_length():
    """Rows of lengths 2, 3 and 4 in one batch (padded to 4): the length-2 row exact with
    junk at the padded outputs (0), the length-3 row with its first two outputs swapped (1),
    the length-4 row predicted as t1 t3 t0 t2 (3 unrestricted)."""
    task = make(TaskConfig.of(name="variable_length", vocab_size=8, length=4, min_length=2,
                              held_out=2), seed=0)
    rows = torch.tensor([[0, 1, -1, -1], [2, 3, 4, -1], [4, 5, 6, 7]])
    batch = task.build(rows)
    t = batch.output_targets  # reversed, -1 beyond each length
    assert t.tolist() == [[1, 0, -1, -1], [4, 3, 2, -1], [7, 6, 5, 4]]
    pred = torch.tensor([[1, 0, 6, 6], [3, 4, 2, 6], [6, 4, 7, 5]])
    scores = task.score([batch], [pred])
    assert scores["dl_distance"] == pytest.approx((0 + 1 + 3) / 3)
    assert {r["length"]: r["dl_distance"] for r in scores["by_length"]} == {2: 0.0, 3: 1.0,
                                                                          4: 3.0}
    assert scores["token_accuracy"] == pytest.approx((2 + 1 + 0) / 9)
    assert scores["sequence_accuracy"] == pytest.approx(1 / 3)
    # The planted slip: the distance over the padded width (junk outputs and -1 targets
    # counted) gives 2, 2, 3, not 0, 1, 3.
    assert [dl_distance(p.tolist(), q.tolist()) for p, q in zip(pred, t)] == [2, 2, 3]
