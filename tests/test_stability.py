"""Gradient stability (docs/paper-facts.md#gradient-stability): the metric and its alternatives, the
triplets, the Jacobians of GRU/LSTM/S4D against autograd and finite differences, and `perencode
stability` end to end on tiny dual-frequency runs."""

from __future__ import annotations

import csv
import math
import shutil
from collections.abc import Callable

import pytest
import torch
from conftest import ROOT, TINY, fitting, run_cli

from perencode.analysis import gradient_stability as sm
from perencode.commands import stability as st
from perencode.common.errors import UserError
from perencode.config.recipe import EncodingConfig
from perencode.kinds.models.rnn import RecurrentModel
from perencode.kinds.models.s4d import S4DModel
from perencode.kinds.shapes import Shapes
from perencode.store.lock import hold
from perencode.store.runs import read_recipe

F64 = torch.float64
WEIGHTED_LIKE = ("weighted", "mean", "frobenius")  # the normalised metrics, in [-1, 1]

# --------------------------------------------------------------------------------------
# The metric.
# --------------------------------------------------------------------------------------


def metric(name: str, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
    """One metric of perencode.analysis.gradient_stability.METRICS of two Jacobians."""
    return sm.stability_metrics(A, B)[name]


def slow_metrics(A: torch.Tensor, B: torch.Tensor) -> dict[str, float]:
    """docs/paper-facts.md#gradient-stability and Eq. 3-4 written out row by row in plain Python
    floats."""
    rows_a, rows_b = A.tolist(), B.tolist()
    n_a = [math.sqrt(sum(v * v for v in r)) for r in rows_a]
    n_b = [math.sqrt(sum(v * v for v in r)) for r in rows_b]
    dots = [sum(x * y for x, y in zip(ra, rb)) for ra, rb in zip(rows_a, rows_b)]
    cos = [d / (na * nb) if na > 0 and nb > 0 else 0.0 for d, na, nb in zip(dots, n_a, n_b)]
    total = sum(na * nb for na, nb in zip(n_a, n_b))
    weighted = sum(na * nb / total * c for na, nb, c in zip(n_a, n_b, cos)) if total else 0.0
    sa, sb = sum(n_a), sum(n_b)
    printed = sum((na / sa) * (nb / sb) * d for na, nb, d in zip(n_a, n_b, dots)) \
        if sa and sb else 0.0
    fro = math.sqrt(sum(x * x for x in n_a) * sum(x * x for x in n_b))
    return {"weighted": weighted, "printed": printed, "mean": sum(cos) / len(cos),
            "frobenius": sum(dots) / fro if fro else 0.0,
            "frobenius_distance": math.sqrt(sum((x - y) ** 2 for ra, rb in zip(rows_a, rows_b)
                                                for x, y in zip(ra, rb)))}


def test_identical_jacobians_give_one_and_negated_minus_one():
    J = torch.randn(7, 5, dtype=F64)
    for name in WEIGHTED_LIKE:
        assert sm.stability_metrics(J, J)[name].item() == pytest.approx(1.0, abs=1e-14)
        assert sm.stability_metrics(J, -J)[name].item() == pytest.approx(-1.0, abs=1e-14)
    J32 = torch.randn(64, 128)
    assert sm.gradient_stability(J32, J32).item() == pytest.approx(1.0, abs=1e-6)
    assert sm.gradient_stability(J32, J32).item() <= 1.0  # clamped: never past the bounds
    # Eq. 3-4 as printed are not normalised: sum n_i^4 / (sum n_k)^2 at perfect alignment.
    n = torch.linalg.vector_norm(J, dim=-1)
    expected = ((n ** 4).sum() / n.sum() ** 2).item()
    assert metric("printed", J, J).item() == pytest.approx(expected, rel=1e-12)


def test_weighted_known_answer_and_row_scaling():
    A = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=F64)
    B = torch.tensor([[1.0, 0.0], [0.0, -1.0]], dtype=F64)
    # n^A = (1, 2), n^B = (1, 1): w = (1/3, 2/3), cos = (1, -1).
    assert sm.gradient_stability(A, B).item() == pytest.approx(-1 / 3, abs=1e-15)
    assert metric("mean", A, B).item() == pytest.approx(0.0, abs=1e-15)
    # Scaling a row leaves its cosine alone and moves only its weight: w = (1/5, 4/5).
    A2 = A * torch.tensor([[1.0], [2.0]], dtype=F64)
    assert sm.gradient_stability(A2, B).item() == pytest.approx(-3 / 5, abs=1e-15)
    assert metric("mean", A2, B).item() == pytest.approx(0.0, abs=1e-15)


def test_invariances_to_scaling():
    A, B = torch.randn(2, 9, 6, dtype=F64).unbind(0)
    base = {name: sm.stability_metrics(A, B)[name].item() for name in sm.METRICS}
    for name in WEIGHTED_LIKE:  # whole-Jacobian scale, either side, any magnitude
        scaled = sm.stability_metrics(3.0 * A, 1e-3 * B)[name].item()
        assert scaled == pytest.approx(base[name], 1e-12)
    # Scaling single rows: the cosines, hence mean, are invariant (weighted moves those
    # rows' weights: test_weighted_known_answer_and_row_scaling).
    scale = torch.rand(9, 1, dtype=F64) * 10 + 0.1
    assert metric("mean", A * scale, B).item() == pytest.approx(base["mean"], 1e-12)
    # Printed: scales with |J^A| |J^B| (Eq. 3 is bilinear, Eq. 4 scale-free).
    assert metric("printed", 3.0 * A, 2.0 * B).item() == pytest.approx(6 * base["printed"])


def test_tiny_gradients_do_not_underflow():
    # Vanishing gradients of a vanilla RNN: rows of norm ~1e-25 in float32; products of
    # two norms (1e-50) would underflow without the rescaling.
    A, B = torch.randn(2, 16, 32).unbind(0)
    expected = sm.gradient_stability(A.double(), B.double()).item()
    got = sm.gradient_stability(A * 1e-25, B * 1e-25).item()
    assert got == pytest.approx(expected, abs=1e-5)
    assert metric("frobenius", A * 1e-25, B * 1e-25).item() == pytest.approx(
        metric("frobenius", A.double(), B.double()).item(), abs=1e-5)


def test_zero_rows_contribute_nothing_and_all_zero_gives_zero():
    A, B = torch.randn(2, 5, 4, dtype=F64).unbind(0)
    A0 = A.clone()
    A0[2] = 0  # a zero row in one Jacobian: cos = 0, weight = 0
    keep = [0, 1, 3, 4]
    assert sm.gradient_stability(A0, B).item() == pytest.approx(
        sm.gradient_stability(A[keep], B[keep]).item(), abs=1e-14)
    assert metric("mean", A0, B).item() == pytest.approx(
        metric("mean", A[keep], B[keep]).item() * 4 / 5, abs=1e-14)
    zero = torch.zeros(5, 4, dtype=F64)
    for name in sm.METRICS:
        for a, b in ((zero, zero), (zero, B), (A, zero)):
            value = sm.stability_metrics(a, b)[name]
            assert not torch.isnan(value) and value.item() == 0.0, name
    assert sm.forward_cosine(torch.zeros(3), torch.ones(3)).item() == 0.0


def test_batch_dims_and_slow_reference():
    torch.manual_seed(0)
    A = torch.randn(2, 3, 6, 5, dtype=F64)
    B = torch.randn(2, 3, 6, 5, dtype=F64) + 0.5 * A  # correlated, so values are not ~0
    A[0, 1, 2] = 0  # a zero row in the batch
    together = sm.stability_metrics(A, B)
    for key, value in together.items():
        assert value.shape == (2, 3), key
    torch.testing.assert_close(sm.gradient_stability(A, B), together["weighted"], rtol=0,
                               atol=0)
    for i in range(2):
        for j in range(3):
            ref = slow_metrics(A[i, j], B[i, j])
            for key, expected in ref.items():
                assert together[key][i, j].item() == pytest.approx(expected, rel=1e-10,
                                                                   abs=1e-12), key


def test_forward_distance_and_cosine():
    a = torch.tensor([[3.0, 4.0], [1.0, 0.0]], dtype=F64)
    b = torch.tensor([[0.0, 4.0], [-2.0, 0.0]], dtype=F64)
    torch.testing.assert_close(sm.forward_distance(a, b), torch.tensor([3.0, 3.0], dtype=F64))
    torch.testing.assert_close(sm.forward_cosine(a, b), torch.tensor([0.8, -1.0], dtype=F64))


# --------------------------------------------------------------------------------------
# Triplets.
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [0, 22])
def test_triplets_types_counts_and_sharing(prefix):
    K, L, n = 64, 64, 32
    tr = sm.make_triplets(K, L, n, seed=111, prefix_length=prefix)
    assert tr.tokens.shape == (n, 3, L)
    conditions = list(zip(tr.target_rare.tolist(), tr.disturbants_rare.tolist()))
    for condition in [(False, False), (False, True), (True, False), (True, True)]:
        assert conditions.count(condition) == n // 4  # 256 each for the paper's 1,024
    # Blocks in the authors' order: (F, F), (F, R), (R, F), (R, R).
    assert conditions[:n // 4] == [(False, False)] * (n // 4)
    assert conditions[-1] == (True, True)
    target = tr.tokens[:, :, prefix]  # [n, 3]
    others = torch.cat([tr.tokens[:, :, :prefix], tr.tokens[:, :, prefix + 1:]], dim=-1)
    rare_target = (target >= K // 2)
    assert (rare_target == tr.target_rare[:, None]).all()
    assert ((others >= K // 2) == tr.disturbants_rare[:, None, None]).all()
    assert tr.tokens.min() >= 0 and tr.tokens.max() < K
    # (p, x, s), (p, x, s'), (p', x', s).
    suffix = tr.tokens[:, :, prefix + 1:]
    assert (target[:, 0] == target[:, 1]).all()
    assert (suffix[:, 0] == suffix[:, 2]).all()
    assert (suffix[:, 0] != suffix[:, 1]).any(-1).all()
    assert (target[:, 0] != target[:, 2]).any()  # x' drawn independently of x
    if prefix:
        pre = tr.tokens[:, :, :prefix]
        assert (pre[:, 0] == pre[:, 1]).all()
        assert (pre[:, 0] != pre[:, 2]).any(-1).all()
    inputs = tr.inputs(command=K)
    assert inputs.shape == (n, 3, 2 * L - prefix)  # the GRU's 128 steps, the S4D's 106
    assert (inputs[..., L:] == K).all()


def test_triplets_are_fixed_by_the_seed():
    a = sm.make_triplets(16, 8, 8, seed=111)
    assert torch.equal(a.tokens, sm.make_triplets(16, 8, 8, seed=111).tokens)
    assert not torch.equal(a.tokens, sm.make_triplets(16, 8, 8, seed=222).tokens)
    with pytest.raises(UserError, match="multiple of 4"):
        sm.make_triplets(16, 8, 6, seed=111)


# --------------------------------------------------------------------------------------
# Cells and Jacobians (float64, tiny models).
# --------------------------------------------------------------------------------------


def tiny_rnn(arch: str, K: int = 5, E: int = 4, H: int = 3, T: int = 12) -> RecurrentModel:
    torch.manual_seed(0)
    return RecurrentModel(arch, Shapes(K + 1, K, T, T), E, H, EncodingConfig()).double()


def tiny_s4d(K: int = 5, E: int = 4, H: int = 3, N: int = 4, T: int = 12) -> S4DModel:
    torch.manual_seed(0)
    model = S4DModel(Shapes(K + 1, K, T, T), E, H, N, EncodingConfig()).double()
    with torch.no_grad():  # steps large enough for the modes to rotate and decay visibly
        model.s4d.log_dt.uniform_(math.log(0.05), math.log(0.5))
    return model


@pytest.mark.parametrize("arch", ["gru", "lstm"])
def test_step_matches_torch_modules(arch):
    model = tiny_rnn(arch)
    x = torch.randn(2, 7, model.rnn.input_size, dtype=F64)
    H = model.rnn.hidden_size
    assert torch.equal(model.initial_state(2), torch.zeros(2, H if arch == "gru" else 2 * H,
                                                           dtype=F64))
    state = torch.randn(2, H if arch == "gru" else 2 * H, dtype=F64)
    init = state[None] if arch == "gru" else tuple(s[None].contiguous()
                                                   for s in state.chunk(2, -1))
    expected, _ = model.rnn(x, init)  # [2, 7, H]
    for t in range(7):
        h, state = model.step(x[:, t], state)
        torch.testing.assert_close(h, expected[:, t], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(state[:, :H], h, rtol=0, atol=0)


def reference_rnn(model: RecurrentModel, tokens: torch.Tensor, target_step: int):
    """z after `target_step` and f(z) = h_T, both from nn.GRU/nn.LSTM itself."""
    x = model.cell_inputs(tokens)
    H = model.rnn.hidden_size
    _, state = model.rnn(x[:, :target_step + 1])
    z = state[0] if model.arch == "gru" else torch.cat([state[0][0], state[1][0]], -1)

    def f(z_b: torch.Tensor, b: int) -> torch.Tensor:
        init = z_b[None, None] if model.arch == "gru" else (
            z_b[None, None, :H].contiguous(), z_b[None, None, H:].contiguous())
        out, _ = model.rnn(x[b:b + 1, target_step + 1:], init)
        return out[0, -1]

    return z.detach(), f


def reference_s4d(model: S4DModel, tokens: torch.Tensor, target_step: int):
    """z after `target_step` and f(z) = y_T by stepping `S4D.step` through every step."""
    layer = model.s4d
    u = model.in_proj(model.cell_inputs(tokens))
    state = layer.initial_state(u.shape[0])
    for t in range(target_step + 1):
        state = layer.step_state(u[:, t], state)

    def f(z_b: torch.Tensor, b: int) -> torch.Tensor:
        s = torch.view_as_complex(z_b.view(*state.shape[1:], 2))
        for t in range(target_step + 1, u.shape[1]):
            y, s = layer.step(u[b, t], s)
        return y

    return torch.view_as_real(state).flatten(1).detach(), f


def autograd_loop(f, z: torch.Tensor) -> torch.Tensor:
    """The Jacobian of one sequence, one output dim at a time with torch.autograd."""
    z = z.clone().requires_grad_(True)
    y = f(z)
    return torch.stack([torch.autograd.grad(y[i], z, retain_graph=True)[0]
                        for i in range(y.shape[0])])


def finite_differences(f, z: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    with torch.no_grad():
        cols = []
        for j in range(z.shape[0]):
            step = torch.zeros_like(z)
            step[j] = eps
            cols.append((f(z + step) - f(z - step)) / (2 * eps))
    return torch.stack(cols, dim=1)


@pytest.mark.parametrize("arch,target_step", [("gru", 0), ("lstm", 0), ("gru", 3),
                                              ("s4d", 3), ("s4d", 0)])
def test_jacobians_match_autograd_and_finite_differences(arch, target_step):
    model = tiny_s4d() if arch == "s4d" else tiny_rnn(arch)
    torch.manual_seed(1)
    tokens = torch.randint(6, (2, 12))
    J, out = sm.jacobians(model, tokens, target_step, chunk_size=2)  # chunked on purpose
    reference: Callable = reference_s4d if arch == "s4d" else reference_rnn
    z, f = reference(model, tokens, target_step)
    width = {"gru": 3, "lstm": 6, "s4d": 3 * 2 * 2}[arch]  # h; [h; c]; H x N/2 x (re, im)
    assert J.shape == (2, 3, width) and out.shape == (2, 3) and z.shape == (2, width)
    with torch.no_grad():
        torch.testing.assert_close(out, model(tokens)[:, -1], rtol=1e-10, atol=1e-12)
    for b in range(2):
        fb = lambda z_b, b=b: f(z_b, b)  # noqa: E731
        torch.testing.assert_close(J[b], autograd_loop(fb, z[b]), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(J[b], finite_differences(fb, z[b]), rtol=1e-6, atol=1e-9)
    assert J.abs().max() > 1e-5  # not vanished: the comparisons above are meaningful


def test_s4d_state_layout_is_view_as_real():
    """Column 2*(h*N/2 + n) + k of J is d y / d (re, im)[k] of mode n of channel h."""
    model = tiny_s4d()
    tokens = torch.randint(6, (1, 12))
    J, _ = sm.jacobians(model, tokens, 3)
    z, f = reference_s4d(model, tokens, 3)
    z_c = torch.view_as_complex(z[0].view(3, 2, 2)).clone().requires_grad_(True)
    y = f(torch.view_as_real(z_c).flatten(), 0)
    (g,) = torch.autograd.grad(y[1], z_c)  # real y, complex z: g = dy/dre + i dy/dim
    torch.testing.assert_close(J[0, 1, 0::2].view(3, 2), g.real, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(J[0, 1, 1::2].view(3, 2), g.imag, rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------------------
# End to end: tiny dual-frequency runs, `perencode stability`.
# --------------------------------------------------------------------------------------

TINY_DUAL = [*TINY, 'task.name="dual_frequency"', "task.vocab_size=16", "train.iterations=6",
             "train.checkpoint_every=2", "task.held_out_per_cell=1"]


@pytest.fixture(scope="module", params=["gru", "lstm", "s4d"])
def analysed(request, tmp_path_factory):
    """(run_dir, csv rows, csv bytes) of a tiny run of each model after `perencode stability`."""
    run = tmp_path_factory.mktemp(request.param) / "run"
    overrides = fitting([*TINY_DUAL, f"model.arch={request.param}"])
    sets = [a for item in overrides for a in ("--set", item)]
    code, text = run_cli("train", ROOT / "recipes/gru_dualfreq_vocab64.toml", *sets, "--out", run,
                        "--device", "cpu", "--no-progress")
    assert code == 0, text
    code, text = run_cli("stability", run, "--triplets", 16, "--device", "cpu",
                        "--no-progress")
    assert code == 0, text
    path = run / "stability.csv"
    return run, read_rows(path), path.read_bytes()


def read_rows(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
@pytest.mark.compat
def test_csv_has_every_checkpoint_condition_and_comparison(analysed):
    run, rows, _ = analysed
    assert tuple(rows[0]) == st.COLUMNS
    assert len(rows) == 3 * 16 * 2
    cells: dict[tuple[str, str, str, str], int] = {}
    for r in rows:
        key = (r["iteration"], r["comparison"], r["target"], r["disturbants"])
        cells[key] = cells.get(key, 0) + 1
    assert set(cells.values()) == {4}  # 16 triplets / 4 conditions
    assert {k[0] for k in cells} == {"2", "4", "6"}
    assert {k[1] for k in cells} == {"target", "suffix"}
    assert len(cells) == 3 * 2 * 4
    arch = read_recipe(run).model.arch
    for r in rows:
        assert r["model"] == arch and r["encoding"] == "sinusoidal"
        assert r["seed"] == "111" and r["metric"] == "weighted"
        assert r["stability"] == r["stability_weighted"]
        for column in ("stability", "stability_mean", "stability_frobenius", "forward_cosine"):
            assert -1.0 <= float(r[column]) <= 1.0, column
        assert float(r["frobenius_distance"]) >= 0 and float(r["forward_distance"]) >= 0


@pytest.mark.slow
@pytest.mark.compat
def test_rerun_is_a_no_op_and_a_cut_analysis_resumes(analysed):
    run, rows, content = analysed
    path = run / "stability.csv"
    mtime = path.stat().st_mtime_ns
    assert run_cli("stability", run, "--triplets", 16, "--device", "cpu",
                  "--no-progress")[0] == 0
    assert path.stat().st_mtime_ns == mtime and path.read_bytes() == content
    # As if killed after the first two checkpoints: the last is recomputed identically.
    head, *_ = content.decode().split("\n", 1)
    kept = [line for line in content.decode().splitlines()[1:] if not line.startswith("6,")]
    path.write_text("\n".join([head, *kept]) + "\n")
    path = st.analyse_run(run, triplets=16, device="cpu", progress=False)
    assert path.read_bytes() == content


def test_options_and_refusals(analysed, tmp_path):
    run, rows, _ = analysed
    with pytest.raises(UserError, match="weighted, printed, mean, frobenius"):
        st.analyse_run(run, triplets=16, metric="cosine")
    with pytest.raises(UserError, match="--triplets 16 --metric weighted"):
        st.analyse_run(run, triplets=8, progress=False)
    code, text = run_cli("stability", run, "--metric", "mean", "--triplets", 16)
    assert code == 2 and "--metric weighted" in " ".join(text.split())
    # --every 2 on a fresh copy: the 1st and 3rd checkpoints; --metric printed.
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    (copy / "stability.csv").unlink()
    path = st.analyse_run(copy, triplets=4, metric="printed", every=2, batch=3,
                          device="cpu", progress=False)
    fresh = read_rows(path)
    assert sorted({r["iteration"] for r in fresh}) == ["2", "6"] and len(fresh) == 16
    assert all(r["stability"] == r["stability_printed"] for r in fresh)
    # A run of the plain reverse task is refused.
    plain = tmp_path / "plain"
    plain.mkdir()
    recipe = (run / "recipe.toml").read_text().replace('name = "dual_frequency"',
                                                      'name = "reverse"')
    (plain / "recipe.toml").write_text(recipe)
    with pytest.raises(UserError, match="needs a run of task.name = 'dual_frequency'"):
        st.analyse_run(plain)


def test_the_run_is_locked_meanwhile_and_stale_temporary_files_go(analysed):
    run, _, content = analysed
    with hold(run, "train"):
        code, text = run_cli("stability", run, "--triplets", 16, "--device", "cpu",
                             "--no-progress")
        assert code == 2 and "already in use" in text
    stale = run / ".stability.csv.a1b2c3d4.tmp"
    stale.write_text("iteration,")
    assert run_cli("stability", run, "--triplets", 16, "--device", "cpu",
                   "--no-progress")[0] == 0
    assert not stale.exists() and (run / "stability.csv").read_bytes() == content
