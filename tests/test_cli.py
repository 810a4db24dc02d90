import json
import os
import re
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import torch
import typer.main
from conftest import ROOT, run_cli, tiny_overrides
from typer.testing import CliRunner

from perencode import quickstart
from perencode.cli import app
from perencode.config import registry
from perencode.config.recipe import (
    SECTIONS,
    Recipe,
    load_recipe,
    tomllib,
    validate,
)
from perencode.config.schema import schema_rows

pytestmark = pytest.mark.forked_children  # the sweep's children as forks (tests/forked.py)

RECIPE = str(ROOT / "recipes/gru_vocab256.toml")


@pytest.mark.parametrize("args,needle", [
    (["train", "missing.toml"], "missing.toml: recipe file not found"),
    (["train", RECIPE, "--set", "model.arch=rnn"], "model.arch: Input should be"),
    (["train", RECIPE, "--set", "nonsense"], "expected section.key=value"),
    (["train", RECIPE, "--set", "task.vocab_size=2", "--set", "task.length=4"],
     "task.held_out"),
    (["train", RECIPE, "--device", "tpu"], "--device 'tpu'"),
    (["eval", "no_such_dir"], "no_such_dir: the folder does not exist"),
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
    from perencode.commands.bench import bench
    from perencode.common.errors import UserError
    from perencode.config.recipe import load_recipe

    recipe = load_recipe(ROOT / "recipes/s4d_vocab1024.toml")
    with pytest.raises(UserError, match="--baseline: the bare reference loop exists for gru"):
        bench(recipe, torch.device("cpu"), iterations=1, warmup=0, baseline=True)


def _commands() -> dict:
    group: Any = typer.main.get_command(app)  # a group: its commands by name
    return dict(group.commands)


def _help(*args: str, columns: int) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": str(columns)},
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _flat(text: str) -> str:
    """Rendered help without its boxes and line breaks."""
    return " ".join(re.sub("[│╭╮╰╯─]", " ", text).split())


def _bracketed(text: str | None) -> list[str]:
    """The [...] parts of a help string as they should read (rich escapes as `\\[`)."""
    return [m.replace("\\[", "[") for m in re.findall(r"\\?\[[^\]\[]*\]", text or "")]


def test_help_lists_every_command(cli):
    code, text = cli("--help")
    assert code == 0
    for name in _commands():
        assert name in text
    assert "--version" in text and "--install-completion" in text


def test_the_top_level_help_is_not_cut_at_80_columns():
    """`perencode --help` in an 80-column terminal: --plugin's help whole, its longest word
    (the variable that turns autoloading off) not cut with an ellipsis."""
    narrow = _help(columns=80)
    assert "…" not in narrow, narrow
    assert "unless PERENCODE_DISABLE_PLUGIN_AUTOLOAD=1. A sweep hands them to its workers " \
        "and jobs." in _flat(narrow)


@pytest.mark.parametrize("name", sorted(_commands()))
def test_help_text_is_complete(name):
    """Every bracketed note of a help string and every written default is shown (rich
    reads `[default: ...]` as markup and drops it unless escaped), and nothing is cut
    with an ellipsis at 80 columns (a word longer than the help column)."""
    command = _commands()[name]
    wide, narrow = _help(name, columns=200), _help(name, columns=80)
    assert "…" not in narrow, narrow
    expected = _bracketed(command.help)
    for param in command.params:
        if getattr(param, "hidden", False):
            assert param.opts[0] not in wide  # an old spelling: works, not advertised
            continue
        expected += _bracketed(getattr(param, "help", None))
        if isinstance(getattr(param, "show_default", None), str):
            expected.append(f"[default: ({param.show_default})]")
    for text in (wide, narrow):
        for needle in expected:
            assert needle in _flat(text), (name, needle)
    assert "list[str]" not in wide


def test_written_defaults_are_shown():
    assert "[default: (runs/<recipe>/seed=<seed>)]" in _flat(_help("train", columns=200))
    assert "[default: (wikitext-103-raw-v1)]" in _flat(_help("lm-prepare", columns=200))
    assert "[default: (2 on the CPU, 6 sharing the GPU)]" in _flat(_help("quickstart",
                                                                          columns=200))
    assert "[slurm] table" in _flat(_help("sweep", columns=200))


@pytest.mark.parametrize("name", ["train", "bench", "show", "sweep"])
def test_set_reads_key_equals_value(name):
    assert "--set KEY=VALUE" in _flat(_help(name, columns=200))


def test_version(cli):
    code, text = cli("--version")
    assert code == 0 and text.strip() == f"perencode {metadata.version('perencode')}"


def test_shell_completion_completes_commands_and_options():
    def complete(words: str) -> str:
        return CliRunner().invoke(app, [], prog_name="perencode", env={
            "_PERENCODE_COMPLETE": "complete_bash", "COMP_WORDS": words,
            "COMP_CWORD": str(len(words.split()) - 1)}).output

    assert complete("perencode tra").split() == ["train"]
    assert "--run-dir" in complete("perencode train --ru").split()


def test_readme_commands_table_lists_every_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Commands", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `perencode ([a-z-]+)", section, flags=re.M))
    assert listed == set(_commands())


@pytest.mark.parametrize("recipe", sorted((ROOT / "recipes").glob("*.toml")),
                         ids=lambda p: p.stem)
def test_show_prints_the_resolved_recipe_and_reads_back(recipe):
    result = CliRunner().invoke(app, ["show", str(recipe), "--set", "optim.lr=0.01"],
                                catch_exceptions=False)  # stdout only: no notes mixed in
    assert result.exit_code == 0, result.output
    shown = tomllib.loads(result.stdout)
    expected = load_recipe(recipe, ["optim.lr=0.01"])
    assert validate(shown, "shown") == expected
    assert shown["optim"]["lr"] == 0.01
    # every default is filled in: each section lists all its fields (None ones are left out)
    for section in SECTIONS:
        fields = getattr(expected, section).model_dump(exclude_none=True)
        assert shown[section].keys() == fields.keys(), section

    result = CliRunner().invoke(app, ["show", str(recipe), "--json"], catch_exceptions=False)
    assert json.loads(result.stdout) == load_recipe(recipe).model_dump(mode="json")


def test_show_fills_in_defaults_and_reports_mistakes(cli, tmp_path):
    recipe = tmp_path / "bare.toml"
    recipe.write_text("[task]\nname = \"reverse\"\nvocab_size = 32\n")
    code, text = cli("show", recipe)
    shown = tomllib.loads(text)
    assert code == 0 and shown["task"]["vocab_size"] == 32
    assert shown["optim"] == Recipe().optim.model_dump(mode="json")
    assert shown["train"]["iterations"] == 300_000
    code, text = cli("show", recipe, "--set", "optim.lrr=1")
    assert code == 2 and "unknown key 'lrr' in [optim]" in text and "did you mean 'lr'" in text


def test_recipe_schema_json_is_the_json_schema(cli):
    code, text = cli("recipe-schema", "--json")
    assert code == 0
    schema = json.loads(text)
    assert set(schema["properties"]) == {"description", *SECTIONS}
    defs = schema["$defs"]

    def members(section: str) -> dict[str, dict]:
        """A kind section's oneOf: the member of each registered kind, by tag value."""
        prop = schema["properties"][section]
        mapping = prop["discriminator"]["mapping"]
        assert len(prop["oneOf"]) == len(mapping)
        return {tag: defs[ref.rsplit("/", 1)[1]] for tag, ref in mapping.items()}

    tags = {"task": "name", "model": "arch", "encoding": "kind"}
    for section, tag in tags.items():
        assert schema["properties"][section]["discriminator"]["propertyName"] == tag
        found = members(section)
        assert sorted(found) == sorted(registry.names(section))
        for name, member in found.items():
            assert member["properties"][tag]["const"] == name
    # Every field of schema_rows is in the schema: a kind's own option in its members only.
    for key, *_ in schema_rows():
        section, name = key.split(".")
        if section in tags:
            assert any(name in m["properties"] for m in members(section).values()), key
        else:
            ref = schema["properties"][section]["$ref"].rsplit("/", 1)[1]
            assert name in defs[ref]["properties"], key
    task = members("task")
    assert "rarity" in task["dual_frequency"]["properties"]
    assert "rarity" not in task["reverse"]["properties"]
    assert "held_out" in task["reverse"]["properties"]
    assert "d_state" in members("model")["s4d"]["properties"]
    assert "d_state" not in members("model")["gru"]["properties"]
    assert task["reverse"]["properties"]["vocab_size"]["minimum"] == 2


@pytest.mark.slow
@pytest.mark.compat
def test_train_out_is_the_old_spelling_of_run_dir(cli, tmp_path):
    run = tmp_path / "run"
    args = ["train", RECIPE, "--device", "cpu", "--no-progress",
            *tiny_overrides("train.iterations=2", "task.vocab_size=8", "task.length=4")]
    code, text = cli(*args, "--out", run)
    assert code == 0, text
    assert "note: --out is now --run-dir" in text and (run / "eval.json").exists()
    code, text = cli(*args, "--out", run, "--run-dir", run)
    assert code == 2 and "--out is the old spelling of --run-dir" in text


@pytest.mark.slow
@pytest.mark.compat
def test_train_names_its_run_as_a_sweep_names_a_seed_and_finds_an_earlier_name(
        cli, tmp_path, monkeypatch):
    """Without --run-dir: runs/<recipe>/seed=111, the sweep's `key=value` spelling; a run an
    earlier perencode put at runs/<recipe>/seed-111 is still that run (reported, not
    trained again beside it)."""
    monkeypatch.chdir(tmp_path)
    args = ["train", RECIPE, "--device", "cpu", "--no-progress",
            *tiny_overrides("train.iterations=2", "task.vocab_size=8", "task.length=4")]
    code, text = cli(*args)
    assert code == 0, text
    named = Path("runs") / Path(RECIPE).stem / "seed=111"
    assert (named / "eval.json").exists() and os.listdir(named.parent) == ["seed=111"]
    named.rename(named.parent / "seed-111")
    code, text = cli(*args)
    assert code == 0, text
    assert (f"note: runs/{Path(RECIPE).stem}/seed-111: the run of this recipe and seed, in the "
            f"folder an earlier perencode named (new runs go to runs/{Path(RECIPE).stem}/seed=111)"
            in _flat(text))
    assert f"runs/{Path(RECIPE).stem}/seed-111: run is already complete" in _flat(text)
    assert os.listdir(named.parent) == ["seed-111"]


def test_sweep_out_is_the_old_spelling_of_runs(monkeypatch, tmp_path):
    called: list = []

    def run_sweep(grid, out, **kw):
        called.append(out)
        return 0

    monkeypatch.setattr("perencode.commands.sweep.run.run_sweep", run_sweep)
    grid = ROOT / "recipes/quick/quickstart.toml"
    assert run_cli("sweep", grid)[0] == 0
    code, text = run_cli("sweep", grid, "--out", tmp_path / "old")
    assert code == 0 and "note: --out is now --runs" in text
    assert run_cli("sweep", grid, "--runs", tmp_path / "new") == (0, "")
    assert called == [Path("runs"), tmp_path / "old", tmp_path / "new"]


@pytest.mark.parametrize("args,runs,out,note", [
    ([], "runs", "figures", False),
    (["--runs", "r", "--out", "f"], "r", "f", False),
    (["--out", "r", "--figures", "f"], "r", "f", True),  # the old spelling
    (["--figures", "f"], "runs", "f", True),
])
def test_quickstart_folders(monkeypatch, args, runs, out, note):
    called: dict = {}

    def fake(device, runs, figures):
        called.update(runs=runs, out=figures)
        return quickstart.DEMOS["cpu"], Path(runs) / "q", Path(figures) / "q"

    monkeypatch.setattr(quickstart, "start", fake)
    monkeypatch.setattr(quickstart, "finish", lambda *args, **kwargs: None)
    # A sweep with a failed run: its exit code, and nothing checked or drawn
    monkeypatch.setattr(quickstart, "run_sweep",
                        lambda grid, out, **kw: called.update(swept=out) or 1)
    code, text = run_cli("quickstart", *args)
    assert code == 1, text
    assert called == {"runs": Path(runs), "out": Path(out), "swept": Path(runs)}
    assert ("note: --figures is now --out" in text) == note


# -- results on stdout, notes on stderr; --json; show tells a run's story (issue 48) ----------

def streams(*args) -> tuple[int, str, str]:
    """`perencode ARGS...` in-process: (exit code, stdout, stderr) apart."""
    result = CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    from conftest import train_args

    run = tmp_path_factory.mktemp("trained") / "run"
    code, out, err = streams(*train_args(run, "train.iterations=10", "train.checkpoint_every=5",
                                         "task.vocab_size=16", "task.length=6"))
    assert code == 0, err
    assert "token_accuracy" in out and "token_accuracy" not in err  # the results: stdout
    return run


@pytest.mark.slow  # a perencode process (forked): in make test and test-compat, not test-fast
@pytest.mark.compat
def test_eval_prints_its_results_on_stdout_and_as_json(trained):
    import forked
    from conftest import subprocess_env

    done = forked.run(["eval", trained, "--device", "cpu"], env=subprocess_env(), timeout=300)
    assert done.returncode == 0 and "token_accuracy" in done.stdout, done.stderr
    assert "token_accuracy" not in done.stderr
    code, out, _ = streams("eval", trained, "--device", "cpu", "--json")
    scored = json.loads((trained / "eval.json").read_text())
    assert code == 0 and json.loads(out)["token_accuracy"] == scored["token_accuracy"]


def test_show_tells_a_runs_story(trained):
    from perencode.store import identity

    code, out, _ = streams("show", trained)
    assert code == 0
    scored = json.loads((trained / "eval.json").read_text())
    lines = [line for line in out.splitlines() if line.startswith("# ")]
    assert lines[0] == f"# run: {trained}"
    assert lines[1] == "# state: finished at iteration 10 of 10"
    assert f"token_accuracy {scored['token_accuracy']:.4g}" in lines[2]
    assert re.fullmatch(r"# training: loss [\d.]+, accuracy [\d.]+ at step 10; \d+ s", lines[3])
    assert "# device: cpu" in lines[4]
    assert f"# fingerprint: {identity.short(trained)} " in out and "WARNING" not in out
    assert tomllib.loads(out)["train"]["iterations"] == 10  # still valid TOML
    code, out, _ = streams("show", trained, "--json")
    story = json.loads(out)
    assert (story["state"], story["iteration"], story["fingerprint"]) == (
        "finished", 10, identity.short(trained))
    assert story["results"]["token_accuracy"] == scored["token_accuracy"]
    assert story["training"]["step"] == 10 and story["recipe"]["train"]["iterations"] == 10


def test_show_says_when_a_runs_files_no_longer_match_the_record(trained, tmp_path):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(trained, run)
    recipe = run / "recipe.toml"
    recipe.write_text(recipe.read_text().replace("hidden_size = 16", "hidden_size = 32"))
    scored = json.loads((run / "eval.json").read_text())
    (run / "eval.json").write_text(json.dumps({**scored, "seed": scored["seed"] + 1}))
    code, out, err = streams("show", run)
    assert code == 0
    warnings = [line for line in out.splitlines() if line.startswith("# WARNING: ")]
    assert len(warnings) == 2, out
    assert "model.hidden_size: 16 when the run was made vs 32 now" in warnings[0]
    assert f"the result of another run (seed {scored['seed'] + 1}" in warnings[1]
    assert " ".join(err.split()).count("warning:") == 2
    # A hand-edited score: its identity fields hold, the hash recorded at the finish does not.
    (run / "eval.json").write_text(json.dumps({**scored, "token_accuracy": 0.99}))
    recipe.write_text((trained / "recipe.toml").read_text())
    code, out, _ = streams("show", run)
    warnings = [line for line in out.splitlines() if line.startswith("# WARNING: ")]
    assert code == 0 and len(warnings) == 1, out
    assert "not the eval.json this run wrote" in warnings[0]


def test_show_reads_a_plugins_run_without_the_plugin(tmp_path):
    from test_study import plugin_run

    run = plugin_run(tmp_path)
    code, out, err = streams("show", run)
    assert code == 0, err
    assert "# state: finished at iteration 10 of 10" in out and 'arch = "mingru"' in out
    assert "results (eval.json): token_accuracy 0.5" in out


def test_a_set_with_a_space_for_its_equals_sign_says_how_to_write_it():
    code, out, err = streams("show", ROOT / "recipes/gru_vocab256.toml", "--set",
                             "train.iterations", "10")
    assert code == 2 and "--set train.iterations 10: write --set train.iterations=10 " \
        "(KEY=VALUE, one word)" in " ".join((out + err).replace("│", " ").split())


def test_crosscheck_json_prints_its_file_on_stdout(tmp_path, monkeypatch):
    from test_crosscheck import AGREE, NOT_RUN, _groups, crosscheck, fake_repository

    monkeypatch.setattr(crosscheck, "GROUPS", _groups(AGREE, NOT_RUN))
    out = tmp_path / "out"
    code, stdout, _ = streams("crosscheck", fake_repository(tmp_path / "repo"), "--out", out,
                              "--json")
    assert code == 0 and json.loads(stdout) == json.loads((out / "crosscheck.json").read_text())


def test_eval_of_a_run_with_only_its_resume_checkpoint_says_so(trained, tmp_path):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(trained, run)
    for path in (run / "checkpoints").glob("step-*.pt"):
        path.rename(run / "checkpoints" / "resume.pt")
    from conftest import unfinish

    unfinish(run)  # an interrupted run: no result yet
    code, out, err = streams("eval", run, "--device", "cpu")
    assert code == 2 and "no periodic checkpoint yet, only resume.pt of an interrupted run" \
        in " ".join(err.split()), err


@pytest.mark.slow
@pytest.mark.compat
def test_verify_prints_its_verdicts_on_stdout(trained, tmp_path):
    code, out, err = streams("verify", trained, "--out", tmp_path)
    assert code == 0, err
    assert "not run" in out and "not run" not in err  # the verdicts: stdout
    assert f"wrote {tmp_path / 'verify.md'}" in " ".join(out.split())
    code, out, err = streams("verify", trained, "--out", tmp_path, "--json")
    assert code == 0 and json.loads(out)["claims"], err  # stdout holds the document alone
