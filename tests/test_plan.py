"""`perencode plan` (perencode.commands.plan) and its cost model (perencode.training.planning): the
parts pinned to hand-computed values, the unique runs equal to the sweep's planning, a budget, and
the way from a plan through `sweep` to `verify` on a tiny grid on the CPU."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from conftest import ROOT, run_cli, tiny_recipe, tiny_toml

from perencode.analysis import stats
from perencode.analysis.verdicts import load_claims
from perencode.commands.plan import (
    Run,
    cost_runs,
    cost_section,
    local_wall,
    observed_effects,
    run_parts,
    size_claim,
    slurm_view,
    with_section,
)
from perencode.commands.sweep.cells import RunState, prepare
from perencode.commands.sweep.cells import plan as sweep_plan
from perencode.config.grid import SlurmConfig, load_grid
from perencode.config.recipe import run_key, validate
from perencode.training import planning

pytestmark = pytest.mark.forked_children  # the sweep's children as forks (tests/forked.py)

A100 = planning.gpu("a100")
TINY = tiny_toml(optim={"lr": 1e-2, "warmup": 2}, train={"checkpoint_every": 10})
AXES = """
[grid]
"task.vocab_size" = [8, 16]
"encoding.kind" = ["none", "sinusoidal"]
"train.seed" = [111, 222]
"""


def recipe(**tables):
    return validate(tiny_recipe(**tables), "test")


# -- the cost model, by hand -----------------------------------------------------------------

def test_flops_split_into_recurrent_layer_and_head_by_hand():
    # reverse, L = 4: T = 8 steps, 4 scored outputs; B = 8, E = 8, H = 16, K = 8; a GRU has
    # 3 gates, each mapping the input (E = 8 vanilla) and the state: 3 x (8 x 16 + 16 x 16)
    w = planning.work(recipe(task={"vocab_size": 8}, encoding={"kind": "none"}))
    assert w.layer == 3 * 2 * 8 * 8 * (3 * (8 * 16 + 16 * 16)) == 442_368
    assert w.head == 3 * 2 * 8 * 4 * 16 * 8 == 24_576
    assert w.layer_switch == "cudnn" and w.scored == 4
    assert w.total == planning.flops_per_iteration(recipe(task={"vocab_size": 8},
                                                      encoding={"kind": "none"}))


def test_cudnn_layers_run_in_tf32_and_heads_in_fp32_unless_asked():
    w = planning.work(recipe(task={"vocab_size": 8}))
    assert planning.rates(w, A100) == (156e12, 19.5e12)          # torch's defaults
    assert planning.rates(w, A100, "tf32") == (156e12, 156e12)   # train.precision = "tf32"
    assert planning.rates(w, planning.gpu("v100")) == (15.7e12, 15.7e12)  # Volta has no TF32
    s4d = planning.work(recipe(model={"arch": "s4d", "d_state": 8}))
    assert s4d.layer_switch == "matmul" and planning.rates(s4d, A100)[0] == 19.5e12
    assert planning.modelled_seconds(w, A100, efficiency=planning.PEAK) == pytest.approx(
        w.layer / 156e12 + w.head / 19.5e12)
    assert planning.modelled_seconds(w, A100) == pytest.approx(
        w.layer / (156e12 * 0.25) + w.head / (19.5e12 * 0.8))
    # an S4D's layer is matmuls: fp32, at the matmul efficiency
    assert planning.modelled_seconds(s4d, A100) == pytest.approx(
        s4d.layer / (19.5e12 * 0.8) + s4d.head / (19.5e12 * 0.8))


def test_the_language_model_counts_only_its_scored_positions(tmp_path):
    data = tmp_path / "lm"
    data.mkdir()
    lm = {"name": "lm", "vocab_size": 64, "length": 32, "data": str(data)}
    r = validate({**tiny_recipe(), "task": lm}, "test")
    w = planning.work(r)
    # not prepared: WikiText-103's published size gives the expected positions, at most
    # the input length (32 here)
    assert w.scored == 32 and w.scored_source.startswith("expected from WikiText-103")
    # at the paper's 1,024: 103,227,021 tokens / 600,000 paragraphs x 1.2 pieces, less one
    assert planning.expected_lm_scored(1024) == pytest.approx(103_227_021 / 600_000 * 1.2 - 1)
    assert (planning.expected_lm_scored(1024, 0) < planning.expected_lm_scored(1024)
            < planning.expected_lm_scored(1024, 2) < 1024)  # the plan's range tops at the bound
    (data / "manifest.json").write_text(json.dumps(
        {"splits": {"train": {"sequences": 4, "scored_tokens": 30}}}))
    w = planning.work(r)
    assert w.scored == 7.5 and w.scored_source.endswith("manifest.json")
    # head over 7.5 positions a sequence (K = 63 classes, H = 16, B = 8); the layer over all
    # 32 padded steps (the tiny recipe's GRU: 3 gates)
    assert w.head == 3 * 2 * 8 * 7.5 * 16 * 63
    assert w.layer == 3 * 2 * 8 * 32 * (3 * (16 * 16 + 16 * 16))


def test_gpu_names_and_an_unknown_one():
    assert planning.gpu("A100-80GB") is planning.gpu("a100")
    assert planning.gpu("4090").memory_gb == 24
    code, text = run_cli("plan", str(ROOT / "recipes/paper/fig10_lstm_predecessor.toml"),
                         "--gpu", "tpu")
    assert code == 2 and "--gpu 'tpu': expected one of a100, a100-40gb, h100" in text


def test_welch_power_by_hand():
    assert stats.t_quantile(0.95, 4) == pytest.approx(2.1318, abs=1e-4)
    assert stats.t_quantile(0.80, 8) == pytest.approx(0.8889, abs=1e-4)
    # 5 seeds a group, df 8: (1.8595 + 0.8889) x sqrt(2 / 5)
    assert stats.detectable_effect(5) == pytest.approx((1.8595 + 0.8889) * math.sqrt(0.4),
                                                      abs=1e-3)
    assert stats.seeds_needed(2.0) == 5 and stats.seeds_needed(1.0) == 14
    assert stats.detectable_effect(1) == math.inf


# -- executors ----------------------------------------------------------------------------------

def _runs(hours: list[float]) -> list[Run]:
    r = recipe()
    w = planning.work(r)
    return [Run(str(i), r, "g", [], w, h * 3600 / r.train.iterations, "", 0)
            for i, h in enumerate(hours)]


def test_runs_sharing_a_gpu_are_not_divided_as_if_each_had_its_own():
    runs = _runs([10, 10, 10, 10])
    assert local_wall(runs, gpus=1, runs_per_gpu=1) == pytest.approx(40)
    assert local_wall(runs, gpus=1, runs_per_gpu=4) == pytest.approx(40)  # not 10
    assert local_wall(runs, gpus=2, runs_per_gpu=1) == pytest.approx(20)
    assert local_wall(_runs([30, 1]), gpus=4, runs_per_gpu=1) == pytest.approx(30)


def test_slurm_jobs_time_limits_and_requeues():
    cfg = SlurmConfig(time_min=600, signal_delay_s=360)  # 9.9 h of training a job
    view = slurm_view(_runs([5, 12, 25]), cfg)
    assert view["jobs"] == view["array_size"] == 3 and view["gpus_per_job"] == 1
    assert view["over_limit"] == 2 and view["requeues"] == 1 + 2
    assert view["gpu_hours_charged"] == pytest.approx(42)


# -- unique runs: as the sweep links them --------------------------------------------------------

@pytest.mark.slow
@pytest.mark.compat
def test_unique_runs_equal_the_sweeps_planning(tmp_path):
    first = tmp_path / "first.toml"
    first.write_text(TINY + AXES)
    second = tmp_path / "second.toml"  # K = 16 with PE is the first grid's too
    second.write_text('base = "first.toml"\n[grid]\n"task.vocab_size" = [16, 32]\n'
                      '"encoding.kind" = ["sinusoidal"]\n"train.seed" = [111, 222]\n')
    grids = [load_grid(first), load_grid(second)]
    costs, unique = cost_runs(grids, A100, tmp_path / "runs")
    assert len(unique) == 10 and [c.shared for c in costs] == [0, 2]
    trained = 0
    for grid in grids:  # the sweep of each grid in turn links the cells it finds
        planned = sweep_plan(grid, tmp_path / "runs")
        trained += sum(r.state != RunState.REUSE for r in planned)
        prepare(planned)
    assert trained == len(unique)


# -- the whole paper --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def paper():
    code, text = run_cli("plan", str(ROOT / "recipes/paper"), "--gpu", "a100", "--budget",
                         "24", "--json")
    assert code == 0, text
    return text, json.loads(text)


@pytest.mark.slow  # plans the whole paper: in make test and test-compat, not test-fast
@pytest.mark.compat
def test_the_paper_in_gpu_hours_with_a_budget_of_24(paper):
    _, doc = paper
    assert doc["cells"] == 530 and doc["runs"] == 460
    assert doc["layer_eflop"] == pytest.approx(123.6, abs=0.1)
    # the language model's heads at the positions WikiText-103's size gives (about 205 a
    # paragraph), no longer at the bound of 1,024 (209.4 EFLOP then)
    assert doc["head_eflop"] == pytest.approx(82.9, abs=0.1)
    assert doc["gpu_hours_at_peak"] < doc["gpu_hours"]
    assert doc["gpu_hours_tf32"] < doc["gpu_hours"]
    assert sum(g["runs"] for g in doc["grids"]) == 460
    budget = doc["budget"]
    assert 0 < budget["modelled_hours"] <= 24
    assert budget["decided"] and budget["left_out"]
    ids = budget["decided"] + [c["id"] for c in budget["left_out"]]
    assert len(ids) == len(set(ids))


@pytest.mark.slow
@pytest.mark.compat
def test_a_budget_of_24_buys_the_headline_first_with_every_hour_priced(paper):
    """Fig. 2's claims (priority 1) first, then the claims decided per GPU-hour; each claim's
    seeds and their source; training, evaluation, start-up, the stability analysis 6a reads
    and the GPU check priced, with a range and a margin."""
    budget = paper[1]["budget"]
    assert budget["decided"] == ["1b-gru-vanilla-degrades", "4a-gru-pe-lower-dl",
                                 "7d-lstm-predecessor", "5a-gru-vanilla-frequent-among-rare",
                                 "6a-gru-vanilla-stability-declines"]
    parts = budget["parts"]
    assert set(parts) == {"GPU check", "training", "evaluation", "start-up",
                          "stability analysis"}
    low, high = budget["range_hours"]
    mid = budget["modelled_hours"]
    assert mid == pytest.approx(sum(v[1] for v in parts.values()))
    assert low < mid <= 24 < high and budget["margin_hours"] == pytest.approx(24 - mid)
    assert budget["over_budget_at_high"] == pytest.approx(high - 24)
    # 3 GRU runs analysed, 60 checkpoints each at 3e14 FLOP, fp32 at 0.8 of 19.5 TFLOP/s
    assert parts["stability analysis"][1] == pytest.approx(3 * 60 * 3e14 / 15.6e12 / 3600)
    assert parts["start-up"][1] == pytest.approx(budget["runs"] * 2 / 60)
    for cid in budget["decided"]:  # no effect known: the exact permutation test's fewest
        z = budget["seeds_per_claim"][cid]
        assert (z["seeds"], z["source"]) == (3, "minimum")
    assert all(re.fullmatch(r"needs [\d.,]+ (h|min); [\d.,]+ (h|min) left", c["why"])
               for c in budget["left_out"] if not c["why"].startswith("needs 11 seeds"))


@pytest.mark.slow
def test_the_same_plan_twice(paper):
    text, _ = paper
    code, again = run_cli("plan", str(ROOT / "recipes/paper"), "--gpu", "a100", "--budget",
                          "24", "--json")
    assert code == 0 and again == text


def test_no_gpu_named_on_a_machine_without_one():
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the plan prices it")
    code, text = run_cli("plan", str(ROOT / "recipes/paper/fig10_lstm_predecessor.toml"))
    assert code == 2 and "no GPU on this machine" in text and "cpu" not in text.lower()


# -- end to end: plan, sweep, verify ---------------------------------------------------------

CLAIMS = """
[[claim]]
id = "small-pe"
statement = "PE at K = 8 has an accuracy in [0, 1]"
where = { "task.name" = "reverse", "task.vocab_size" = 8, "encoding.kind" = "sinusoidal" }
metric = "token_accuracy"
test = "threshold"
op = ">="
value = 0.0

[[claim]]
id = "large"
statement = "every cell at K = 16 has an accuracy in [0, 1]"
where = { "task.name" = "reverse", "task.vocab_size" = 16 }
metric = "token_accuracy"
by = ["encoding.kind"]
test = "threshold"
op = ">="
value = 0.0
"""


@pytest.mark.slow
def test_plan_sweep_verify_marks_the_claims_outside_the_plan(tmp_path):
    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY + AXES)
    claims = tmp_path / "claims.toml"
    claims.write_text(CLAIMS)
    _, unique = cost_runs([load_grid(grid)], A100, tmp_path / "runs")
    # the GPU check and two runs with their start-up and scoring, not three
    most = max(sum(v[1] for v in run_parts(r, "local", None).values())
               for r in unique.values())
    out = tmp_path / "plan"
    code, text = run_cli("plan", grid, "--gpu", "a100", "--claims", claims, "--budget",
                         f"{planning.GPU_CHECK_MINUTES[1] / 60 + 2.5 * most!r}", "--seeds", "2",
                         "--write", out)
    assert code == 0, text
    written = json.loads((out / "plan.json").read_text())
    assert written["decided"] == ["small-pe"]
    assert [c["id"] for c in written["left_out"]] == ["large"]
    [planned] = [out / name for name in written["grids"]]
    assert [c.name for c in load_grid(planned).cells] == [
        "vocab_size=8/encoding=sinusoidal/seed=111", "vocab_size=8/encoding=sinusoidal/seed=222"]
    code, text = run_cli("sweep", planned, "--runs", tmp_path / "runs", "--device", "cpu",
                         "--no-progress")
    assert code == 0, text
    code, text = run_cli("verify", tmp_path / "runs", "--claims", claims, "--out", tmp_path,
                         "--plan", out / "plan.json")
    assert code == 0, text
    verdicts = {r["id"]: r for r in json.loads((tmp_path / "verify.json").read_text())
                ["results"]}
    # Decided by the test (two seeds: inconclusive at 95%), not marked outside the plan.
    assert verdicts["small-pe"]["verdict"] == "inconclusive"
    assert "outside the plan" not in verdicts["small-pe"].get("note", "")
    assert verdicts["large"]["verdict"] == "not run"
    assert "outside the plan" in verdicts["large"]["note"]
    # The runs trained give the claim's observed effect size: the seeds follow from it.
    code, text = run_cli("plan", grid, "--gpu", "a100", "--claims", claims, "--budget", "1",
                         "--observed", tmp_path / "runs", "--json")
    assert code == 0, text
    budget = json.loads(text)["budget"]
    sized = {**budget["seeds_per_claim"], **{c["id"]: c for c in budget["left_out"]}}
    assert "observed" in json.dumps(sized["small-pe"])  # sized from the runs, or said so
    [claim] = [c for c in load_claims(claims) if c.id == "small-pe"]
    effects, _ = observed_effects([claim], [tmp_path / "runs"])
    expected = size_claim(claim, effects, None, None)
    assert expected.source == "observed"
    if "seeds" in sized["small-pe"]:
        assert sized["small-pe"]["seeds"] == expected.seeds


# -- the precision lever and REPRODUCE.md -------------------------------------------------------

def test_precision_is_in_the_identity_only_when_not_the_authors():
    authors, tf32 = recipe(), recipe(train={"precision": "tf32"})
    assert "precision" not in authors.identity()["train"]  # runs made before it keep theirs
    assert tf32.identity()["train"]["precision"] == "tf32"
    assert run_key(authors) != run_key(tf32)
    w = planning.work(tf32)
    assert (planning.modelled_seconds(w, A100, tf32.train.precision)
            < planning.modelled_seconds(w, A100))


@pytest.mark.slow
@pytest.mark.compat
def test_the_session_sets_torchs_tf32_switches_by_the_recipe():
    import torch

    from perencode.training.session import Session

    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    try:
        Session(recipe(train={"precision": "tf32"}), torch.device("cpu"))
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        Session(recipe(), torch.device("cpu"))
        assert not torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


@pytest.mark.slow
def test_reproduce_md_cost_section_is_what_plan_writes(monkeypatch):
    if (ROOT / "data/wikitext103/manifest.json").exists():
        pytest.skip("the corpus is prepared here: the section is written without it")
    monkeypatch.chdir(ROOT)
    text = (ROOT / "REPRODUCE.md").read_text(encoding="utf-8")
    section = cost_section([Path("recipes/paper")])
    assert with_section(text, section) == text, "run `python tools/cost_section.py`"
    assert "| 24 |" in section and "| 100 |" in section and "| 500 |" in section


def test_a_measurement_on_that_gpu_replaces_the_model(tmp_path):
    """`sweep --estimate` (or `doctor`) on an A100 cached a shape's seconds per iteration:
    the plan prices that shape by it, and the shapes of the same architecture by their FLOP
    ratio to it; the table's figures stay for another GPU."""
    grid = tmp_path / "tiny.toml"
    grid.write_text(TINY + AXES)
    [g] = grids = [load_grid(grid)]
    measured = g.cells[0].recipe
    planning.Estimates(tmp_path / "runs").put("NVIDIA A100-SXM4-80GB", measured, 0.5,
                                          spread=(0.4, 0.7))
    _, unique = cost_runs(grids, A100, tmp_path / "runs")
    runs = {r.recipe.train.seed: r for r in unique.values()
            if run_key(r.recipe) == run_key(measured)}
    assert runs[111].seconds == 0.5 and runs[111].measured == "measured"
    others = [r for r in unique.values() if r.recipe.model_dump() != measured.model_dump()
              and planning.shape_key(r.recipe) != planning.shape_key(measured)]
    assert others and all(r.measured == "extrapolated" for r in others)
    for r in others:
        assert r.seconds == pytest.approx(0.5 * planning.flops_per_iteration(r.recipe)
                                          / planning.flops_per_iteration(measured))
    _, on_h100 = cost_runs(grids, planning.gpu("h100"), tmp_path / "runs")
    assert all(r.measured == "" for r in on_h100.values())


def test_the_dry_run_names_the_plans_figures_and_the_executors_jobs(tmp_path):
    """`sweep --dry-run` keeps its per-grid view with the figure `plan` gives for the paper's
    GPU, and the executor's line: SLURM jobs, limits and requeues."""
    grid = ROOT / "recipes/paper/fig10_lstm_predecessor.toml"
    code, text = run_cli("sweep", grid, "--runs", tmp_path / "runs", "--dry-run", "--executor",
                         "slurm", "--time-min", "20")
    assert code == 0, text
    text = " ".join(text.split())
    _, unique = cost_runs([load_grid(grid)], A100, tmp_path / "runs")
    hours = sorted(r.hours for r in unique.values())
    assert f"the paper's GPU: {sum(hours):.3g} h modelled" in text
    expected = sum(max(0, math.ceil(h / (20 / 60 - 90 / 3600)) - 1) for h in hours)
    assert expected > 0
    assert "slurm: 50 job(s) in one array" in text and "20 min a job" in text
    assert f"({expected} requeue(s) expected" in text


def test_a_run_larger_than_the_gpus_memory_is_named(cli):
    code, text = cli("plan", ROOT / "recipes/paper/fig15_table1_lstm_wikitext103.toml",
                     "--gpu", "rtx4090")
    assert code == 0, text
    needs = re.search(r"fig15_table1_lstm_wikitext103: a run needs ([\d.]+) GB, more than "
                      r"the 24 GB", " ".join(text.split()))
    assert needs and float(needs[1]) > 24, text  # the preflight's estimate (issue 47's)
