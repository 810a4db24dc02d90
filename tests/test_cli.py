import json

import pytest
import torch
from conftest import ROOT, tiny_overrides

RECIPE = str(ROOT / "recipes/gru_vocab256.toml")


def test_help_lists_commands(cli):
    code, text = cli("--help")
    assert code == 0
    for name in ("train", "eval", "bench", "stability", "lm-prepare", "figures"):
        assert name in text


@pytest.mark.parametrize("args,needle", [
    (["train", "missing.toml"], "missing.toml: recipe file not found"),
    (["train", RECIPE, "--set", "model.arch=rnn"], "model.arch: Input should be"),
    (["train", RECIPE, "--set", "nonsense"], "expected section.key=value"),
    (["train", RECIPE, "--set", "task.vocab_size=2", "--set", "task.length=4"],
     "task.held_out"),
    (["train", RECIPE, "--device", "tpu"], "--device 'tpu'"),
    (["eval", "no_such_dir"], "not a perencode run directory"),
    (["bench", RECIPE, "--set", "train.bogus=1"], "unknown key 'bogus' in [train]"),
])
def test_user_errors_are_one_line_exit_2(cli, args, needle):
    code, text = cli(*args)
    assert code == 2
    assert needle in " ".join(text.split())
    assert "Traceback" not in text


def test_recipe_schema_lists_fields(cli):
    code, text = cli("recipe-schema")
    assert code == 0 and "optim.betas" in text and "train.checkpoint_every" in text


def test_bench_prints_json_line(cli):
    code, text = cli("bench", RECIPE, "--iterations", "2", "--warmup", "1", "--device", "cpu",
                     "--baseline", *tiny_overrides("train.batch_size=4", "task.length=8"))
    assert code == 0, text
    result = json.loads(text.strip().splitlines()[-1])
    assert result["seconds_per_iteration"] > 0 and result["device"] == "cpu"
    assert result["sequences_per_second"] == pytest.approx(4 / result["seconds_per_iteration"])
    assert result["peak_memory_bytes"] > 0 and result["ratio_to_bare"] > 0


def test_out_that_is_a_file_is_refused(cli, tmp_path):
    target = tmp_path / "a_file"
    target.write_text("mine")
    code, text = cli("train", RECIPE, "--out", str(target), "--device", "cpu")
    assert code == 2 and "exists and is not a directory" in text
    assert target.read_text() == "mine"


@pytest.mark.parametrize("recipe", ["lstm_varlen_vocab16384.toml", "s4d_vocab1024.toml",
                                    "gru_dualfreq_vocab64.toml"])
def test_bench_baseline_scope(cli, recipe):
    code, text = cli("bench", str(ROOT / "recipes" / recipe), "--baseline", "--device", "cpu")
    assert code == 2 and "--baseline: the bare reference loop exists for gru and lstm" in text


def test_bench_baseline_scope_is_checked_by_the_library():
    from perencode.bench import bench
    from perencode.errors import UserError
    from perencode.recipe import load_recipe

    recipe = load_recipe(ROOT / "recipes/s4d_vocab1024.toml")
    with pytest.raises(UserError, match="--baseline: the bare reference loop exists for gru"):
        bench(recipe, torch.device("cpu"), iterations=1, warmup=0, baseline=True)
