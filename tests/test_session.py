"""perencode.training.session: the one owner of the training step (the schedule it applies, its
checkpoint state round trip, the scoring `eval` and `train` share), and no other module
assembling a step of its own."""

from __future__ import annotations

import ast
import io

import torch
from conftest import ROOT, TINY, fitting

from perencode.config.recipe import load_recipe
from perencode.store import runs
from perencode.training.loop import train
from perencode.training.session import Session, learning_rate

CPU = torch.device("cpu")


def tiny_recipe(*extra: str):
    return load_recipe(ROOT / "recipes/gru_vocab256.toml", fitting([
        *TINY, "task.vocab_size=8", "task.length=4", "train.iterations=6",
        "train.checkpoint_every=3", "optim.warmup=2", *extra]))


def test_each_step_runs_at_the_schedules_rate_and_counts_itself():
    recipe = tiny_recipe()
    session = Session(recipe, CPU)
    rates = []
    for k in range(1, 5):
        step = session.step(count_hits=k % 2 == 0)
        rates.append(step.lr)
        assert session.iteration == k
        assert step.lr == learning_rate(k - 1, recipe.optim, recipe.train.iterations)
        assert session.optimizer.param_groups[0]["lr"] == step.lr
        assert (step.hits is not None) == (k % 2 == 0)
        assert step.norm is not None and bool(torch.isfinite(step.loss))
    # Warm-up 2: iteration 1 at 0, the peak first at iteration 3, then the cosine's descent.
    assert rates[0] == 0.0 and rates[2] == recipe.optim.lr and 0 < rates[3] < rates[2]


def test_a_session_loaded_from_its_state_goes_on_bit_identically(tmp_path):
    """state() survives a weights_only load; a new session of the recipe that loads it
    takes the same next steps (batches, losses, weights) as the one that wrote it."""
    recipe = tiny_recipe()
    first = Session(recipe, CPU)
    for _ in range(3):
        first.step()
    path = tmp_path / "state.pt"
    torch.save(first.state(), path)
    state = torch.load(path, weights_only=True)
    second = Session(recipe, CPU)  # at iteration 0: other weights, an earlier stream
    assert not torch.equal(second.model.head.weight, first.model.head.weight)
    second.load(path, state)
    assert second.iteration == 3
    for _ in range(2):
        a, b = first.step(), second.step()
        assert a.lr == b.lr and torch.equal(a.batch.sequences, b.batch.sequences)
        assert torch.equal(a.loss, b.loss)
    for (name, p), q in zip(first.model.named_parameters(), second.model.parameters()):
        assert torch.equal(p, q), name


def test_a_run_scored_from_its_checkpoint_is_what_train_wrote(tmp_path):
    recipe = tiny_recipe()
    written = train(recipe, tmp_path / "run", device="cpu", progress=False)
    run = runs.Run(tmp_path / "run")
    session = Session.of_checkpoint(run.recipe, CPU, *run.load())
    assert session.iteration == recipe.train.iterations
    assert {**session.evaluate(), "iteration": session.iteration} == written
    # Scoring makes no optimizer (eval and stability never step); a step would make one.
    assert "optimizer" not in vars(session)
    assert session.optimizer.param_groups[0]["params"] == list(session.model.parameters())


def test_a_metric_that_is_not_finite_scores_nothing(monkeypatch):
    """A task's metric of NaN or infinity (a held-out loss that overflowed) is a divergence
    at evaluation, named, as non-finite logits are: no number is scored."""
    import pytest

    from perencode.training.session import NotFinite

    session = Session(tiny_recipe(), CPU)
    session.step()
    for value in (float("nan"), float("inf")):
        monkeypatch.setattr(session.task, "evaluate",
                            lambda logits, batch_size, value=value, **options: {
                                "token_accuracy": 0.5, "dl_distance": value})
        with pytest.raises(NotFinite) as raised:
            session.evaluate()
        assert (raised.value.iteration, raised.value.what) == (1, f"dl_distance is {value}")
        assert str(raised.value) == (f"diverged at evaluation after iteration 1: dl_distance is "
                                     f"{value}; nothing is scored")


def test_no_module_but_the_session_assembles_a_step():
    """Models, optimizers and steps come from a Session everywhere else: nothing outside
    perencode/training/session.py calls the step or the (task, model) builder itself."""
    own = {"train_step", "build"}
    offenders = []
    for path in sorted((ROOT / "perencode").rglob("*.py")):
        if path.name == "session.py" and path.parent.name == "perencode":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "perencode.training.session":
                offenders += [f"{path.name}: {a.name}" for a in node.names if a.name in own]
            if isinstance(node, ast.Attribute) and node.attr in own and \
                    isinstance(node.value, ast.Name) and node.value.id == "session":
                offenders.append(f"{path.name}: session.{node.attr}")
    assert offenders == []


class OnTheGpu(torch.Tensor):
    """A CPU tensor that reports a CUDA device: a checkpoint's tensor as
    torch.load(map_location="cuda") leaves it, on a machine without one (Session.load's CPU
    twin). Moved anywhere, it is an ordinary tensor again."""

    @property
    def device(self):  # type: ignore[override]
        return torch.device("cuda", 0)

    def to(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor).to(*args, **kwargs)

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor).cpu(*args, **kwargs)


def test_a_resume_keeps_adams_step_counters_on_the_cpu():
    """`perencode train` loads a checkpoint mapped onto the training device. torch's Adam
    keeps `step` on the CPU (read back every step for the bias correction) and its
    load_state_dict leaves a loaded `step` where it finds it: on a GPU that was a host sync
    per parameter per step. Session.load puts them where a fresh Adam has them, and the
    resumed run still ends bit-identical to the uninterrupted one."""
    recipe = tiny_recipe()
    uninterrupted = Session(recipe, CPU)
    for _ in range(3):
        uninterrupted.step()
    buffer = io.BytesIO()
    torch.save(uninterrupted.state(), buffer)  # a checkpoint, read back as train reads it
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    for saved in state["optimizer"]["state"].values():
        saved["step"] = saved["step"].clone().as_subclass(OnTheGpu)
        assert saved["step"].device.type == "cuda"
    resumed = Session(recipe, CPU)
    resumed.load("step-3.pt", state)
    steps = [s["step"] for s in resumed.optimizer.state.values()]
    assert len(steps) == len(list(resumed.model.parameters()))
    assert {(type(t), t.device.type, float(t)) for t in steps} == {(torch.Tensor, "cpu", 3.0)}
    for _ in range(3):
        uninterrupted.step()
        resumed.step()
    for (name, a), b in zip(uninterrupted.model.state_dict().items(),
                            resumed.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_checkpoint_records_its_device_model_and_a_resume_on_another_gpu_says_so(
        monkeypatch, capsys):
    """CUDA's generator spreads a draw over the multiprocessors: the same state draws other
    batches on another GPU model. A checkpoint names its model; a resume on another one says
    so in one line (simulated: the checkpoint's record edited, this 'GPU' patched in)."""
    import perencode.store.checkpoints as checkpoints_module

    recipe = tiny_recipe()
    first = Session(recipe, CPU)
    first.step()
    state = first.state()
    assert state["device_model"] == "cpu"
    resumed = Session(recipe, CPU)
    resumed.device = torch.device("cuda")  # the session's own tensors stay on the CPU
    monkeypatch.setattr(checkpoints_module, "device_model",
                        lambda device: "NVIDIA H100 80GB HBM3 (132 multiprocessors)")
    resumed.load("step-1.pt", {**state, "device_model": "NVIDIA H100 80GB HBM3 (132 "
                                                        "multiprocessors)"})
    assert capsys.readouterr().err == ""  # the same model: nothing to say
    resumed.load("step-1.pt", {**state, "device_model": "NVIDIA A100-SXM4-80GB (108 "
                                                        "multiprocessors)"})
    out = " ".join(capsys.readouterr().err.split())  # one line, however the terminal wraps
    assert out.count("note:") == 1, out
    assert "step-1.pt: written on NVIDIA A100-SXM4-80GB (108 multiprocessors), resumed on " \
           "NVIDIA H100 80GB HBM3 (132 multiprocessors)" in out and "iteration 1" in out
    resumed.load("step-1.pt", state)  # from the CPU: checkpoints.restore_generator's note only
    assert "written on" not in capsys.readouterr().err


def test_train_deterministic_sets_cudnns_mode_for_the_session():
    """train.deterministic (default on, as the authors' training template sets
    cudnn.deterministic) is applied by every session, so bench and doctor run the step
    train runs."""
    before = torch.backends.cudnn.deterministic
    try:
        assert tiny_recipe().train.deterministic is True
        Session(tiny_recipe(), CPU)
        assert torch.backends.cudnn.deterministic is True
        Session(tiny_recipe("train.deterministic=false"), CPU)
        assert torch.backends.cudnn.deterministic is False
        # Recorded in recipe.toml; a run's identity (and a stored fingerprint) is the same
        # with either: it picks kernels, not what they compute.
        assert "deterministic = false" in tiny_recipe("train.deterministic=false").to_toml()
        assert tiny_recipe().identity() == tiny_recipe("train.deterministic=false").identity()
    finally:
        torch.backends.cudnn.deterministic = before
