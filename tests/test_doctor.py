"""`perencode doctor`'s checks run CPU against CPU: the same functions compare a CUDA device
with the CPU on a GPU node (tests/test_gpu.py runs them there)."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess

import pytest
import torch
from conftest import ROOT, fork_perencode_commands, run_cli, subprocess_env, unfinish

from perencode.commands import doctor
from perencode.config import registry
from perencode.training import planning, session
from perencode.training.session import CHUNK_LOGITS

CPU = torch.device("cpu")
TINY = doctor.CPU_SIZE


@pytest.fixture
def forked_commands(monkeypatch):
    """The `perencode` commands the doctor runs (train, bench) as forks of this process
    (tests/forked.py), for a test of what the doctor makes of them: each is still a process
    of its own reading and writing its run directory. `doctor_on_the_cpu` (tests/conftest.py)
    runs the doctor whole, with real children."""
    fork_perencode_commands(monkeypatch, doctor)


@pytest.mark.parametrize(("arch", "encoding"), doctor.equivalence_models())
def test_equivalence_of_a_device_with_itself_is_exact(arch, encoding):
    recipe = doctor.small_recipe(arch, encoding, TINY)
    assert doctor.equivalence(recipe, CPU, CPU) == 0.0


def test_equivalence_fails_when_one_side_is_perturbed():
    recipe = doctor.small_recipe("gru", "sinusoidal", TINY)
    steps, lr = doctor.EQUIVALENCE_STEPS, recipe.optim.lr

    def broken(params):  # one weight matrix off by about the update's own size
        name = next(n for n in params if "weight" in n and "head" not in n)
        params[name] += steps * lr * torch.randn_like(params[name])

    diff = doctor.equivalence(recipe, CPU, CPU, perturb=broken)
    assert diff > doctor.TOLERANCE["tf32"] > doctor.TOLERANCE["fp32"]
    assert 0.1 < diff < 10  # "about the update": the scale the tolerances are set against


def test_equivalence_rows_one_per_model_with_the_tolerance_of_its_precision(monkeypatch):
    rows = doctor.equivalence_checks(CPU, CPU, TINY)
    assert [r.name for r in rows] == [f"equivalence {a} {e}" for a in ("gru", "lstm", "s4d")
                                      for e in ("vanilla", "PE")]
    assert all(r.verdict == doctor.PASS and r.measured.startswith("0.00e+00 apart")
               and r.expected == "< 0.01 (fp32)" for r in rows)
    monkeypatch.setattr(doctor, "equivalence", lambda *args, **kw: 0.5)
    assert {r.verdict for r in doctor.equivalence_checks(CPU, CPU, TINY)} == {doctor.FAIL}


@pytest.mark.parametrize("arch", registry.names("model"))
def test_fp32_rounding_stays_far_inside_the_fp32_tolerance(arch):
    """fp32 against fp64 bounds what two fp32 devices can differ by from rounding alone."""
    recipe = doctor.small_recipe(arch, "sinusoidal", doctor.EQUIVALENCE_SIZE)
    model, batches = doctor.cpu_start(recipe, doctor.EQUIVALENCE_STEPS)
    single = doctor.trained_parameters(model, recipe, batches, CPU)
    double = doctor.trained_parameters(copy.deepcopy(model).double(), recipe, batches, CPU)
    diff = doctor.parameter_difference(single, double, doctor._start(model))
    assert 0 < diff < doctor.TOLERANCE["fp32"] / 10


def test_parameter_difference_known_answers():
    start = {"w": torch.zeros(3, dtype=torch.float64)}
    moved = {"w": torch.tensor([3.0, 4.0, 0.0], dtype=torch.float64)}
    assert doctor.parameter_difference(moved, moved, start) == 0.0
    assert doctor.parameter_difference(start, moved, start) == 1.0  # one side never moved
    half = {"w": moved["w"] / 2}
    assert doctor.parameter_difference(half, moved, start) == pytest.approx(0.5)
    assert doctor.parameter_difference(start, start, start) == 0.0


def test_determinism_on_the_cpu_is_bit_identical():
    assert doctor.determinism(doctor.small_recipe("lstm", "sinusoidal", TINY), CPU) == \
        (True, 0.0)


def test_determinism_detects_a_nondeterministic_step(monkeypatch):
    real = session.train_step

    def noisy(model, optimizer, batch, clip, count_hits=False):  # as an atomics-based kernel
        with torch.no_grad():
            model.head.bias.add_(1e-6 * torch.randn_like(model.head.bias))
        return real(model, optimizer, batch, clip, count_hits)

    monkeypatch.setattr(session, "train_step", noisy)
    same, largest = doctor.determinism(doctor.small_recipe("gru", "none", TINY), CPU)
    assert not same and largest > 0
    [row] = doctor.determinism_check(CPU, TINY)
    assert row.verdict == doctor.FAIL and row.measured.startswith("differs by")


def resume_recipe():
    return doctor.small_recipe("gru", "sinusoidal", TINY, iterations=4, checkpoint_every=2,
                               log_every=1, keep_checkpoints="all")


@pytest.mark.compat
@pytest.mark.slow  # `perencode train` / `bench` children
def test_resume_across_devices_through_the_run_directory(tmp_path, forked_commands):
    recipe = resume_recipe()
    result = doctor.resume_across(recipe, CPU, CPU, tmp_path)
    assert result == {"resumed_from": 2, "starts": ["cpu", "cpu"], "final_iteration": 4,
                      "metrics_steps": [1, 2, 3, 4], "finite": True, "identical": True}
    assert doctor.resume_ok(result, recipe)
    [row] = doctor.resume_check(recipe, CPU, CPU)
    assert row.verdict == doctor.PASS and "bit-identical" in row.measured


def test_a_resume_on_one_gpu_is_checked_for_bit_identity(monkeypatch, tmp_path):
    """A requeued job resumed on its GPU (cuda -> cuda) is compared bit for bit with the
    uninterrupted run, as CPU -> CPU is (cuDNN's deterministic mode, train.deterministic,
    should make it repeat); across device types it cannot be. Simulated: the `train`
    children run in this process on the CPU whatever device they are given."""
    from perencode.training.loop import train

    asked = []

    def in_process(recipe, run_dir, device):
        asked.append(device.type)
        train(recipe, run_dir, device="cpu", progress=False)

    monkeypatch.setattr(doctor, "train_child", in_process)
    recipe, gpu = resume_recipe(), torch.device("cuda")
    result = doctor.resume_across(recipe, gpu, gpu, tmp_path / "same")
    assert asked == ["cuda", "cuda"] and result["identical"] is True
    assert doctor.resume_ok(result, recipe)
    result = doctor.resume_across(recipe, CPU, gpu, tmp_path / "across")
    assert result["identical"] is None and doctor.resume_ok(result, recipe)


def test_the_cpu_doctor_says_why_it_counts_no_host_syncs(tmp_path, monkeypatch):
    monkeypatch.setattr(doctor, "resume_check", lambda *args: [])
    monkeypatch.setattr(doctor, "determinism_check", lambda *args: [])
    monkeypatch.setattr(doctor, "memory_check", lambda *args: [])
    rows = {r.name: r for r in doctor.run_checks(CPU, ROOT, tmp_path)}
    row = rows["host syncs per step (Fig. 2 GRU, fresh and resumed)"]
    assert row.verdict == (doctor.NO_SYNCS_ON_CPU if not torch.cuda.is_available() else
                           "not run: --device cpu")
    assert row.expected == f"<= {doctor.EXPECTED_SYNCS}, a resume adding none"


@pytest.mark.slow  # `perencode train` / `bench` children
def test_resume_check_fails_when_training_starts_over(monkeypatch, tmp_path, forked_commands):
    """A second start that cannot read the middle checkpoint sets it aside and trains from
    iteration 0: the same numbers on the CPU, but not a resume."""
    real, starts = doctor.train_child, []

    def unreadable_middle(recipe, run_dir, device):
        starts.append(device)
        if len(starts) == 2:
            (run_dir / "checkpoints" / "step-2.pt").write_bytes(b"cut short")
        real(recipe, run_dir, device)

    monkeypatch.setattr(doctor, "train_child", unreadable_middle)
    recipe = resume_recipe()
    result = doctor.resume_across(recipe, CPU, CPU, tmp_path)
    assert result["resumed_from"] == 0 and result["identical"]  # same numbers, not resumed
    assert not doctor.resume_ok(result, recipe)


def test_a_checkpoint_from_another_device_type_resumes_on_a_new_stream(tmp_path, capsys):
    """A CUDA generator's state is 16 bytes (seed and Philox offset), a CPU generator's
    5,056: a checkpoint written on the GPU is emulated by giving its generator such a
    state. It resumes, reproducibly, and says that its batches changed stream."""
    from perencode.store import runs
    from perencode.store.checkpoints import atomic_torch_save
    from perencode.training.loop import train

    recipe = resume_recipe()
    finals = []
    for name in ("a", "b"):
        run = runs.Run(tmp_path / name)
        train(recipe, run.dir, device="cpu", progress=False)
        uninterrupted = runs.load_checkpoint(run.checkpoint_path(4))["model"]
        run.checkpoint_path(4).unlink()
        unfinish(run.dir)
        state = runs.load_checkpoint(run.checkpoint_path(2))
        state["rng"]["generator"] = torch.zeros(16, dtype=torch.uint8)
        atomic_torch_save(run.checkpoint_path(2), state)
        train(recipe, run.dir, device="cpu", progress=False)
        assert "written on another device type" in capsys.readouterr().err
        finals.append(runs.load_checkpoint(run.checkpoint_path(4))["model"])
    assert all(torch.equal(finals[0][n], finals[1][n]) for n in uninterrupted)
    assert not all(torch.equal(finals[0][n], uninterrupted[n]) for n in uninterrupted)


@pytest.mark.slow
def test_memory_ratio_on_the_cpu():
    """The estimate is perencode.training.planning's; the peak is a fresh process's resident-set
    growth over its size after imports; the CPU doctor's shape lands in the range."""
    recipe = doctor.small_recipe("gru", "sinusoidal", doctor.CPU_MEMORY_SIZE)
    estimate, peak, ratio = doctor.memory_ratio(recipe, CPU)
    assert estimate == planning.estimate(recipe, CHUNK_LOGITS).total
    assert ratio == peak / estimate
    low, high = doctor.MEMORY_RATIO["cpu"]
    assert low <= ratio <= high


def test_a_check_that_raises_is_one_failed_row():
    def broken():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    [row] = doctor.guarded("speed", broken)
    assert row.failed and row.measured == \
        "RuntimeError: CUDA error: an illegal memory access was encountered"


@pytest.mark.slow  # `perencode train` / `bench` children
def test_speed_fills_the_estimate_cache_and_prices_each_grid(tmp_path, forked_commands):
    tiny = ["model.hidden_size=8", "model.embed_size=8", "task.length=4",
            "train.batch_size=4", "task.held_out=8"]
    from perencode.config.recipe import load_recipe

    recipe = load_recipe(ROOT / doctor.FIG2_GRU, tiny)
    grids = [ROOT / "recipes/paper/fig02_gru_reverse.toml",
             ROOT / "recipes/paper/fig02_lstm_reverse.toml"]
    rows = doctor.speed_checks(CPU, recipe, grids, tmp_path, grid_overrides=tiny,
                               iterations=2)
    speed, gru, lstm, cache = rows
    ratio = float(speed.measured.rpartition("(x")[2].rstrip(")"))
    assert speed.verdict == (doctor.PASS if ratio <= doctor.SPEED_RATIO else doctor.FAIL)
    # Measured: the GRU's K = 256 PE cell (5 seeds) and the LSTM grid's first cell (5
    # seeds); every other shape extrapolated by FLOPs.
    assert gru.measured.endswith("h (35 of 40 by FLOPs)") and gru.verdict == doctor.INFO
    assert lstm.measured.endswith("h (65 of 70 by FLOPs)")
    entries = json.loads((tmp_path / ".estimates.json").read_text())
    [measured] = entries.values()
    assert sorted(e["arch"] for e in measured.values()) == ["gru", "lstm"]
    assert cache.measured == str(tmp_path / ".estimates.json")


def test_cpu_stack_rows_say_what_is_not_run():
    rows = doctor.stack_checks(CPU)
    assert rows[0].name == "torch" and rows[0].measured == torch.__version__
    assert rows[1].name == "CPU" and rows[1].verdict == doctor.INFO
    assert "torch's vector ISA" in rows[1].measured
    assert rows[2].verdict == doctor.NO_DEVICE
    assert rows[3].name == "kernels for this GPU" and rows[3].verdict == doctor.NO_DEVICE
    assert not doctor.tf32_in_effect(CPU, "gru")


def test_cli_exits_1_on_a_failed_check(monkeypatch):
    rows = [doctor.Finding("equivalence gru PE", "0.5 apart", "< 0.01 (fp32)", doctor.FAIL),
            doctor.Finding("torch", "2.1.1", "2.1.1", doctor.PASS)]
    monkeypatch.setattr(doctor, "run_checks", lambda *args, **kw: rows)
    code, text = run_cli("doctor", "--device", "cpu")
    assert code == 1
    assert "0.5 apart" in text and "doctor: 1 failed, 1 passed, 0 not run" in text


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_doctor_runs_the_command():
    out = subprocess.run(["make", "-n", "--no-print-directory", "doctor", "PERENCODE=perencode",
                          "PERENCODE_DEPS=", "DOCTOR_DEVICE=cuda:1"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "perencode doctor --device cuda:1 --runs runs"


def test_cli_rejects_an_unknown_device():
    code, text = run_cli("doctor", "--device", "tpu")
    assert code == 2 and "--device 'tpu'" in text


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only machine's doctor")
def test_doctor_on_a_cpu_only_machine_passes_and_says_what_it_did_not_run(doctor_on_the_cpu):
    done, runs = doctor_on_the_cpu  # `perencode doctor --device cpu`, its output piped
    code, text = done.returncode, done.stdout + done.stderr
    assert code == 0, text
    summary = text.strip().splitlines()[-1]
    # The torch row passes on the paper's torch (2.1.1, `make test-compat`) and is only
    # information on another: the count of passed rows depends on the installed torch.
    on_paper_torch = torch.__version__.split("+")[0] == doctor.PAPER_TORCH
    # The thread-count row is there only where OMP_NUM_THREADS is set (the tests' processes
    # have it: conftest.subprocess_env).
    passed = 3 + on_paper_torch + ("OMP_NUM_THREADS" in subprocess_env())
    assert summary.startswith(f"doctor: 0 failed, {passed} passed, 7 not run"), summary
    # CUDA stack, kernels for the GPU, equivalence, resume, memory, host syncs, speed
    assert text.count("not run: no CUDA") == 7
    assert not (runs / ".estimates.json").exists()  # speed runs on a GPU only


def test_tf32_follows_the_switch_each_model_registers(monkeypatch):
    """On an Ampere GPU the RNNs (cuDNN) follow cuDNN's TF32 flag, the S4D cuBLAS's."""
    gpu, cudnn, matmul = torch.device("cuda"), torch.backends.cudnn, torch.backends.cuda.matmul
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (8, 0))
    saved = cudnn.allow_tf32, matmul.allow_tf32
    try:
        cudnn.allow_tf32, matmul.allow_tf32 = True, False
        assert [doctor.tf32_in_effect(gpu, a) for a in ("gru", "lstm", "s4d")] == \
            [True, True, False]
        cudnn.allow_tf32, matmul.allow_tf32 = False, True
        assert [doctor.tf32_in_effect(gpu, a) for a in ("gru", "lstm", "s4d")] == \
            [False, False, True]
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (7, 0))
        assert not doctor.tf32_in_effect(gpu, "s4d")  # before Ampere TF32 does not exist
    finally:
        cudnn.allow_tf32, matmul.allow_tf32 = saved


@pytest.mark.parametrize("environ, expected", [
    ({}, None),
    ({"CUDA_VISIBLE_DEVICES": ""}, None),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, None),
    ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, None),
    ({"CUDA_VISIBLE_DEVICES": "0"}, "CUDA_VISIBLE_DEVICES=0"),
    ({"CUDA_VISIBLE_DEVICES": "GPU-5b2c,GPU-77aa"}, "CUDA_VISIBLE_DEVICES=GPU-5b2c,GPU-77aa"),
    ({"SLURM_JOB_GPUS": "0"}, "SLURM_JOB_GPUS=0"),
    ({"SLURM_GPUS_ON_NODE": "0"}, None),
    ({"SLURM_GPUS_ON_NODE": "2"}, "SLURM_GPUS_ON_NODE=2"),
    ({"SLURM_GPUS_PER_NODE": "a100:0"}, None),
    ({"SLURM_GPUS_PER_NODE": "a100:1"}, "SLURM_GPUS_PER_NODE=a100:1"),
    ({"SLURM_JOB_ID": "17", "SLURM_CPUS_ON_NODE": "4"}, None),  # a CPU job
])
def test_a_gpu_is_expected_where_slurm_allocated_one_or_devices_are_visible(environ, expected):
    assert doctor.gpu_expected(environ) == expected


def test_a_gpu_expected_and_missing_fails_the_doctor_and_names_the_fix():
    [row] = doctor.gpu_expected_check(CPU, {"SLURM_JOB_GPUS": "0"}, available=False)
    assert row.failed and "SLURM_JOB_GPUS=0" in row.measured
    assert "--nv" in row.expected
    # Nothing expected: no row, and the CPU doctor stays green.
    assert doctor.gpu_expected_check(CPU, {}, available=False) == []
    assert doctor.gpu_expected_check(CPU, {"CUDA_VISIBLE_DEVICES": ""}, available=False) == []
    # Expected and there: a pass on CUDA; --device cpu on a GPU node is the user's choice.
    [row] = doctor.gpu_expected_check(torch.device("cuda"), {"CUDA_VISIBLE_DEVICES": "0"},
                                      available=True)
    assert row.verdict == doctor.PASS
    [row] = doctor.gpu_expected_check(CPU, {"CUDA_VISIBLE_DEVICES": "0"}, available=True)
    assert row.verdict == doctor.INFO


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a usable GPU")
def test_cli_exits_1_where_a_gpu_was_allocated_but_none_is_usable(monkeypatch):
    """What `apptainer exec perencode.sif perencode doctor` gives in a GPU job without --nv:
    the allocation is in the environment, torch sees no device. The real run_checks, its
    training checks (tested above) stubbed out to keep this fast."""
    for name in ("determinism_check", "resume_check", "memory_check"):
        monkeypatch.setattr(doctor, name, lambda *a, **k: [])
    for name in doctor.GPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    code, text = run_cli("doctor", "--device", "auto")
    assert code == 0 and "doctor: 0 failed" in text, text
    monkeypatch.setenv("SLURM_JOB_GPUS", "0")
    code, text = run_cli("doctor", "--device", "auto")
    assert code == 1, text
    assert "SLURM_JOB_GPUS=0" in text and "doctor: 1 failed" in text
    monkeypatch.setenv("SLURM_JOB_GPUS", "")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    code, text = run_cli("doctor", "--device", "cpu")
    assert code == 1 and "doctor: 1 failed" in text
