"""CUDA tests: train, evaluate and analyse stability on a GPU at tiny size, and what
`perencode doctor` checks (equivalence with the CPU, determinism, resume across devices,
the memory estimate), with its logic; tests/test_doctor.py runs the same logic CPU against
CPU.

Marked `gpu`; skipped where no CUDA device is present (CI has none). Run them on a GPU
machine with `pytest -m gpu`.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import ROOT, assert_scores_consistent, run_cli, tiny_overrides

from perencode.commands import doctor
from perencode.config import registry
from perencode.config.recipe import load_recipe

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("arch", ["gru", "lstm", "s4d"])
def test_train_eval_stability_on_cuda(arch, tmp_path):
    run = tmp_path / arch
    sets = tiny_overrides('task.name="dual_frequency"', "task.vocab_size=16",
                          "task.held_out_per_cell=1", f'model.arch="{arch}"',
                          "train.iterations=6", "train.checkpoint_every=3")
    code, text = run_cli("train", ROOT / "recipes/gru_dualfreq_vocab64.toml", *sets,
                         "--run-dir", run,
                         "--device", "cuda", "--no-progress")
    assert code == 0, text
    env = json.loads((run / "env.json").read_text())
    assert env["device"].startswith("cuda") and env["cuda"] is not None
    result = json.loads((run / "eval.json").read_text())
    assert result["n_sequences"] == 4 * 64  # 2 x 2 conditions x L target positions x 1
    assert_scores_consistent(result)
    code, text = run_cli("eval", run, "--device", "cuda")
    assert code == 0, text
    assert json.loads((run / "eval.json").read_text())["token_accuracy"] == \
        result["token_accuracy"]
    code, text = run_cli("stability", run, "--triplets", 4, "--device", "cuda",
                         "--no-progress")
    assert code == 0, text
    rows = (run / "stability.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 4 * 2  # header, 2 checkpoints x 4 triplets x 2 comparisons


CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize("arch,encoding", doctor.equivalence_models())
def test_training_steps_on_cuda_match_the_cpu(arch, encoding):
    recipe = doctor.small_recipe(arch, encoding, doctor.EQUIVALENCE_SIZE)
    precision = "tf32" if doctor.tf32_in_effect(CUDA, arch) else "fp32"
    assert doctor.equivalence(recipe, CUDA, CPU) < doctor.TOLERANCE[precision]


@pytest.mark.parametrize("arch", registry.names("model"))
def test_training_steps_on_cuda_in_strict_fp32_match_the_cpu(arch, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    recipe = doctor.small_recipe(arch, "sinusoidal", doctor.EQUIVALENCE_SIZE)
    assert doctor.equivalence(recipe, CUDA, CPU) < doctor.TOLERANCE["fp32"]


def test_determinism_on_cuda_is_measured_never_a_failure():
    [row] = doctor.determinism_check(CUDA, doctor.EQUIVALENCE_SIZE)
    assert row.verdict in (doctor.PASS, doctor.INFO), row


@pytest.mark.parametrize("first,second", [(CPU, CUDA), (CUDA, CPU), (CUDA, CUDA)])
def test_resume_across_devices(first, second, tmp_path):
    recipe = doctor.small_recipe("gru", "sinusoidal", doctor.CPU_SIZE, iterations=4,
                                 checkpoint_every=2, log_every=1, keep_checkpoints="all")
    result = doctor.resume_across(recipe, first, second, tmp_path)
    assert result["starts"] == [str(first), str(second)]
    assert doctor.resume_ok(result, recipe), result


def test_memory_estimate_at_the_paper_shape():
    estimate, peak, ratio = doctor.memory_ratio(load_recipe(ROOT / doctor.FIG2_GRU), CUDA)
    low, high = doctor.MEMORY_RATIO["cuda"]
    assert low <= ratio <= high, (estimate, peak)


@pytest.mark.slow
def test_doctor_passes_on_this_gpu(tmp_path):
    code, text = run_cli("doctor", "--runs", tmp_path)
    assert code == 0, text
    assert (tmp_path / ".estimates.json").exists()


def test_a_resume_mapped_onto_the_gpu_keeps_adams_step_on_the_cpu_and_adds_no_sync():
    """The GPU side of tests/test_session.py's twin: a checkpoint loaded onto the device as
    `perencode train` loads it, Adam's `step` counters back on the CPU, and the host syncs
    per step of the resumed session no more than a fresh one's (doctor's row)."""
    import io

    from perencode.common.device import host_syncs
    from perencode.training.session import Session

    recipe = doctor.small_recipe("gru", "sinusoidal", doctor.EQUIVALENCE_SIZE)
    fresh = Session(recipe, CUDA)
    for _ in range(2):
        fresh.step()
    buffer = io.BytesIO()
    torch.save(fresh.state(), buffer)
    buffer.seek(0)
    resumed = Session(recipe, CUDA)
    resumed.load("probe", torch.load(buffer, map_location=CUDA, weights_only=True))
    assert {s["step"].device.type for s in resumed.optimizer.state.values()} == {"cpu"}
    assert {s["exp_avg"].device.type for s in resumed.optimizer.state.values()} == {"cuda"}
    counted, after = host_syncs(fresh.step, CUDA), host_syncs(resumed.step, CUDA)
    assert counted is not None and after is not None
    assert after[0] <= counted[0] <= doctor.EXPECTED_SYNCS, (counted, after)


def test_the_doctors_sync_row_and_the_kernels_for_this_gpu():
    [row] = doctor.sync_checks(CUDA, load_recipe(ROOT / doctor.FIG2_GRU))
    assert row.verdict == doctor.PASS, row
    rows = {r.name: r for r in doctor.stack_checks(CUDA)}
    assert rows["kernels for this GPU"].verdict == doctor.PASS


def test_a_run_records_its_gpu(tmp_path):
    from perencode.store import environment

    gpu = environment.gpu_report(CUDA)
    assert gpu["gpu_model"].startswith(torch.cuda.get_device_name(0))
    assert gpu["compute_capability"] and gpu["torch_cuda_archs"]
    assert gpu["cudnn_deterministic"] is not None
