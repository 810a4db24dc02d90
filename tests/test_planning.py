"""perencode.training.planning: the memory a recipe needs, checked before anything is written."""

import itertools
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, tiny_overrides
from test_device import no_slurm, simulated_cgroup

from perencode.common import device, host
from perencode.common.errors import UserError
from perencode.config.recipe import load_recipe, validate
from perencode.kinds.models import build_model
from perencode.kinds.tasks import make
from perencode.kinds.tasks import shapes as make_shapes
from perencode.training import planning, session
from perencode.training.session import build

RECIPE = ROOT / "recipes" / "gru_vocab256.toml"
TASKS = {
    "reverse": {}, "sort": {}, "reverse_add": {}, "predecessor": {},
    "dual_frequency": {"held_out_per_cell": 2}, "variable_length": {"min_length": 3},
}


def recipe(arch="gru", task="reverse", kind="sinusoidal", mode="concat", **train_cfg):
    t = {"name": task, "vocab_size": 16, "length": 6, **TASKS[task]}
    if task != "dual_frequency":
        t["held_out"] = 8
    return validate({"task": t, "encoding": {"kind": kind, "mode": mode},
                     "model": {"arch": arch, "hidden_size": 12, "embed_size": 8,
                               **({"d_state": 6} if arch == "s4d" else {})},
                     "train": train_cfg}, "test")


@pytest.mark.parametrize("arch", ["gru", "lstm", "s4d"])
def test_parameter_count_is_exact(arch):
    for task, (kind, mode) in itertools.product(TASKS, [
            ("none", "concat"), ("sinusoidal", "concat"), ("sinusoidal", "add"),
            ("random", "concat"), ("learnable", "concat"), ("learnable", "add"),
            ("duplicate", "concat")]):
        r = recipe(arch, task, kind, mode)
        model = build_model(r, make(r.task, 0).shapes)
        assert planning.parameter_count(r) == sum(p.numel() for p in model.parameters()), \
            (task, kind, mode)
        assert planning.buffer_bytes(r) == sum(b.numel() * 4 for b in model.buffers())
        assert planning.estimate(r, session.CHUNK_LOGITS).state_bytes == \
            16 * sum(p.numel() for p in model.parameters())


def saved_bytes(r) -> int:
    """Bytes autograd keeps for the backward pass of one training step (parameters aside)."""
    task, model = build(r, torch.device("cpu"))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    batch = task.sample(r.train.batch_size, session.training_generator(r, torch.device("cpu")))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        session.loss_fn(model, batch)
    return sum(saved.values())


@pytest.mark.parametrize("arch", ["gru", "lstm", "s4d"])
@pytest.mark.parametrize("task", ["reverse", "predecessor"])
def test_activation_estimate_is_near_what_autograd_keeps(arch, task):
    r = validate({"task": {"name": task, "vocab_size": 64, "length": 32, "held_out": 8},
                  "model": {"arch": arch, "hidden_size": 128, "embed_size": 64,
                            **({"d_state": 16} if arch == "s4d" else {})},
                  "train": {"batch_size": 32, "eval_batch_size": 8}}, "test")
    ratio = planning.estimate(r, session.CHUNK_LOGITS).activation_bytes / saved_bytes(r)
    assert 0.75 < ratio < 2.0, ratio


def test_the_head_is_counted_in_chunks_as_the_loss_computes_it():
    r = recipe(batch_size=8)
    chunk = session.CHUNK_LOGITS
    assert planning._head(1 << 20, 1 << 12, chunk, 3) == 3 * chunk
    assert planning._head(1 << 20, 1 << 12, None, 2) == 2 << 32
    assert planning._head(8 * 6, 16, chunk, 3) == 3 * 8 * 6 * 16
    # Evaluation scores the held-out rows in batches of eval_batch_size, without gradients.
    small, large = (planning.estimate(recipe(batch_size=1, eval_batch_size=n), chunk)
                    for n in (1, 8))
    assert large.activation_bytes > small.activation_bytes
    whole = planning.estimate(r, chunk)
    assert whole.total > whole.state_bytes


def test_train_honours_the_cgroup_and_slurm_memory_limits(cli, tmp_path, monkeypatch):
    """A recipe that fits the free RAM but not this process's cgroup limit or its SLURM
    allocation (--mem) is refused, naming the limit."""
    no_slurm(monkeypatch)
    overrides = tiny_overrides("train.iterations=5", "train.batch_size=64")
    need = planning.estimate(load_recipe(RECIPE, overrides[1::2]), session.CHUNK_LOGITS).total
    available = host.memory_available()
    assert available and 1 << 20 < need < available[0] // 2  # fits the free RAM
    args = ["train", RECIPE, "--device", "cpu", "--no-progress", *overrides]
    simulated_cgroup(monkeypatch, tmp_path, v2={"/job": need - 1})
    code, text = cli(*args, "--run-dir", tmp_path / "a")
    assert code == 2 and len(text.strip().splitlines()) == 1, text
    assert "not enough memory for this recipe" in text, text
    assert "of this process's cgroup memory limit; lower" in text, text
    simulated_cgroup(monkeypatch, tmp_path, v2={"/job": "max"})
    monkeypatch.setenv("SLURM_MEM_PER_NODE", str(need >> 20))  # MB, less than `need`
    code, text = cli(*args, "--run-dir", tmp_path / "b")
    assert code == 2 and "of the SLURM job's memory (--mem); lower" in text, text
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    monkeypatch.setenv("SLURM_MEM_PER_NODE", str((need >> 20) + 1))
    code, text = cli(*args, "--run-dir", tmp_path / "c")
    assert code == 0, text


def test_a_recipe_that_cannot_fit_is_refused_before_anything_is_written(cli, tmp_path):
    out = tmp_path / "run"
    t0 = time.perf_counter()
    code, text = cli("train", RECIPE, "--run-dir", out, "--device", "cpu", "--no-progress",
                     "--set", "model.hidden_size=65536")
    seconds = time.perf_counter() - t0
    assert code == 2 and "not enough memory for this recipe" in text, text
    assert "model.hidden_size (65536)" in text and "--force" in text
    assert len(text.strip().splitlines()) == 1, text
    assert seconds < 1.0, seconds
    assert not out.exists()


def test_force_skips_the_check(cli, tmp_path, monkeypatch):
    args = ["train", RECIPE, "--device", "cpu", "--no-progress",
            *tiny_overrides("train.iterations=5", "task.vocab_size=8", "task.length=6")]
    monkeypatch.setattr(planning, "device_memory", lambda device: (1 << 10, "a toy"))
    code, text = cli(*args, "--run-dir", tmp_path / "a")
    assert code == 2 and "more than the 0.0 GiB of a toy" in text and not (tmp_path / "a").exists()
    code, text = cli(*args, "--run-dir", tmp_path / "b", "--force")
    assert code == 0, text
    assert (tmp_path / "b" / "eval.json").exists()


def test_check_raises_a_user_error_naming_the_fields(monkeypatch):
    monkeypatch.setattr(planning, "device_memory", lambda device: (1 << 10, "x"))
    with pytest.raises(UserError, match=r"train.batch_size \(8\)"):
        planning.check_memory(recipe(batch_size=8), torch.device("cpu"), session.CHUNK_LOGITS)
    monkeypatch.setattr(planning, "device_memory", lambda device: None)  # unknown: no check
    assert planning.check_memory(recipe(batch_size=8), torch.device("cpu"),
                                  session.CHUNK_LOGITS).total > 0


def test_the_heads_backward_is_counted_at_its_peak():
    """In the backward pass the head holds three [N, K] tensors at once (the saved
    log-softmax, its gradient, the logits' gradient), a chunk of session.CHUNK_LOGITS each
    for the language model: 12 GiB of the estimate, where the forward's two are 8 GiB."""
    r = load_recipe(ROOT / "recipes" / "lstm_wikitext103.toml")
    s, m, B = make_shapes(r.task), r.model, r.train.batch_size
    assert B * s.outputs * s.num_classes > session.CHUNK_LOGITS  # chunked
    per_step_in = m.embed_size  # vanilla: no encoding input
    train = B * s.steps * (per_step_in + planning.saved_per_step(m.arch) * m.hidden_size)
    head = 3 * session.CHUNK_LOGITS
    assert planning.FLOAT * head == 12 << 30
    assert planning.estimate(r, session.CHUNK_LOGITS).activation_bytes == \
        planning.FLOAT * (train + head)


def test_the_k16384_lstm_peaks_at_its_held_out_evaluation():
    """The final evaluation scores 1,024 held-out rows at once, unchunked: the logits and
    their log-softmax, [1024, 64, 16384] each, larger than a training step's head."""
    r = load_recipe(ROOT / "recipes" / "lstm_vocab16384.toml")
    s, tc = make_shapes(r.task), r.train
    evaluation_head = 2 * tc.eval_batch_size * s.outputs * s.num_classes
    training_head = 3 * tc.batch_size * s.outputs * s.num_classes
    assert evaluation_head > training_head
    need = planning.estimate(r, session.CHUNK_LOGITS)
    assert need.activation_bytes >= planning.FLOAT * evaluation_head == 8 << 30
    assert 9 << 30 < need.total < 10 << 30


def simulated_gpu(monkeypatch, free: int, total: int) -> torch.device:
    """A CUDA device as torch reports it, on a machine without one."""
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index=None: (free, total))
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(total_memory=total, name="Fake GPU 16GB"))
    return torch.device("cuda")


def test_runs_sharing_a_gpu_are_checked_against_its_free_memory(monkeypatch):
    """The first run a sweep starts on a GPU counts every run that will share it (its
    --runs-per-gpu) against the memory free there; a run alone against what others left."""
    r = recipe(batch_size=8)
    need = planning.estimate(r, session.CHUNK_LOGITS).total
    gpu = simulated_gpu(monkeypatch, free=6 * need, total=100 * need)
    assert planning.check_memory(r, gpu, session.CHUNK_LOGITS, runs_sharing=6).total == need
    gpu = simulated_gpu(monkeypatch, free=6 * need - 1, total=100 * need)
    with pytest.raises(UserError) as refused:
        planning.check_memory(r, gpu, session.CHUNK_LOGITS, runs_sharing=6)
    text = str(refused.value)
    assert "6 runs sharing it (--runs-per-gpu) need about" in text and \
        "lower --runs-per-gpu" in text and "of cuda (Fake GPU 16GB: free of its" in text, text
    assert planning.check_memory(r, gpu, session.CHUNK_LOGITS, runs_sharing=5).total == need
    # Another process holds the card: its total would fit, what is free does not.
    gpu = simulated_gpu(monkeypatch, free=need - 1, total=100 * need)
    with pytest.raises(UserError, match="not enough memory"):
        planning.check_memory(r, gpu, session.CHUNK_LOGITS)


def test_train_counts_the_runs_a_sweep_says_will_share_its_gpu(monkeypatch):
    monkeypatch.delenv(device.RUNS_SHARING_ENV, raising=False)
    assert device.runs_sharing() == 1
    for value, expected in (("6", 6), ("1", 1), ("0", 1), ("six", 1)):
        monkeypatch.setenv(device.RUNS_SHARING_ENV, value)
        assert device.runs_sharing() == expected


def test_a_sweep_tells_the_first_run_on_each_gpu_how_many_will_share_it(monkeypatch, tmp_path):
    """The first run started on an idle GPU checks its memory for the --runs-per-gpu runs
    that will share it (the GPU's free memory still holds all of theirs); a run started
    beside runs already there counts itself only (their memory is no longer free).
    Simulated: two GPUs, workers that finish at once."""
    from perencode.commands.sweep import local
    from perencode.commands.sweep.cells import PlannedRun, RunState

    started = []

    class Finished:
        def poll(self):
            return 0

    class Log:
        def close(self):
            pass

    def launch(command, run_dir, env):
        started.append((env["CUDA_VISIBLE_DEVICES"], env[device.RUNS_SHARING_ENV]))
        return Finished(), Log()

    monkeypatch.setattr(local, "visible_gpus", lambda name: ["0", "1"])
    monkeypatch.setattr(local, "live_holder", lambda run_dir: None)
    monkeypatch.setattr(local, "launch", launch)
    monkeypatch.setattr(local, "claim", lambda run: True)  # no cells to write: simulated
    monkeypatch.setattr(local.time, "sleep", lambda seconds: None)
    planned = [PlannedRun(cell=None, dir=tmp_path / str(i), state=RunState.NEW,  # type: ignore[arg-type]
                          commands=[["train"]]) for i in range(7)]
    board = SimpleNamespace(update=lambda: None)
    assert local.run_local(planned, board, jobs=6, runs_per_gpu=3, device="cuda")  # type: ignore[arg-type]
    assert started == [("0", "3"), ("1", "3"), ("0", "1"), ("1", "1"), ("0", "1"), ("1", "1"),
                       ("0", "1")]  # the 7th alone, when the first six are done
