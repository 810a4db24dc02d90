"""Run integrity, round 2 (issue 44): the code that computed a number is all of it, a result
file is checked like a recipe, figure names never collide, a finished run is never trained
again, identical data is the same data. The cases that take two processes (code edited
between them) run them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import RECIPE, ROOT, finished_run, run_cli, train_args
from fake_runs import fake_run
from test_identity import SHORT, one_line
from test_plugins import perencode

from perencode.analysis.results import collect
from perencode.common.errors import UserError
from perencode.config.recipe import load_recipe, validate
from perencode.store import identity, runs
from perencode.store.summary import mismatches
from perencode.training.loop import Diverged, train

pytestmark = pytest.mark.forked_children  # the sweep's children as forks (tests/forked.py)

BASE_LINE = "return self.encoding(self.embedding(tokens))"


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    return finished_run(tmp_path_factory.mktemp("made") / "run", *SHORT)


@pytest.fixture
def run(made, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(made, copy)
    return copy


def tiny(run: Path, *extra: str) -> list[str]:
    return train_args(run, *SHORT, *extra)


def recipe_of(*extra: str):
    sets = [item for item in tiny(Path("unused"), *extra)[7:] if item != "--set"]
    return load_recipe(RECIPE, sets)


def edited_package(tmp_path: Path) -> Path:
    """A copy of the package whose shared model code doubles the encoded inputs (the
    issue's case: models/base.py, no kind's own module)."""
    root = tmp_path / "edited"
    shutil.copytree(ROOT / "perencode", root / "perencode",
                    ignore=shutil.ignore_patterns("__pycache__"))
    base = root / "perencode" / "kinds" / "models" / "base.py"
    text = base.read_text()
    assert BASE_LINE in text
    base.write_text(text.replace(BASE_LINE, BASE_LINE[:-1] + " * 2)"))
    return root


# --------------------------------------------------------------------------------------
# 1. Code identity: the import closure of the training and scoring path
# --------------------------------------------------------------------------------------

def test_the_code_of_a_run_is_its_training_and_scoring_path():
    modules = identity.modules_record(recipe_of())
    assert {"perencode.kinds.models.base", "perencode.training.session",
            "perencode.commands.evaluate", "perencode.kinds.tasks.base",
            "perencode.training.loop", "perencode.commands.stability",
            "perencode.kinds.models.rnn", "perencode.kinds.encoding", "perencode.kinds.scoring",
            "perencode.kinds.tasks.reverse"} <= set(modules)
    assert not {"perencode.cli", "perencode.analysis.plots", "perencode.commands.report",
                "perencode.commands.sweep", "perencode.training.planning"} & set(modules)
    assert all(len(digest) == 64 for digest in modules.values())


@pytest.mark.slow
@pytest.mark.compat
def test_an_edit_to_shared_code_is_named_and_changes_the_fingerprint(run, tmp_path,
                                                                     monkeypatch):
    entry = json.loads((run / "identity.json").read_text())
    assert entry["version"] == 2 and entry["modules"] == identity.modules_record(recipe_of())
    monkeypatch.setattr(identity, "PACKAGE", edited_package(tmp_path) / "perencode")
    record = identity.read(run)
    assert record is not None
    changes = identity.code_changes(record, recipe_of())
    assert len(changes) == 1 and changes[0].startswith(
        "the code of perencode module perencode.kinds.models.base changed since the run was made")
    edited = identity.modules_record(recipe_of())
    assert identity.fingerprint(entry["recipe"], entry["code"], None, edited) \
        != entry["fingerprint"] == identity.fingerprint(entry["recipe"], entry["code"], None,
                                                        entry["modules"])
    with pytest.raises(UserError, match=r"perencode.kinds.models.base changed since the run was "
                       r"made.*`perencode eval --accept-code`"):
        identity.check(run, recipe_of(), "eval")


@pytest.mark.slow
@pytest.mark.compat
def test_an_edit_to_planning_is_no_change_of_a_runs_code(tmp_path, monkeypatch):
    """The loop imports planning (its memory check), but planning's estimates change no
    number a run records: an edit to its GPU table leaves the run's code as it was, while an
    edit to the model code beside it does not."""
    before = identity.modules_record(recipe_of())
    root = tmp_path / "edited"
    shutil.copytree(ROOT / "perencode", root / "perencode",
                    ignore=shutil.ignore_patterns("__pycache__"))
    planning = root / "perencode" / "training" / "planning.py"
    text = planning.read_text()
    assert '"a100": GPU(' in text
    planning.write_text(text.replace('"a100": GPU(', '"a100": GPU(  # edited\n', 1)
                        + "\nEDITED = True\n")
    monkeypatch.setattr(identity, "PACKAGE", root / "perencode")
    assert identity.modules_record(recipe_of()) == before
    monkeypatch.setattr(identity, "PACKAGE", edited_package(tmp_path / "b") / "perencode")
    changed = identity.modules_record(recipe_of())
    assert [m for m in before if changed[m] != before[m]] == ["perencode.kinds.models.base"]


@pytest.mark.slow
@pytest.mark.compat
def test_an_edit_after_a_first_record_is_in_the_next(tmp_path, monkeypatch):
    """The import closure is found once per process, and found again when one of its files
    changes: an edited module's hash is new, and a module a file newly imports joins."""
    root = tmp_path / "copy"
    shutil.copytree(ROOT / "perencode", root / "perencode",
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(identity, "PACKAGE", root / "perencode")
    before = identity.modules_record(recipe_of())
    assert identity.modules_record(recipe_of()) == before

    def edit(path: Path, old: str, new: str) -> None:
        text = path.read_text()
        assert old in text
        stamp = path.stat().st_mtime_ns
        path.write_text(text.replace(old, new, 1))
        os.utime(path, ns=(stamp + 10**9, stamp + 10**9))  # a later time, whatever the clock

    edit(root / "perencode" / "kinds" / "models" / "base.py", BASE_LINE,
         BASE_LINE[:-1] + " * 2)")
    edited = identity.modules_record(recipe_of())
    assert [m for m in before if edited[m] != before[m]] == ["perencode.kinds.models.base"]
    assert "perencode.analysis.plots" not in edited
    edit(root / "perencode" / "training" / "session.py", "\nimport ",
         "\nimport perencode.analysis.plots\nimport ")
    joined = identity.modules_record(recipe_of())
    assert "perencode.analysis.plots" in joined and joined["perencode.training.session"] \
        != edited["perencode.training.session"]
    (root / "perencode" / "analysis" / "plots.py").unlink()  # gone: it and what only it imports
    assert set(identity.modules_record(recipe_of())) == set(edited) < set(joined)


@pytest.mark.slow
def test_eval_resume_and_stability_refuse_edited_shared_code(run, tmp_path):
    """Another process, with models/base.py edited: eval (and a resumed train) refuse,
    naming the module; --accept-code scores and records it; a new run of the same recipe
    with the edit has another fingerprint."""
    edited = edited_package(tmp_path)
    env = {"PYTHONPATH": str(edited)}
    scored = (run / "eval.json").read_bytes()
    (run / "status.json").unlink()  # and an unfinished copy, to be resumed
    unfinished = tmp_path / "unfinished"
    shutil.copytree(run, unfinished)
    (unfinished / "eval.json").unlink()
    (unfinished / "checkpoints" / "step-10.pt").unlink()
    env_json = json.loads((unfinished / "env.json").read_text())
    del env_json["end_time"]
    (unfinished / "env.json").write_text(json.dumps(env_json))
    for command, where in ((["eval", run, "--device", "cpu"], run),
                           (tiny(unfinished), unfinished)):
        code, text = perencode(*command, env=env, cwd=tmp_path)
        line = one_line(text)
        assert code == 2 and f"{where}: the code of perencode module perencode.kinds.models.base " \
            "changed since the run was made" in line \
            and f"`perencode {command[0]} --accept-code`" in line, text
    assert (run / "eval.json").read_bytes() == scored
    code, text = perencode("eval", run, "--device", "cpu", "--accept-code", env=env,
                           cwd=tmp_path)
    assert code == 0, text
    result = json.loads((run / "eval.json").read_text())
    assert "perencode.kinds.models.base" in result["code_changes_accepted"][0]
    accepted = json.loads((run / "identity.json").read_text())["accepted"]
    assert [(a["command"], a["kind"]) for a in accepted] == [("eval", "code")]
    other = tmp_path / "other"
    code, text = perencode(*tiny(other), env=env, cwd=tmp_path)
    assert code == 0, text
    assert identity.short(other) != identity.short(run)


METRICS = {"accuracy": 0.5, "token_accuracy": 0.5, "dl_distance": 1.0}


@pytest.mark.slow
@pytest.mark.compat
def test_figures_mark_a_cell_whose_runs_differ_in_code(tmp_path):
    for seed in (111, 222, 333):
        fake_run(tmp_path, f"seed{seed}", seed=seed, metrics=METRICS)
    path = tmp_path / "seed222" / "identity.json"
    entry = json.loads(path.read_text())
    entry["modules"]["perencode.kinds.models.base"] = "0" * 64  # made by other code
    path.write_text(json.dumps(entry))
    results = collect([tmp_path])
    marked = results.runs.set_index("run")["code_differs"]
    assert marked.to_dict() == {str(tmp_path / f"seed{s}"): True for s in (111, 222, 333)}
    assert len(results.mixed_code) == 1 and "made by different code" in results.mixed_code[0]
    code, text = run_cli("figures", tmp_path, "--out", tmp_path / "f")
    assert code == 0 and "runs of one cell made by different code" in " ".join(text.split())
    assert "code_differs" in (tmp_path / "f" / "results.csv").read_text().splitlines()[0]
    code, text = run_cli("report", tmp_path, "--claims", "quick", "--out", tmp_path / "r")
    assert code == 0 and "(runs of one cell made by different code)" \
        in (tmp_path / "r" / "report.html").read_text(), text
    entry["modules"]["perencode.kinds.models.base"] = identity.modules_record(
        validate({"model": {"arch": "gru"}}, "x"))["perencode.kinds.models.base"]
    path.write_text(json.dumps(entry))
    assert collect([tmp_path]).mixed_code == []


# --------------------------------------------------------------------------------------
# 2. Logits or metrics that are not finite at evaluation
# --------------------------------------------------------------------------------------

def _nan_head(path: Path) -> None:
    state = torch.load(path, weights_only=True)
    key = next(k for k in state["model"] if k.startswith("head") and k.endswith("weight"))
    state["model"][key] = torch.full_like(state["model"][key], float("nan"))
    torch.save(state, path)


def test_eval_never_overwrites_a_finite_result_with_scores_of_nan_logits(run):
    before = (run / "eval.json").read_bytes()
    _nan_head(run / "checkpoints" / "step-10.pt")
    code, text = run_cli("eval", run, "--device", "cpu")
    line = one_line(text)
    assert code == runs.DIVERGED_EXIT and "diverged at evaluation after iteration 10: logits " \
        "are not finite" in line and "nothing is scored" in line, text
    assert (run / "eval.json").read_bytes() == before


def test_a_final_evaluation_of_nan_logits_is_a_divergence(tmp_path, monkeypatch):
    import perencode.training.session as session

    real = session.output_logits
    monkeypatch.setattr(session, "output_logits",
                        lambda model, batch: real(model, batch) * float("nan"))
    with pytest.raises(Diverged, match="diverged at iteration 10: logits are not finite at "
                       "evaluation"):
        train(recipe_of(), tmp_path / "run", "cpu", progress=False)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == runs.DIVERGED and status["iteration"] == 10
    assert not (tmp_path / "run" / "eval.json").exists()


# --------------------------------------------------------------------------------------
# 4. eval.json checked like recipe.toml
# --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("seeds")
    for seed in (1, 2):
        finished_run(root / f"seed{seed}", *SHORT, f"train.seed={seed}")
    return root


@pytest.mark.slow
@pytest.mark.compat
def test_a_foreign_or_edited_eval_json_is_refused(seeds, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(seeds, root)
    assert json.loads((root / "seed1" / "status.json").read_text())["eval_sha256"]
    assert run_cli("figures", root, "--out", tmp_path / "ok")[0] == 0
    target = root / "seed2" / "eval.json"
    own = target.read_bytes()
    shutil.copy(root / "seed1" / "eval.json", target)  # another run's file
    commands = (["figures", root, "--out", tmp_path / "f"],
                ["verify", root, "--claims", "quick", "--out", tmp_path / "v"],
                ["report", root, "--claims", "quick", "--out", tmp_path / "r"],
                tiny(root / "seed2", "train.seed=2"))
    for command in commands:
        code, text = run_cli(*command)
        line = one_line(text)
        assert code == 2 and f"{target}: the result of another run (seed 1 (the run's is 2))" \
            in line, (command, text)
    data = json.loads(own)
    data["token_accuracy"] = 0.99  # a hand edit
    target.write_text(json.dumps(data))
    for command in commands:
        code, text = run_cli(*command)
        line = one_line(text)
        assert code == 2 and f"{target}: not the eval.json this run wrote" in line \
            and f"`perencode eval {root / 'seed2'}`" in line, (command, text)
    # `eval` writes it again, and records the new file's hash.
    assert run_cli("eval", root / "seed2", "--device", "cpu")[0] == 0
    assert target.read_bytes() == own
    assert run_cli("figures", root, "--out", tmp_path / "f")[0] == 0
    assert mismatches(root / "seed2", runs.read_recipe(root / "seed2", any_kind=True)) == []


def test_show_mismatches_say_what_no_longer_matches(run):
    # store.summary.mismatches, the checks `show` warns with (formerly store.runs.integrity,
    # which only this test called)
    assert mismatches(run, runs.read_recipe(run, any_kind=True)) == []
    path = run / "recipe.toml"
    path.write_text(path.read_text().replace("hidden_size = 16", "hidden_size = 32"))
    data = json.loads((run / "eval.json").read_text())
    data["token_accuracy"] = 1.0
    (run / "eval.json").write_text(json.dumps(data))
    found = mismatches(run, runs.read_recipe(run, any_kind=True))
    assert len(found) == 2 and "was edited after the run was made (model.hidden_size" \
        in found[0] and "not the eval.json this run wrote" in found[1]


# --------------------------------------------------------------------------------------
# 5. A finished run is never trained again, whatever file is missing
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("lost", [("eval.json",), ("eval.json", "status.json")])
def test_a_pruned_run_without_its_result_is_not_trained_again(run, lost):
    assert run_cli("prune", run)[0] == 0
    for name in lost:
        (run / name).unlink()
    metrics = (run / "metrics.jsonl").read_bytes()
    code, text = run_cli(*tiny(run))
    line = one_line(text)
    assert code == 2 and f"{run}: finished at iteration 10, but its eval.json is missing; " \
        "not trained again: its checkpoints were deleted (pruned): restore it from a copy " \
        "of the run" in line, text
    assert (run / "metrics.jsonl").read_bytes() == metrics
    assert not list(run.glob("checkpoints/*.pt"))
    code, text = run_cli("figures", run, "--out", run.parent / "f")
    assert code == 0 and "finished, but its eval.json is missing" in " ".join(text.split())


def test_a_run_without_its_result_keeps_its_checkpoints_to_score_it_again(run):
    (run / "eval.json").unlink()
    code, text = run_cli("prune", run)
    assert code == 0 and "eval.json is missing: its checkpoints score it again" \
        in " ".join(text.split()), text
    code, text = run_cli(*tiny(run))
    assert code == 2 and f"`perencode eval {run}` scores the final checkpoint again" \
        in one_line(text), text
    assert run_cli("eval", run, "--device", "cpu")[0] == 0
    code, text = run_cli(*tiny(run))
    assert code == 0 and "run is already complete" in " ".join(text.split()), text


def test_the_sweep_plans_what_it_trains_for_a_run_without_its_result(tmp_path):
    from perencode.commands.sweep.cells import RunState, plan, prepare
    from perencode.config.grid import load_grid

    grid_path = tmp_path / "grid.toml"
    grid_path.write_text(f'base = "{RECIPE}"\n[model]\nhidden_size = 16\nembed_size = 16\n'
                         '[task]\nvocab_size = 16\nlength = 6\nheld_out = 32\n'
                         '[train]\niterations = 10\ncheckpoint_every = 5\nbatch_size = 8\n'
                         'log_every = 5\n[grid]\n"train.seed" = [1]\n')
    grid = load_grid(grid_path)
    planned = plan(grid, tmp_path / "runs")
    prepare(planned)
    cell = planned[0].dir
    assert run_cli("train", cell / "recipe.toml", "--run-dir", cell, "--device", "cpu",
                   "--no-progress")[0] == 0
    assert run_cli("prune", cell)[0] == 0
    (cell / "eval.json").unlink()
    again = plan(grid, tmp_path / "runs")[0]
    assert again.state == RunState.DONE and not any(c[0] == "train" for c in again.commands)
    assert "eval.json is missing: not trained again" in again.message
    code, text = run_cli("sweep", grid_path, "--runs", tmp_path / "runs", "--dry-run")
    assert code == 0 and "0 to train" in " ".join(text.split()), text


# --------------------------------------------------------------------------------------
# 7. No run inside another run's directory
# --------------------------------------------------------------------------------------

def test_a_run_directory_inside_another_run_is_refused(run):
    inner = run / "nested" / "inner"
    code, text = run_cli(*tiny(inner))
    line = one_line(text)
    assert code == 2 and f"{inner}: inside the run directory {run}" in line, text
    assert not inner.exists()


# --------------------------------------------------------------------------------------
# 9. The minor cases
# --------------------------------------------------------------------------------------

def test_an_absurd_number_of_iterations_is_refused(tmp_path):
    code, text = run_cli(*tiny(tmp_path / "run", "train.iterations=1e18"))
    assert code == 2 and "train.iterations" in one_line(text) \
        and "1000000000" in one_line(text), text


def test_prune_of_a_file_and_a_loop_of_links_say_what_they_are(run, tmp_path):
    code, text = run_cli("prune", run / "eval.json")
    assert code == 2 and "a file, not a run directory" in one_line(text), text
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    code, text = run_cli("figures", loop, "--out", tmp_path / "f")
    assert code == 2 and f"{loop}: a loop of symbolic links" in one_line(text), text


def test_a_damaged_file_is_named_once_per_command(run):
    (run / "status.json").write_text("{bad")
    code, text = run_cli(*tiny(run))
    assert code == 0 and " ".join(text.split()).count("status.json: not valid JSON") == 1, text


PLUGIN = '''
from perencode.config.registry import EncodingKind, register_encoding

CALLS = []


def itself(x):
    CALLS.append(1)
    if len(CALLS) > 6:  # mid-training: a bug its first steps did not meet
        raise RuntimeError("copy broke")
    return x


register_encoding(EncodingKind("broken_copy", label="Copy", vectors=itself))
'''


@pytest.mark.slow  # a perencode process: in make test and test-compat, not test-fast
@pytest.mark.compat
def test_a_plugin_raising_while_training_is_named_in_one_line(tmp_path):
    plugin = tmp_path / "broken_copy.py"
    plugin.write_text(PLUGIN)
    run = tmp_path / "run"
    code, text = perencode("--plugin", plugin, *tiny(run, "encoding.kind=broken_copy"),
                           cwd=tmp_path)
    line = one_line(text)
    assert code == 2 and f"{run}: plugin broken_copy raised RuntimeError: copy broke at " \
        f"iteration 7; the last complete checkpoint is {run / 'checkpoints/step-5.pt'}" \
        in line, text


# --------------------------------------------------------------------------------------
# 3. Figure files are named from the figure's name
# --------------------------------------------------------------------------------------

def test_settings_never_share_a_file_name():
    import pandas as pd

    from perencode.analysis.plots import named, settings

    values = [1e-2, 1e-1, -1.5, 1.5, 1e-20, 2e-20, "a b", "a_b", "x.y"]
    df = pd.DataFrame({"optim.lr": values, "model.arch": ["gru"] * len(values)})
    parts, _ = settings(df, ["optim.lr", "model.arch"], ["model.arch"])
    stems = [f"fig02{suffix}" for suffix, _ in parts]
    files = {named(Path("out") / stem, ".png") for stem in stems}
    assert len(files) == len(values)
    assert Path("out/fig02__lr=0.01.png") in files and Path("out/fig02__lr=1e-20.png") in files
    assert all(path.name.endswith(".png") and path.name[:-4] in stems for path in files)


@pytest.mark.slow
@pytest.mark.compat
def test_figures_of_a_float_axis_keep_every_file_and_the_report_shows_them(tmp_path):
    root = tmp_path / "runs"
    for lr in (1e-2, 1e-1):
        for seed in (111, 222):
            recipe = validate({"task": {"name": "reverse", "vocab_size": 32, "length": 64},
                               "model": {"arch": "gru", "hidden_size": 16},
                               "optim": {"lr": lr},
                               "train": {"iterations": 200, "seed": seed, "log_every": 100}},
                              "lr")
            fake_run(root, f"lr{lr}/{seed}", recipe=recipe, metrics=METRICS)
    code, text = run_cli("report", root, "--claims", "quick", "--out", tmp_path / "r")
    assert code == 0, text
    pngs = sorted(p.name for p in (tmp_path / "r").glob("fig02*.png"))
    assert pngs == ["fig02_reverse_vocabulary__lr=0.01__nonpaper.png",
                    "fig02_reverse_vocabulary__lr=0.1__nonpaper.png"]
    page = (tmp_path / "r" / "report.html").read_text()
    assert all(f'id="{name[:-4]}"' in page for name in pngs)


@pytest.mark.slow
@pytest.mark.compat
def test_stability_of_a_pruned_run_says_it_kept_its_file_only(tmp_path):
    from conftest import fitting
    from test_stability import TINY_DUAL

    run = tmp_path / "dual"
    sets = [a for item in fitting(TINY_DUAL) for a in ("--set", item)]
    assert run_cli("train", ROOT / "recipes/gru_dualfreq_vocab64.toml", *sets, "--run-dir",
                   run, "--device", "cpu", "--no-progress")[0] == 0
    code, text = run_cli("stability", run, "--triplets", 4, "--device", "cpu",
                         "--no-progress")
    assert code == 0 and f"wrote {run / 'stability.csv'}" in " ".join(text.split()), text
    assert run_cli("prune", run)[0] == 0
    code, text = run_cli("stability", run, "--triplets", 4, "--device", "cpu",
                         "--no-progress")
    flat = " ".join(text.split())
    assert code == 0 and "is kept as it is" in flat and "wrote" not in flat, text


def test_a_damaged_result_of_a_pruned_run_is_not_sent_to_eval(run, tmp_path):
    assert run_cli("prune", run)[0] == 0
    (run / "eval.json").write_text("{}")
    code, text = run_cli("figures", run, "--out", tmp_path / "f")
    line = one_line(text)
    assert code == 2 and "its checkpoints were deleted (pruned): restore it from a copy of " \
        "the run" in line and "perencode eval" not in line, text
