"""Registries (perencode.config.registry): a study adds a task, an encoding and a model from its own
file, touching nothing under perencode/, and the new kinds go through the whole path: the
recipe and its schema, training and evaluation through the CLI, the figures and verify.
Kinds no registration knows keep their raw names in the figures and are never dropped."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import ClassVar, Literal

import pytest
import torch
from conftest import assert_scores_consistent, run_cli, tiny_overrides
from torch import Tensor, nn

from perencode.analysis import plots
from perencode.analysis.gradient_stability import jacobians
from perencode.common.errors import UserError
from perencode.config import registry as kinds
from perencode.config.recipe import ModelConfig, Recipe, validate
from perencode.config.schema import schema_rows
from perencode.kinds.models import SequenceModel, Shapes, build_model
from perencode.kinds.tasks.base import HeldOutConfig
from perencode.kinds.tasks.reverse import ReverseTask

pytestmark = pytest.mark.forked_children  # the sweep's children as forks (tests/forked.py)

# -- the study's own kinds: all of it lives in this file ---------------------------------------


class CopyTask(ReverseTask):
    """Reverse's layout, but the model repeats the input in order."""

    def transform(self, rows: Tensor) -> Tensor:
        return rows  # [B, L]


def ramp(num_positions: int, dim: int) -> Tensor:
    """Position t as t / (T - 1) in every dimension, scaled to norm <= 1: [T, dim]."""
    t = torch.linspace(0.0, 1.0, num_positions)[:, None]  # [T, 1]
    return t.expand(num_positions, dim) / math.sqrt(dim)


class ElmanConfig(ModelConfig):
    """The [model] table of the Elman RNN: the common sizes and its own nonlinearity."""

    nonlinearity: Literal["tanh", "relu"] = "tanh"


class ElmanModel(SequenceModel):
    """The shared front end (embedding + encoding) -> single-layer nn.RNN -> head: the
    model contract and nothing else."""

    arch = "elman"

    def __init__(self, cfg: ElmanConfig, encoding, shapes: Shapes):
        super().__init__(shapes, cfg.embed_size, encoding)
        self.rnn = nn.RNN(self.in_features, cfg.hidden_size, nonlinearity=cfg.nonlinearity,
                          batch_first=True)
        self.head = nn.Linear(cfg.hidden_size, shapes.num_classes)

    def forward(self, tokens: Tensor) -> Tensor:
        out, _ = self.rnn(self.cell_inputs(tokens))  # [B, T, H]
        return out


@pytest.fixture(scope="module")
def registered():
    """The three registrations a study makes, removed again after this module."""
    kinds.register_task(kinds.TaskKind("copy", CopyTask, label="Copy", config=HeldOutConfig,
                                       summary="repeat the input in order"))
    kinds.register_encoding(kinds.EncodingKind("ramp", label="Ramp PE",
                                               summary="t / (T - 1)", table=ramp))
    kinds.register_model(kinds.ModelKind("elman", ElmanModel, label="Elman RNN",
                                         config=ElmanConfig))
    yield
    for kind, name in (("task", "copy"), ("encoding", "ramp"), ("model", "elman")):
        del kinds.registry(kind)[name]


RECIPE = """description = "A study's own task, encoding and model."
[task]
name = "copy"
vocab_size = 4
length = 3
held_out = 8
[model]
arch = "elman"
nonlinearity = "tanh"
[encoding]
kind = "ramp"
[optim]
lr = 1e-2
warmup = 10
[train]
iterations = 150
checkpoint_every = 150
log_every = 50
batch_size = 32
"""

CLAIMS = """[[claim]]
id = "copy-learnt"
statement = "The Elman RNN with the ramp encoding learns to copy three tokens"
where = { "task.name" = "copy", "encoding.kind" = "ramp", "model.arch" = "elman" }
metric = "token_accuracy"
test = "threshold"
op = ">"
value = 0.5
"""


@pytest.fixture(scope="module")
def study(registered, tmp_path_factory):
    """Two seeds of the study's recipe trained and evaluated through the CLI, then its
    figures and its claim: (root, figures folder, verify exit code)."""
    root = tmp_path_factory.mktemp("study")
    recipe = root / "copy_ramp_elman.toml"
    recipe.write_text(RECIPE)
    for seed in (111, 222):
        run = root / "runs" / f"seed{seed}"
        code, text = run_cli("train", recipe, "--out", run, "--device", "cpu", "--no-progress",
                             *tiny_overrides(f"train.seed={seed}", "model.hidden_size=32",
                                             "train.batch_size=32", "task.held_out=8"))
        assert code == 0, text
        code, text = run_cli("eval", run, "--device", "cpu")
        assert code == 0, text
    code, text = run_cli("figures", root / "runs", "--out", root / "figures")
    assert code == 0, text
    (root / "claims.toml").write_text(CLAIMS)
    code, text = run_cli("verify", root / "runs", "--claims", root / "claims.toml", "--out",
                         root / "figures")
    return root, root / "figures", code


def test_the_new_kinds_are_allowed_values_of_the_recipe(registered):
    r = validate({"task": {"name": "copy", "vocab_size": 4, "length": 3, "held_out": 8},
                  "model": {"arch": "elman"}, "encoding": {"kind": "ramp"}}, "r.toml")
    assert (r.task.name, r.model.arch, r.encoding.kind) == ("copy", "elman", "ramp")
    rows = {key: (kind, description) for key, kind, _, description in schema_rows()}
    assert "'copy'" in rows["task.name"][0] and "copy = repeat the input in order" in \
        rows["task.name"][1]
    assert "'ramp'" in rows["encoding.kind"][0] and "ramp = t / (T - 1)" in \
        rows["encoding.kind"][1]
    assert "'elman'" in rows["model.arch"][0] and "elman = Elman RNN" in rows["model.arch"][1]
    assert rows["model.nonlinearity"] == ("'tanh' | 'relu'", "(model.arch = elman only)")


def test_a_kinds_own_options_live_in_its_config_class(registered):
    r = validate({"model": {"arch": "elman", "nonlinearity": "relu"}}, "r.toml")
    assert type(r.model) is ElmanConfig and r.model.nonlinearity == "relu"
    assert r.to_dict()["model"] == {"arch": "elman", "hidden_size": 512, "embed_size": 512,
                                    "nonlinearity": "relu"}
    with pytest.raises(UserError, match="r.toml: model.nonlinearity: not an option of "
                                        "model.arch = 'gru' \\(only of 'elman'\\)"):
        validate({"model": {"arch": "gru", "nonlinearity": "relu"}}, "r.toml")
    with pytest.raises(UserError, match="model.nonlinearity: Input should be 'tanh' or 'relu'"):
        validate({"model": {"arch": "elman", "nonlinearity": "sigmoid"}}, "r.toml")
    # A run directory written with the option, read where the study is not imported.
    kept = validate({"model": {"arch": "nobody", "nonlinearity": "relu"}}, "r.toml",
                    any_kind=True)
    assert kept.to_dict()["model"]["nonlinearity"] == "relu"


def test_the_registered_builders_are_the_ones_used(registered):
    recipe = Recipe.model_validate({"task": {"name": "copy", "vocab_size": 4, "length": 3,
                                             "held_out": 8},
                                    "model": {"arch": "elman", "hidden_size": 8,
                                              "embed_size": 4},
                                    "encoding": {"kind": "ramp"}})
    task = kinds.get("task", "copy").make(recipe.task, 111, "cpu")
    batch = task.sample(5, torch.Generator().manual_seed(0))
    assert torch.equal(batch.output_targets, batch.sequences)  # copy, not reverse
    model = build_model(recipe, task.shapes)
    assert isinstance(model, ElmanModel) and model.rnn.input_size == 8  # ramp concatenated
    torch.testing.assert_close(model.encoding.table, ramp(6, 4))


@pytest.mark.slow  # with the next: the `study` fixture trains and evaluates two runs
def test_a_study_trains_evaluates_draws_and_verifies_its_kinds(study):
    root, figures_dir, verify_code = study
    for seed in (111, 222):
        result = json.loads((root / "runs" / f"seed{seed}" / "eval.json").read_text())
        assert (result["task"], result["arch"], result["encoding"]) == ("copy", "elman", "ramp")
        assert result["n_sequences"] == 8 and result["n_tokens"] == 24
        assert_scores_consistent(result)
    table = (figures_dir / "results.csv").read_text()
    assert table.count("copy") == 2 and table.count("ramp") == 2
    # No paper figure draws this task: a figure of its own does, under the study's labels.
    assert (figures_dir / "other_copy_vocabulary.png").stat().st_size > 0
    report = json.loads((figures_dir / "verify.json").read_text())["results"]
    # Two seeds do not decide a threshold at 95% (one-sided t on 1 df, alpha halved for an
    # accuracy): inconclusive, with the seeds that would decide it; it does not fail.
    assert [(r["id"], r["verdict"]) for r in report] == [("copy-learnt", "inconclusive")]
    assert "n = 2" in report[0]["method"] and report[0]["seeds_to_decide"]
    assert verify_code == 0


@pytest.mark.slow
def test_runs_of_kinds_nobody_registered_are_still_drawn_and_verified(study, monkeypatch,
                                                                      tmp_path):
    """`perencode figures` / `verify` run without the study's module: its runs are results
    all the same, under their raw names."""
    root, _, _ = study
    for registry, name in ((kinds.TASKS, "copy"), (kinds.ENCODINGS, "ramp"),
                           (kinds.MODELS, "elman")):
        monkeypatch.delitem(registry, name)
    code, text = run_cli("figures", root / "runs", "--out", tmp_path)
    assert code == 0, text
    assert (tmp_path / "other_copy_vocabulary.png").stat().st_size > 0
    code, text = run_cli("verify", root / "runs", "--claims", root / "claims.toml", "--out",
                         tmp_path)
    assert code == 0, text
    report = json.loads((tmp_path / "verify.json").read_text())["results"]
    assert [(r["id"], r["verdict"]) for r in report] == [("copy-learnt", "inconclusive")]
    # Training or evaluating one needs the kind's code: refused in one line naming the
    # module the run's plugins.json says registered it (this file) and how to pass it.
    code, text = run_cli("eval", root / "runs" / "seed111", "--device", "cpu")
    text = text.replace("\n", "")
    assert code == 2 and "the run needs the plugin test_kinds" in text
    assert "for task.name = 'copy'" in text and f"--plugin {Path(__file__).resolve()}" in text


def test_unregistered_kinds_keep_their_raw_names_and_come_last():
    assert plots._label("encoding.kind", "sinusoidal") == "Position-Encoded"
    assert plots._label("encoding.kind", "nowhere") == "nowhere"
    assert plots._label("model.arch", "nowhere") == "nowhere"
    assert plots._label("task.name", "nowhere") == "nowhere"
    assert plots._order("encoding.kind", ["zeta", "sinusoidal", "alpha", "none", "zeta"]) == [
        "none", "sinusoidal", "alpha", "zeta"]
    assert kinds.order("model", ["s4d", "mamba", "gru"]) == ["gru", "s4d", "mamba"]
    # Any kind field the same way, from kinds.FIELDS; another column as a reader expects it.
    assert plots._order("task.name", ["sort", "copy", "reverse"]) == ["reverse", "sort", "copy"]
    assert plots._order("task.vocab_size", [128, 32, 64, 32]) == [32, 64, 128]
    assert [kinds.of_field(f) for f in ("task.name", "model.arch", "encoding.kind",
                                        "task.length")] == ["task", "model", "encoding", None]


def test_an_unknown_name_is_one_line_naming_the_registered_ones(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text('[encoding]\nkind = "spiral"\n')
    code, text = run_cli("train", path, "--out", tmp_path / "run")
    assert code == 2
    assert "encoding.kind: Input should be 'none', 'sinusoidal', 'random', 'learnable'" in \
        text.replace("\n", "")
    assert "(got 'spiral')" in text.replace("\n", "")


def test_a_model_without_a_stability_hook_is_refused_in_one_line(registered):
    with pytest.raises(UserError, match="model.arch = 'elman': no gradient-stability hook "
                                        "is registered for it \\(models with one: gru, lstm, "
                                        "s4d\\)"):
        jacobians(SimpleNamespace(arch="elman"), torch.zeros(1, 2, dtype=torch.long), 0)


def test_bench_refuses_a_baseline_for_a_model_it_has_no_reference_loop_for(registered,
                                                                          tmp_path):
    recipe = tmp_path / "study.toml"
    recipe.write_text(RECIPE.replace('name = "copy"', 'name = "reverse"'))
    code, text = run_cli("bench", recipe, "--baseline", "--iterations", 1, "--device", "cpu")
    assert code == 2
    assert "--baseline: the bare reference loop exists for gru and lstm" in \
        text.replace("\n", "")


def test_the_tag_fields_have_one_record():
    """kinds.TAGS names each section's tag field; the sections' TAG and the fields recipes
    spell (kinds.FIELDS) are read from it, and a section lacking its tag cannot be made."""
    from perencode.config.recipe import EncodingConfig, TaskConfig
    from perencode.config.sections import KindConfig

    assert kinds.TAGS == {"task": "name", "model": "arch", "encoding": "kind"}
    assert [c.TAG for c in (TaskConfig, ModelConfig, EncodingConfig, ElmanConfig)] == \
        ["name", "arch", "kind", "arch"]
    assert kinds.FIELDS == {"task": "task.name", "model": "model.arch",
                            "encoding": "encoding.kind"}
    with pytest.raises(TypeError, match="Untagged: a \\[model\\] section needs the field "
                                        "'arch'"):
        class Untagged(KindConfig):
            KIND: ClassVar[str] = "model"


def test_doctor_checks_a_plugin_model_as_it_checks_a_built_in(registered):
    """doctor iterates the model registry: a study's model is trained on both devices,
    vanilla and with PE, and the same check fails it when its device side is off."""
    from perencode.commands import doctor

    cpu = torch.device("cpu")
    rows = doctor.equivalence_checks(cpu, cpu, doctor.CPU_SIZE)
    assert [r.name for r in rows] == [f"equivalence {a} {e}" for a in
                                      ("gru", "lstm", "s4d", "elman") for e in ("vanilla", "PE")]
    assert all(r.verdict == doctor.PASS and r.measured.startswith("0.00e+00 apart")
               for r in rows)
    recipe = doctor.small_recipe("elman", "sinusoidal", doctor.CPU_SIZE)
    assert (recipe.model.arch, recipe.model.model_dump()["nonlinearity"]) == ("elman", "tanh")

    def broken(params):  # the study's recurrent weights off by about an update
        params["rnn.weight_hh_l0"] += 10 * recipe.optim.lr * torch.ones_like(
            params["rnn.weight_hh_l0"])

    assert doctor.equivalence(recipe, cpu, cpu, perturb=broken) > doctor.TOLERANCE["tf32"]


def test_a_tasks_capabilities_are_its_registrations_own(registered, monkeypatch):
    """Which tasks `stability` analyses and `bench --baseline` times are registration
    fields: a study's task of reverse's layout gets the bare loop by declaring it."""
    import dataclasses

    from perencode.commands.bench import bench

    assert kinds.having("task", "stability") == ["dual_frequency"]
    assert kinds.having("task", "baseline") == ["reverse", "sort"]
    recipe = validate({"task": {"name": "copy", "vocab_size": 4, "length": 3, "held_out": 8},
                       "model": {"hidden_size": 8, "embed_size": 8},
                       "train": {"batch_size": 4}}, "test")
    cpu = torch.device("cpu")
    with pytest.raises(UserError, match="on the fixed-length reverse and sort tasks only"):
        bench(recipe, cpu, iterations=1, warmup=0, baseline=True)
    monkeypatch.setitem(kinds.TASKS, "copy", dataclasses.replace(kinds.TASKS["copy"],
                                                                 baseline=True))
    assert kinds.having("task", "baseline") == ["reverse", "sort", "copy"]
    result = bench(recipe, cpu, iterations=1, warmup=0, baseline=True)
    assert result["ratio_to_bare"] > 0 and result["bare_seconds_per_iteration"] > 0
