from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from perencode.common.errors import UserError
from perencode.config.recipe import (
    BOOKKEEPING,
    NOT_IDENTITY,
    Recipe,
    apply_overrides,
    field_names,
    identity,
    load_recipe,
    parse_value,
)
from perencode.config.schema import schema_rows
from perencode.training.planning import COSTLESS_TRAIN_FIELDS


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "r.toml"
    path.write_text(text)
    return path


def test_defaults_are_the_authors_code():
    r = Recipe()
    assert r.optim.betas == (0.9, 0.98) and r.optim.eps == 1e-9
    assert r.optim.lr == 1e-3 and r.optim.warmup == 1000 and r.optim.clip_norm == 1.0
    assert r.optim.schedule == "timm"
    assert r.train.iterations == 300_000 and r.train.batch_size == 512
    assert r.train.checkpoint_every == 5000
    assert r.encoding.kind == "sinusoidal" and r.encoding.mode == "concat"
    assert r.model.hidden_size == 512 and r.model.embed_size == 512


def test_shipped_core_recipes_are_the_paper_settings():
    gru = load_recipe(ROOT / "recipes/gru_vocab256.toml")
    assert (gru.task.vocab_size, gru.task.length, gru.model.arch) == (256, 64, "gru")
    assert gru.encoding.kind == "sinusoidal"
    vanilla = load_recipe(ROOT / "recipes/gru_vocab256_vanilla.toml")
    assert vanilla.encoding.kind == "none"
    assert vanilla.model_dump(exclude={"encoding", "description"}) == \
        gru.model_dump(exclude={"encoding", "description"})
    lstm = load_recipe(ROOT / "recipes/lstm_vocab16384.toml")
    assert (lstm.task.vocab_size, lstm.model.arch) == (16384, "lstm")
    assert load_recipe(ROOT / "recipes/lstm_vocab16384_vanilla.toml").encoding.kind == "none"


def test_overrides_parse_toml_literals(tmp_path):
    path = write(tmp_path, "[task]\nname = 'reverse'\n[model]\narch = 'lstm'\n")
    r = load_recipe(path, ["optim.betas=[0.9, 0.999]", "optim.lr=1e-2",
                           "encoding.kind=none", 'model.arch="gru"'])
    assert r.optim.betas == (0.9, 0.999) and r.optim.lr == 1e-2
    assert r.encoding.kind == "none" and r.model.arch == "gru"
    assert parse_value("12") == 12 and parse_value("true") is True
    assert parse_value("sinusoidal") == "sinusoidal"
    # A TOML integer where a float is meant is a number all the same.
    assert load_recipe(path, ["optim.lr=1", "model.arch=lstm"]).optim.lr == 1.0


def test_round_trip_through_toml(tmp_path):
    r = load_recipe(ROOT / "recipes/gru_vocab256.toml", ["train.seed=222"])
    again = load_recipe(write(tmp_path, r.to_toml()))
    assert again == r


@pytest.mark.parametrize("text,overrides,needle", [
    ("[model]\narch = 'rnn'\n", [], "model.arch: Input should be 'gru', 'lstm' or 's4d'"),
    ("[model]\nhiden_size = 3\n", [], "did you mean 'hidden_size'"),
    ("[modle]\n", [], "unknown key 'modle' in the top level"),
    ("[model]\nhidden_size = 'big'\n", [], "model.hidden_size"),
    ("[model]\nhidden_size = 0\n", [], "model.hidden_size: Input should be greater than"),
    ("[task]\nvocab_size = 2\nlength = 3\nheld_out = 8\n", [],
     "task.held_out: 8 held-out sequences leave nothing to train on: only 8"),
    ("[optim]\nbetas = [0.9, 1.5]\n", [], "optim.betas"),
    ("[encoding]\nkind = 'duplicate'\nmode = 'add'\n", [], "encoding.mode"),
    ("[task]\nname = 'lm'\ndata = 'd'\nmin_length = 3\n", [],
     "task.min_length: not an option of task.name = 'lm' (only of 'variable_length')"),
    ("", ["model.hidden_size"], "expected section.key=value"),
    ("", ["foo.bar=1"], "section one of task, model"),
    ("", ["model.hidden_size=-1"], "(with --set): model.hidden_size"),
    ("", ["train.iterations=true"],
     "(with --set): train.iterations: expected a number, got a boolean (true)"),
    ("", ["optim.lr=false"], "optim.lr: expected a number, got a boolean (false)"),
    ("", ["optim.betas=[true, 0.9]"], "optim.betas: expected a number, got a boolean"),
    ("[task]\nvocab_size = true\n", [], "task.vocab_size: expected a number, got a boolean"),
    ("", ["optim.lr=fast"], "optim.lr: Input should be a valid number"),
])
def test_errors_name_file_and_field(tmp_path, text, overrides, needle):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_recipe(path, overrides)
    message = str(err.value)
    assert needle in message
    assert "\n" not in message
    if "--set '" not in message:
        assert str(path) in message


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(UserError, match="recipe file not found"):
        load_recipe(tmp_path / "nope.toml")
    with pytest.raises(UserError, match="not valid TOML"):
        load_recipe(write(tmp_path, "[model\n"))


def test_apply_overrides_does_not_mutate():
    data = {"model": {"arch": "gru"}}
    out = apply_overrides(data, ["model.arch=lstm"])
    assert data["model"]["arch"] == "gru" and out["model"]["arch"] == "lstm"


def test_every_field_is_documented():
    rows = schema_rows()
    keys = {r[0] for r in rows}
    for key in ("task.name", "task.vocab_size", "task.length", "task.held_out", "model.arch",
                "model.hidden_size", "model.embed_size", "encoding.kind", "encoding.mode",
                "optim.lr", "optim.betas", "optim.eps", "optim.warmup", "optim.clip_norm",
                "train.iterations", "train.batch_size", "train.checkpoint_every",
                "train.seed"):
        assert key in keys
    assert all(r[3] for r in rows)


def test_schema_lists_every_field_and_the_registered_kinds():
    rows = {key: (kind, description) for key, kind, _, description in schema_rows()}
    for section in ("task", "model", "encoding", "optim", "train"):
        base: Any = Recipe.model_fields[section].annotation
        kinds_own = base.options() if section in ("task", "model", "encoding") else {}
        assert {k for k in rows if k.startswith(section + ".")} == {
            f"{section}.{name}" for name in [*base.model_fields, *kinds_own]}
    # A kind's own option says whose it is.
    assert rows["task.rarity"][1].startswith("(task.name = dual_frequency only) Probability")
    assert rows["model.d_state"][1].startswith("(model.arch = s4d only) S4D state size")
    assert rows["task.held_out"][1].startswith(
        "(task.name = reverse, variable_length, predecessor, reverse_add, sort only) Distinct")
    assert rows["model.arch"][0] == "'gru' | 'lstm' | 's4d'"
    assert rows["encoding.kind"][0] == \
        "'none' | 'sinusoidal' | 'random' | 'learnable' | 'duplicate'"
    assert "dual_frequency = reverse with a dual-frequency vocabulary" in rows["task.name"][1]
    assert "s4d = one S4D layer" in rows["model.arch"][1]


def test_the_bookkeeping_fields_have_one_home():
    """recipe.BOOKKEEPING holds the fields outside a run's identity; the cost estimate's
    costless fields are its training fields and the number of iterations."""
    assert set(BOOKKEEPING) <= set(field_names())
    assert {f"train.{name}" for name in NOT_IDENTITY} <= set(BOOKKEEPING)
    assert BOOKKEEPING == ("train.seed", "train.log_every", "train.checkpoint_every",
                           "train.eval_batch_size", "train.keep_checkpoints",
                           "train.eval_every", "train.deterministic")
    assert COSTLESS_TRAIN_FIELDS == {"seed", "iterations", "checkpoint_every", "log_every",
                                     "eval_batch_size", "keep_checkpoints", "eval_every",
                                     "deterministic"}
    assert identity({"description": "x", "task": {"name": "sort"},
                     "train": {"seed": 1, "keep_checkpoints": 3}}) == \
        {"task": {"name": "sort"}, "train": {"seed": 1}}
