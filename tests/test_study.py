"""A researcher's own study (issue 38): installed plugins that stay out of the way
(PERENCODE_DISABLE_PLUGIN_AUTOLOAD, a clean checkout after the example's install)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from conftest import PYTHON, ROOT, subprocess_env, tiny_overrides
from fake_runs import fake_run
from test_plugins import autoloading, error_line
from test_sweep import TINY

from perencode.analysis.verdicts import Claim
from perencode.common.errors import UserError
from perencode.config import plugins, registry
from perencode.config.grid import axis_options, load_grid
from perencode.config.recipe import read_toml, tomllib, validate
from perencode.store import runs as runs_module
from perencode.training.planning import held_out_iterations

pytestmark = pytest.mark.forked_children  # the sweep's children as forks (tests/forked.py)

RECIPE = ROOT / "recipes" / "gru_vocab256.toml"

FAKE_PE = '''
import torch
from perencode.config.registry import EncodingKind, register_encoding

register_encoding(EncodingKind("fake_ramp", label="Fake ramp",
                               table=lambda positions, dim: torch.zeros(positions, dim)))
'''


def installed_fake(folder) -> dict:
    """A distribution 'fake-pe' with a perencode.kinds entry point, installed by being on
    PYTHONPATH (a .dist-info beside its module, as pip leaves one); the env that sees it."""
    (folder / "fake_pe.py").write_text(FAKE_PE)
    info = folder / "fake_pe-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-pe\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[perencode.kinds]\nfake = fake_pe\n")
    env = subprocess_env()
    env["PYTHONPATH"] = f"{folder}:{env['PYTHONPATH']}"
    return env


def show(env: dict, *args) -> tuple[int, str]:
    proc = subprocess.run([PYTHON, "-m", "perencode", *args, "show", str(RECIPE), "--set",
                           "encoding.kind=fake_ramp"], capture_output=True, text=True,
                          env=env, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_suite_runs_with_entry_point_loading_off():
    assert not registry.autoload()
    assert plugins.load_entry_points() == []  # the example may be installed beside it


@pytest.mark.slow
def test_the_autoload_switch_turns_entry_points_off_and_leaves_explicit_plugins_on(tmp_path):
    env = installed_fake(tmp_path)
    code, text = show(autoloading(env))
    assert code == 0 and "fake_ramp" in text, text
    for off in ("1", "true"):
        code, text = show({**env, registry.AUTOLOAD_OFF: off})
        assert code == 2 and "encoding.kind: Input should be " in error_line(text) \
            and "(got 'fake_ramp')" in text, text
    code, text = show({**env, registry.AUTOLOAD_OFF: "0"})  # "0" is off-switch off: loads
    assert code == 0, text
    code, text = show({**env, registry.AUTOLOAD_OFF: "1"}, "--plugin", "fake_pe")
    assert code == 0 and "fake_ramp" in text, text


def test_the_example_packages_build_leftovers_are_ignored():
    paths = ["examples/perencode-minrnn/build/lib/perencode_minrnn/plugin.py",
             "examples/perencode-minrnn/perencode_minrnn.egg-info/PKG-INFO", "build/x"]
    proc = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.stdout.split() == paths, proc.stderr


# -- grid inheritance: a file's value holds over its base's axis -------------------------------

BASE_GRID = TINY + ('\n[grid]\n"task.vocab_size+train.iterations" = [[64, 20], [8, 10]]\n'
                    '"encoding.kind" = ["none", "sinusoidal"]\n')


def grid_pair(tmp_path, child: str) -> Path:
    (tmp_path / "base.toml").write_text(BASE_GRID)
    path = tmp_path / "child.toml"
    path.write_text('base = "base.toml"\n' + child)
    return path


def test_a_files_value_holds_over_the_axis_its_base_varies_with_a_note(tmp_path):
    grid = load_grid(grid_pair(tmp_path, "[task]\nvocab_size = 32\n[train]\niterations = 5\n"))
    assert [(c.name, c.recipe.task.vocab_size, c.recipe.train.iterations) for c in grid.cells] \
        == [("encoding=none", 32, 5), ("encoding=sinusoidal", 32, 5)]
    base, child = tmp_path / "base.toml", tmp_path / "child.toml"
    assert grid.notes == [
        f"{child} sets task.vocab_size = 32 and train.iterations = 5, which its base {base} "
        f"varies in the axis 'task.vocab_size+train.iterations': {child}'s values hold in "
        "every cell"]


def test_a_tied_axis_keeps_the_keys_the_file_does_not_set(tmp_path):
    grid = load_grid(grid_pair(tmp_path, "[train]\niterations = 5\n"))
    assert [(c.name, c.recipe.task.vocab_size, c.recipe.train.iterations) for c in grid.cells] \
        == [("vocab_size=64/encoding=none", 64, 5), ("vocab_size=64/encoding=sinusoidal", 64, 5),
            ("vocab_size=8/encoding=none", 8, 5), ("vocab_size=8/encoding=sinusoidal", 8, 5)]
    assert grid.notes[0].endswith("values hold in every cell (task.vocab_size still varies)")
    # An axis of the file's own replaces that key of the base's tied axis; the same axis
    # spelt as the base spells it is replaced in place, with no note.
    grid = load_grid(grid_pair(tmp_path, '[grid]\n"task.vocab_size" = [16]\n'))
    assert {(c.recipe.task.vocab_size, c.recipe.train.iterations) for c in grid.cells} == \
        {(16, 20), (16, 10)}
    assert "child.toml varies task.vocab_size itself, which its base" in grid.notes[0]
    grid = load_grid(grid_pair(tmp_path, '[grid]\n"encoding.kind" = ["none"]\n'))
    assert grid.notes == [] and [c.name for c in grid.cells] == [
        "vocab_size=64/encoding=none", "vocab_size=8/encoding=none"]


def test_the_dry_run_explains_where_each_value_came_from(tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)  # files are shown relative to the working directory
    grid_pair(tmp_path, "[train]\niterations = 5\n")
    code, text = cli("sweep", "child.toml", "--runs", "runs", "--explain", "--device", "cpu",
                     "--set", "optim.lr=0.003")
    assert code == 0, text
    assert "note: " in text and not (tmp_path / "runs" / "child").exists()  # nothing ran
    rows = {cells[0]: cells[1:] for line in text.splitlines()
            if len(cells := [c.strip() for c in line.strip("│ ").split("│")]) == 3}
    assert rows["train.iterations"] == ["5", "child.toml"]
    assert rows["task.vocab_size"] == ["64, 8", "base.toml [grid]"]
    assert rows["encoding.kind"] == ["none, sinusoidal", "base.toml [grid]"]
    assert rows["optim.lr"] == ["0.003", "--set"]
    assert rows["task.length"] == ["4", "base.toml"]
    assert rows["optim.clip_norm"] == ["1.0", "default"]


# -- claims of one's own: the format, its schema, the example's claims -------------------------

MINGRU_CLAIMS = ROOT / "examples" / "perencode-minrnn" / "claims" / "reverse_vocabulary.toml"


def test_the_claims_schema_is_the_claim_and_the_docs_table_is_the_commands(cli):
    code, text = cli("claims-schema", "--json")
    schema = json.loads(text)
    item = schema["properties"]["claim"]["items"]
    assert code == 0 and schema["required"] == ["claim"]
    assert list(item["properties"]) == list(Claim.model_fields)
    assert set(item["required"]) == {"id", "statement", "metric", "test"}
    assert item["additionalProperties"] is False
    # Every bundled and example claim uses only fields of the schema.
    for path in [*(ROOT / "perencode" / "claims").glob("*.toml"), MINGRU_CLAIMS]:
        for claim in read_toml(path)["claim"]:
            assert set(claim) <= set(item["properties"]) and set(item["required"]) <= set(claim)
    code, table = cli("claims-schema")
    assert code == 0 and table.strip() in (ROOT / "docs" / "claims.md").read_text()


def mingru_runs(root: Path) -> Path:
    """Fake minGRU runs (the kind need not be registered to read results): vanilla 1.0 at
    K = 32 and about 0.3 at K = 256, PE 1.0 and about 0.9, three seeds."""
    accuracy = {(32, "none"): 1.0, (32, "sinusoidal"): 1.0, (256, "none"): 0.3,
                (256, "sinusoidal"): 0.9}
    for (vocab, kind), acc in accuracy.items():
        for i, seed in enumerate((111, 222, 333)):
            recipe = validate({"task": {"name": "reverse", "vocab_size": vocab, "length": 8},
                               "model": {"arch": "mingru", "hidden_size": 32},
                               "encoding": {"kind": kind},
                               "train": {"iterations": 200, "seed": seed}}, "fake",
                              any_kind=True)
            value = acc - 0.01 * i
            fake_run(root, f"K{vocab}-{kind}-{seed}", recipe=recipe, metrics={
                "token_accuracy": value, "dl_distance": 8 * (1 - value)})
    return root


def test_the_example_claims_ask_pe_vs_vanilla_at_the_largest_vocabulary(tmp_path, cli):
    runs = mingru_runs(tmp_path / "runs")
    code, text = cli("verify", runs, "--claims", MINGRU_CLAIMS, "--out", tmp_path / "v",
                     "--json")
    assert code == 0, text
    got = {r["id"]: r for r in json.loads((tmp_path / "v" / "verify.json").read_text())[
        "results"]}
    assert {k: r["verdict"] for k, r in got.items()} == {
        "mingru-pe-better-at-largest-k": "pass", "mingru-pe-lower-dl-at-largest-k": "pass",
        "mingru-vanilla-degrades": "pass"}
    assert got["mingru-pe-better-at-largest-k"]["value"] == pytest.approx(0.6)
    assert got["mingru-pe-better-at-largest-k"]["reproduced"].endswith("(vocab_size=256)")
    assert got["mingru-vanilla-degrades"]["value"] == pytest.approx(-0.7)


def test_a_claims_mistake_is_one_line_naming_the_file_and_a_close_column(tmp_path, cli):
    runs = mingru_runs(tmp_path / "runs")
    claims = tmp_path / "mine.toml"
    for body, message in [
            ('metric = "token_acc"\ntest = "threshold"\n', "metric 'token_acc' is not a "
             "column of table 'runs' (did you mean 'token_accuracy'?)"),
            ('metric = "token_accuracy"\nwhere = { "model.ach" = "gru" }\ntest = "threshold"\n',
             "no column 'model.ach' to filter on (did you mean 'model.arch'?)")]:
        claims.write_text(f'[[claim]]\nid = "x"\nstatement = "s"\n{body}')
        code, text = cli("verify", runs, "--claims", claims, "--out", tmp_path / "v")
        assert code == 2 and " ".join(text.split()) == f"error: {claims}: claim x: {message}"


# -- ad-hoc multirun: --axis without a grid file, --tag -----------------------------------------


def test_axis_options_read_values_as_toml_and_refuse_mistakes():
    assert axis_options(["task.vocab_size=32,64", "encoding.kind=none,sinusoidal",
                         "task.vocab_size+train.iterations=[32,2000],[1024,4000]"]) == {
        "task.vocab_size": [32, 64], "encoding.kind": ["none", "sinusoidal"],
        "task.vocab_size+train.iterations": [[32, 2000], [1024, 4000]]}
    for item, message in [("task.vocab_size", "expected FIELD=V1,V2"),
                          ("task.vocab_size=", "expected FIELD=V1,V2")]:
        with pytest.raises(UserError, match=message):
            axis_options([item])


def test_an_axis_over_a_recipe_or_a_grid_plans_as_a_grid_file_does(tmp_path):
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(TINY)
    grid = load_grid(recipe, extra_axes=["encoding.kind=none,sinusoidal", "train.seed=1,2"],
                     tag="t1")
    assert grid.name == "tiny@t1" and [c.name for c in grid.cells] == [
        "encoding=none/seed=1", "encoding=none/seed=2", "encoding=sinusoidal/seed=1",
        "encoding=sinusoidal/seed=2"]
    assert grid.cells[3].record == {"grid": str(recipe), "name": "tiny@t1", "tag": "t1",
                                    "cell": "encoding=sinusoidal/seed=2",
                                    "axes": {"encoding.kind": "sinusoidal", "train.seed": "2"}}
    assert grid.origins["train.seed"] == "--axis"
    # Over a grid file: an axis of its own is replaced (a tied one keeps its other keys).
    grid = load_grid(grid_pair(tmp_path, ""), extra_axes=["task.vocab_size=16"])
    assert {(c.recipe.task.vocab_size, c.recipe.train.iterations) for c in grid.cells} == \
        {(16, 20), (16, 10)} and grid.notes[0].startswith("--axis varies task.vocab_size")
    with pytest.raises(UserError, match=r"--tag 'a/b': letters, digits"):
        load_grid(recipe, extra_axes=["train.seed=1,2"], tag="a/b")
    with pytest.raises(UserError, match=r"sweeps with --axis FIELD=V1,V2"):
        load_grid(recipe)


@pytest.mark.slow
def test_an_ad_hoc_tagged_sweep_trains_and_figures_and_report_show_its_tag(tmp_path, cli):
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(TINY.replace("[task]\n", "[task]\nvocab_size = 8\n"))
    runs = tmp_path / "runs"
    code, text = cli("sweep", recipe, "--axis", "encoding.kind=none,sinusoidal", "--axis",
                     "train.seed=1,2", "--tag", "mine", "--runs", runs, "--jobs", "2",
                     "--device", "cpu", "--no-progress")
    assert code == 0, text
    done = sorted(str(p.parent.relative_to(runs)) for p in runs.rglob("eval.json"))
    assert done == ["tiny@mine/encoding=none/seed=1", "tiny@mine/encoding=none/seed=2",
                    "tiny@mine/encoding=sinusoidal/seed=1",
                    "tiny@mine/encoding=sinusoidal/seed=2"]
    record = json.loads((runs / "tiny@mine/encoding=none/seed=2/sweep.json").read_text())
    assert record["tag"] == "mine" and record["axes"] == {"encoding.kind": "none",
                                                          "train.seed": "2"}
    code, text = cli("eval", runs / "tiny@mine/encoding=none/seed=2", "--device", "cpu")
    assert code == 0, text
    claims = tmp_path / "claims.toml"
    claims.write_text('[[claim]]\nid = "pe"\nstatement = "PE vs vanilla"\n'
                      'where = { "task.name" = "reverse" }\nmetric = "token_accuracy"\n'
                      'test = "difference"\na = { "encoding.kind" = "sinusoidal" }\n'
                      'b = { "encoding.kind" = "none" }\n')
    code, text = cli("report", runs, "--claims", claims, "--out", tmp_path / "report")
    assert code == 0, text
    table = pd.read_csv(tmp_path / "report" / "results.csv")
    assert list(table["tag"]) == ["mine"] * 4
    page = (tmp_path / "report" / "report.html").read_text()
    assert "<dt>sweep tag</dt><dd>mine</dd>" in page
    code, text = cli("verify", runs, "--claims", claims, "--out", tmp_path / "v",
                     "--report-only")
    assert code == 0, text
    verdict = json.loads((tmp_path / "v" / "verify.json").read_text())["results"][0]
    assert verdict["verdict"] in ("pass", "fail", "inconclusive") and len(verdict["runs"]) == 4


# -- the smaller items ---------------------------------------------------------------------------


def flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def test_a_global_option_after_the_command_says_where_it_goes(cli):
    code, text = cli("eval", "runs/x", "--plugin", "my_pe.py")
    assert code == 2 and "No such option: --plugin: it is an option of perencode itself, " \
        "given before the command: perencode --plugin PLUGIN eval ..." in flat(text)
    code, text = cli("eval", "runs/x", "--plugn", "my_pe.py")  # any other: click's own line
    assert code == 2 and "No such option: --plugn" in flat(text) and "itself" not in text


def plugin_run(root: Path, name: str = "run", **recipe) -> Path:
    """A finished fake minGRU run recording the example's plugin as an installed one."""
    data: dict[str, dict] = {"task": {"name": "reverse", "vocab_size": 8, "length": 4},
            "model": {"arch": "mingru", "hidden_size": 16, "embed_size": 16},
            "train": {"iterations": 10}}
    for key, value in recipe.items():
        section, _, field_name = key.partition("__")
        data.setdefault(section, {})[field_name] = value
    run = fake_run(root, name, recipe=validate(data, "fake", any_kind=True),
                   metrics={"token_accuracy": 0.5, "sequence_accuracy": 0.1,
                            "dl_distance": 2.0})
    (run / "plugins.json").write_text(json.dumps({"plugins": [{
        "module": "perencode_minrnn.plugin", "file": None, "package": "perencode-minrnn",
        "version": "0.1.0", "entry_point": "minrnn", "provides": ["model.arch = 'mingru'"]}]}))
    return run


def test_another_recipe_in_a_plugins_run_directory_is_named_as_such(tmp_path, cli):
    run = plugin_run(tmp_path)
    code, text = cli("train", ROOT / "recipes" / "gru_vocab256.toml", "--run-dir", run,
                     "--device", "cpu")
    assert code == 2 and flat(text).startswith(f"error: {run}: holds a run of a different "
                                               "recipe (model.arch: "), text


def test_show_says_what_set_changed_after_the_files_description(cli):
    code, text = cli("show", ROOT / "recipes" / "gru_vocab256.toml", "--set",
                     "encoding.kind=none", "--set", "task.vocab_size=32")
    description = tomllib.loads(text)["description"]
    assert code == 0 and description.startswith("Fig. 2 (GRU)") and description.endswith(
        "Changed by --set: encoding.kind=none, task.vocab_size=32.")


def test_a_misspelt_section_or_kind_gets_a_did_you_mean(cli):
    recipe = ROOT / "recipes" / "gru_vocab256.toml"
    code, text = cli("show", recipe, "--set", "trian.iterations=5")
    assert code == 2 and flat(text).endswith("did you mean 'train.iterations'?")
    code, text = cli("show", recipe, "--set", "encoding.kind=sinusoid")
    assert code == 2 and "(got 'sinusoid'; did you mean 'sinusoidal'?)" in flat(text)


@pytest.fixture
def mingru(monkeypatch):
    """The example's minGRU registered in this process for one test (its registration
    copied: importing its `plugin` module would register it for good)."""
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "perencode-minrnn"))
    from perencode_minrnn.mingru import MinGRUConfig, build

    registry.registry("model")
    monkeypatch.setitem(registry.MODELS, "mingru", registry.ModelKind(
        "mingru", build, label="minGRU", config=MinGRUConfig))


def test_the_nonpaper_subtitle_names_the_model_not_its_options_in_a_stable_order(mingru):
    from perencode.analysis.plots import FIGURES, paper_difference
    from perencode.analysis.results import flatten

    recipe = validate({"task": {"name": "reverse", "vocab_size": 256, "length": 64},
                       "model": {"arch": "mingru", "hidden_size": 512, "embed_size": 512,
                                 "log_space": True}}, "fake")
    part = pd.DataFrame([flatten(recipe)])
    figure = next(f for f in FIGURES if f.paper == "fig02")
    text = paper_difference(part, figure, list(part.columns))
    assert text.startswith("Not the paper's settings: arch mingru (paper: gru, lstm, s4d)")
    assert "log_space" not in text


@pytest.mark.slow
@pytest.mark.compat
def test_the_report_takes_a_title_and_lists_the_plugins_under_its_runs(tmp_path, cli):
    runs = tmp_path / "runs"
    for seed in (1, 2):
        plugin_run(runs, f"s{seed}", train__seed=seed)
    claims = tmp_path / "claims.toml"
    claims.write_text('[[claim]]\nid = "x"\nstatement = "s"\nmetric = "token_accuracy"\n'
                      'test = "threshold"\n')
    code, text = cli("report", runs, "--claims", claims, "--out", tmp_path / "r", "--title",
                     "minGRU & PE")
    page = (tmp_path / "r" / "report.html").read_text()
    assert code == 0 and "<h1>minGRU &amp; PE</h1>" in page and \
        "<title>minGRU &amp; PE</title>" in page
    assert "<dt>plugins</dt><dd>perencode_minrnn.plugin (perencode-minrnn 0.1.0)</dd>" in page


# -- held-out scoring during training (train.eval_every) -----------------------------------------


def tiny_training(run_dir: Path, *extra: str, tensorboard: bool = False):
    from perencode.config.recipe import load_recipe
    from perencode.training.loop import train

    recipe = load_recipe(ROOT / "recipes" / "gru_vocab256.toml", [
        "task.vocab_size=8", "task.length=6", "task.held_out=32", "model.hidden_size=16",
        "model.embed_size=16", "train.iterations=30", "train.batch_size=8",
        "train.log_every=5", "train.checkpoint_every=15", "optim.warmup=2", *extra])
    return train(recipe, run_dir, device="cpu", progress=False, tensorboard=tensorboard)


@pytest.mark.slow
@pytest.mark.compat
def test_held_out_scoring_leaves_training_bit_identical(tmp_path):
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    plain = tiny_training(tmp_path / "plain")
    scored = tiny_training(tmp_path / "scored", "train.eval_every=10", tensorboard=True)
    rows = {name: [r.as_dict() for r in runs_module.Run(tmp_path / name).metrics()]
            for name in ("plain", "scored")}
    assert [(r["step"], r["loss"], r["accuracy"]) for r in rows["plain"]] == \
        [(r["step"], r["loss"], r["accuracy"]) for r in rows["scored"]]
    assert {k: v for k, v in plain.items() if k != "seconds"} == \
        {k: v for k, v in scored.items() if k != "seconds"}
    a = torch.load(tmp_path / "plain" / "checkpoints" / "step-30.pt", weights_only=True)
    b = torch.load(tmp_path / "scored" / "checkpoints" / "step-30.pt", weights_only=True)
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    # Held-out columns on every tenth step; the last are eval.json's numbers.
    held = [r for r in rows["scored"] if "held_out_token_accuracy" in r]
    assert [r["step"] for r in held] == [10, 20, 30]
    assert held[-1]["held_out_token_accuracy"] == scored["token_accuracy"]
    assert held[-1]["held_out_dl_distance"] == scored["dl_distance"]
    assert not any("held_out_token_accuracy" in r for r in rows["plain"])
    board = EventAccumulator(str(tmp_path / "scored" / "tensorboard"))
    board.Reload()
    assert [(e.step, e.value) for e in board.Scalars("held_out/token_accuracy")] == \
        [(r["step"], pytest.approx(r["held_out_token_accuracy"])) for r in held]
    # Not part of the run's identity: turning it on for a finished run is the same run.
    assert runs_module.read_recipe(tmp_path / "scored").identity() == \
        runs_module.read_recipe(tmp_path / "plain").identity()


def test_eval_every_rides_on_log_steps_and_its_cost_is_in_the_dry_run(tmp_path, cli):
    code, text = cli("show", ROOT / "recipes" / "gru_vocab256.toml", "--set",
                     "train.eval_every=150")
    assert code == 2 and "train.eval_every: 150 is not a multiple of log_every (100)" in \
        flat(text)
    code, text = cli("sweep", ROOT / "recipes" / "quick" / "quickstart.toml", "--dry-run",
                     "--runs", tmp_path / "runs", "--device", "cpu", "--set",
                     "train.eval_every=500")
    # 8 runs of 4,000 iterations (7 scorings before the last) and 8 of 1,500 (2), each a
    # forward pass over 1,024 held-out sequences: 16 batches of 64, a third of an iteration.
    assert code == 0 and "held-out scoring every 500 iterations (train.eval_every) in 16 " \
        "run(s): " in flat(text)
    assert held_out_iterations(load_grid(ROOT / "recipes" / "quick" / "quickstart.toml",
                                         ["train.eval_every=500"]).cells[0].recipe) == \
        pytest.approx(7 * 1024 / 64 / 3)


# -- an encoding with options and parameters of its own (docs/extending.md) ----------------------


def learned_sin_docs() -> tuple[str, list[str]]:
    """docs/extending.md's learned-frequency sinusoid: its file and its shell commands."""
    text = (ROOT / "docs" / "extending.md").read_text()
    part = text[text.index("A learned-frequency sinusoid"):text.index("## A model")]
    blocks = part.split("```")[1::2]
    code = next(b.split("\n", 1)[1] for b in blocks if b.startswith("python\n"))
    sh = next(b.split("\n", 1)[1] for b in blocks if b.startswith("sh\n"))
    return code, sh.replace("\\\n", " ").splitlines()


def test_a_learned_frequency_sinusoid_starts_as_the_sinusoidal_table(tmp_path):
    import torch

    from perencode.kinds.encoding import sinusoidal

    namespace: dict = {"__name__": "learned_sin_doc"}
    code = learned_sin_docs()[0].replace("register_encoding(EncodingKind(", "(EncodingKind(")
    exec(compile(code, "learned_sin.py", "exec"), namespace)  # the file, not registered
    cfg = namespace["LearnedSinConfig"].model_validate({"kind": "learned_sin", "base": 10_000},
                                                      context={"any_kind": True})
    module = namespace["LearnedSin"](cfg, 16, 12)
    vectors = module(torch.zeros(2, 5, 16), offset=3)  # steps 3..7
    assert torch.allclose(vectors, sinusoidal(12, 16)[3:8], atol=1e-5)
    assert [n for n, p in module.named_parameters() if p.requires_grad] == ["log_freq"]


# The docs' learned-frequency sweep at the tests' size: options after the docs' own.
SHRINK = ["--set", "model.hidden_size=8", "--set", "model.embed_size=8", "--set",
          "train.iterations=20", "--set", "train.checkpoint_every=10", "--set",
          "optim.warmup=2", "--set", "train.batch_size=8"]


@pytest.mark.slow
def test_the_learned_frequency_sinusoid_trains_resumes_evaluates_and_sweeps(tmp_path):
    import shutil

    import torch
    from test_plugins import perencode

    code, commands = learned_sin_docs()
    (tmp_path / "learned_sin.py").write_text(code)
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    recipe = ["recipes/gru_vocab256.toml", "--set", "encoding.kind=learned_sin", "--set",
              "encoding.base=1000", *tiny_overrides("task.vocab_size=8", "task.length=6",
                                                    "train.iterations=20",
                                                    "train.checkpoint_every=10",
                                                    "train.keep_checkpoints=all",
                                                    "optim.warmup=2")]
    plugin = ["--plugin", "learned_sin.py"]
    code_, text = perencode(*plugin, "train", *recipe, "--run-dir", "a", "--device", "cpu",
                            "--no-progress", cwd=tmp_path)
    assert code_ == 0, text
    # Resume: the same run stopped after its checkpoint at 10 ends bit-identical.
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    from conftest import unfinish

    (tmp_path / "b" / "checkpoints/step-20.pt").unlink()
    unfinish(tmp_path / "b")  # as a run killed after its checkpoint at 10 leaves it
    code_, text = perencode(*plugin, "train", *recipe, "--run-dir", "b", "--device", "cpu",
                            "--no-progress", cwd=tmp_path)
    assert code_ == 0 and "resuming from iteration 10" in text, text
    a, b, start = (torch.load(tmp_path / run / "checkpoints" / f"step-{k}.pt",
                              weights_only=True)["model"]
                   for run, k in (("a", 20), ("b", 20), ("a", 10)))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["encoding.own.log_freq"], start["encoding.own.log_freq"])
    assert a["encoding.own.log_freq"][1] != pytest.approx(-math.log(1000) * 2 / 16)  # trained
    code_, text = perencode(*plugin, "eval", "b", "--device", "cpu", cwd=tmp_path)
    assert code_ == 0, text
    scores = [json.loads((tmp_path / run / "eval.json").read_text()) for run in ("a", "b")]
    assert scores[0]["token_accuracy"] == scores[1]["token_accuracy"]
    # The docs' sweep and figures as written, the sweep's cells shrunk by later --sets (the
    # training above is what this test is about; the docs' sizes take minutes on a CPU).
    for command in commands:
        shrink = SHRINK if " sweep " in command else []
        code_, text = perencode(*command.split()[1:], *shrink, cwd=tmp_path, timeout=600)
        assert code_ == 0, (command, text)
    table = pd.read_csv(tmp_path / "figures" / "results.csv")
    assert sorted(table["encoding"]) == ["learned_sin", "none", "sinusoidal"]
    assert table.loc[table["encoding"] == "learned_sin", "base"].item() == 1000


# -- new kinds in the figures: beside the baselines, one colour per kind --------------------------


@pytest.mark.slow
@pytest.mark.compat
def test_a_new_encoding_is_drawn_beside_vanilla_and_sinusoidal_in_its_own_colour(
        tmp_path, monkeypatch):
    from matplotlib.colors import to_hex

    from perencode.analysis import plots
    from perencode.commands import figures

    root = tmp_path / "runs"
    for kind in ("none", "sinusoidal", "my_pe"):  # my_pe: a plugin's, not loaded here
        for seed in (1, 2):
            for vocab in (16, 32):  # two K: lines (one K is drawn as bars)
                recipe = validate({"task": {"name": "reverse", "vocab_size": vocab,
                                            "length": 8},
                                   "encoding": {"kind": kind}, "train": {"seed": seed}},
                                  "fake", any_kind=True)
                fake_run(root, f"{kind}-{vocab}-{seed}", recipe=recipe, metrics={
                    "token_accuracy": 0.5, "sequence_accuracy": 0.1, "dl_distance": 2.0})
    drawn: dict[str, dict[str, str]] = {}
    save = plots._save

    def colours_then_save(fig, stem, note="", **options):
        handles, labels = fig.axes[0].get_legend_handles_labels()
        drawn[Path(stem).name] = {label: to_hex(h[0].get_color()) for h, label in
                                  zip(handles, labels) if hasattr(h, "__getitem__")}
        return save(fig, stem, note, **options)

    monkeypatch.setattr(plots, "_save", colours_then_save)
    figures.make_figures([root], tmp_path / "fig")
    assert list(drawn) == ["fig02_reverse_vocabulary__nonpaper"]  # no other_ figure
    my_pe = plots._colour("encoding.kind", "my_pe")
    assert my_pe is not None
    assert drawn["fig02_reverse_vocabulary__nonpaper"] == {
        "Vanilla": to_hex("tab:blue"), "Position-Encoded": to_hex("tab:orange"),
        "my_pe": to_hex(my_pe)}
    builtin = {plots._colour("encoding.kind", n) for n in registry.names("encoding")}
    assert plots._colour("encoding.kind", "my_pe") not in builtin


# -- a plugin's labels without the plugin: as its runs recorded them ------------------------------


@pytest.mark.slow
def test_figures_without_the_plugin_label_its_kind_as_its_runs_recorded(tmp_path, monkeypatch):
    from test_plugins import LIN_RAMP, perencode

    from perencode.analysis import plots
    from perencode.commands import figures

    # A kind of its own name and label: nothing in this process registers it.
    code = LIN_RAMP.replace("lin_ramp", "rec_ramp").replace("Linear ramp", "Recorded ramp")
    (tmp_path / "my_pe.py").write_text(code)
    code_, text = perencode("--plugin", "my_pe.py", "train", RECIPE, "--set",
                            "encoding.kind=rec_ramp",
                            *tiny_overrides("task.vocab_size=8", "task.length=6",
                                            "train.iterations=4", "optim.warmup=1"),
                            "--run-dir", "runs/ramp", "--device", "cpu", "--no-progress",
                            cwd=tmp_path)
    assert code_ == 0, text
    record = tmp_path / "runs" / "ramp" / "plugins.json"
    entries = json.loads(record.read_text())["plugins"]
    assert [e["labels"] for e in entries] == [{"encoding": {"rec_ramp": "Recorded ramp"}}]
    assert "rec_ramp" not in registry.ENCODINGS
    legends: list[list[str]] = []
    save = plots._save

    def legend_then_save(fig, stem, note="", **options):
        legends.append(fig.axes[0].get_legend_handles_labels()[1])
        return save(fig, stem, note, **options)

    monkeypatch.setattr(plots, "_save", legend_then_save)
    figures.make_figures([tmp_path / "runs"], tmp_path / "fig")
    assert legends and all("Recorded ramp" in labels and "rec_ramp" not in labels
                           for labels in legends), legends
    # A plugins.json written before labels were recorded: the raw name.
    record.write_text(json.dumps({"plugins": [
        {k: v for k, v in e.items() if k != "labels"} for e in entries]}))
    legends.clear()
    figures.make_figures([tmp_path / "runs"], tmp_path / "fig-old")
    assert legends and all("rec_ramp" in labels and "Recorded ramp" not in labels
                           for labels in legends), legends
    assert registry.label("encoding", "rec_ramp") == "rec_ramp"
