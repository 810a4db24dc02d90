"""A run's identity (perencode.store.identity): the code, data and recipe that made it, recorded in
RUN_DIR/identity.json and checked by every command that reads the run. The plugin cases use
real processes (a plugin is loaded per process): one trains, the code changes, another
scores."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import RECIPE, ROOT, finished_run, fitting, run_cli, tiny_overrides
from conftest import train_args as tiny_train_args
from test_lm import MAX_TOKENS, VOCAB, prepare_cli
from test_plugins import error_line, perencode
from test_stability import TINY_DUAL

from perencode.commands.rehearsal import write_corpus as make_corpus
from perencode.common.errors import UserError
from perencode.config import registry
from perencode.config.recipe import validate
from perencode.store import identity, records

pytestmark = pytest.mark.forked_children  # the sweep's children as forks (tests/forked.py)

SHORT = ["train.iterations=10", "train.checkpoint_every=5", "task.vocab_size=16",
         "task.length=6"]

RAMP = '''
import torch
from perencode.config.registry import EncodingKind, register_encoding


def ramp(positions, dim):
    return torch.linspace(0.0, 1.0, positions)[:, None].expand(positions, dim).clone()


register_encoding(EncodingKind("{name}", label="Ramp", table=ramp))
'''
SHADOW = '''
import torch
from perencode.config.registry import EncodingKind, register_encoding

register_encoding(EncodingKind("sinusoidal", label="Zeros", table=lambda t, d: torch.zeros(t, d)))
'''


def train_args(run: Path, *extra: str) -> list:
    return tiny_train_args(run, *SHORT, *extra)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A finished tiny run of a built-in recipe (sinusoidal GRU)."""
    return finished_run(tmp_path_factory.mktemp("made") / "run", *SHORT)


@pytest.fixture
def run(made, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(made, copy)
    return copy


def one_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1, text
    return error_line(lines[0])


# --------------------------------------------------------------------------------------
# Item 2: code identity
# --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_plugin_cannot_take_a_builtin_name(run, tmp_path):
    shadow = tmp_path / "shadow.py"
    shadow.write_text(SHADOW)
    before = (run / "eval.json").read_bytes()
    code, text = perencode("--plugin", shadow, "eval", run, "--device", "cpu")
    line = one_line(text)
    assert code == 2 and "encoding.kind = 'sinusoidal' is registered by perencode " \
        "(perencode.kinds.encoding) and again by plugin shadow" in line \
        and str(shadow) in line, text
    assert (run / "eval.json").read_bytes() == before


@pytest.mark.slow
def test_two_plugins_cannot_register_one_name(tmp_path):
    first, second = tmp_path / "ramp_a.py", tmp_path / "ramp_b.py"
    first.write_text(RAMP.format(name="ramp"))
    second.write_text(RAMP.format(name="ramp"))
    code, text = perencode("--plugin", first, "--plugin", second, "show", RECIPE)
    line = one_line(text)
    assert code == 2 and f"encoding.kind = 'ramp' is registered by plugin ramp_a ({first}) " \
        f"and again by plugin ramp_b ({second})" in line, text


def test_a_name_stays_with_its_first_registration():
    with pytest.raises(UserError, match=r"'sinusoidal' is registered by perencode "
                       r"\(perencode.kinds.encoding\) and again by module test_identity"):
        registry.register_encoding(registry.EncodingKind("sinusoidal", label="Mine"))
    assert registry.ENCODINGS["sinusoidal"].label == "Position-Encoded"
    assert registry.ORIGINS.get(("encoding", "sinusoidal")) is None


@pytest.mark.slow
def test_an_edited_loose_plugin_is_refused_until_accepted(tmp_path):
    plugin = tmp_path / "my_ramp.py"
    plugin.write_text(RAMP.format(name="my_ramp"))
    run = tmp_path / "run"
    code, text = perencode("--plugin", plugin, *train_args(run, "encoding.kind=my_ramp"))
    assert code == 0, text
    scored = (run / "eval.json").read_bytes()
    recorded = json.loads((run / "identity.json").read_text())["code"]["encoding"]
    assert recorded["origin"] == "plugin" and recorded["file"] == str(plugin)
    # A comment or a docstring is no change; a changed forward is.
    plugin.write_text('"""Ramp."""\n# a note\n' + RAMP.format(name="my_ramp"))
    code, text = perencode("--plugin", plugin, "eval", run, "--device", "cpu")
    assert code == 0, text
    plugin.write_text(RAMP.format(name="my_ramp").replace("0.0, 1.0", "0.0, 2.0"))
    run_dir = tmp_path / "other"
    shutil.copytree(run, run_dir)
    (run_dir / "eval.json").write_bytes(scored)
    for command in (["eval", run_dir, "--device", "cpu"], [*train_args(run_dir)[:1], RECIPE,
                    "--run-dir", run_dir, "--device", "cpu", "--no-progress",
                    *tiny_overrides(*SHORT, "encoding.kind=my_ramp")]):
        code, text = perencode("--plugin", plugin, *command)
        line = one_line(text)
        assert code == 2 and "encoding.kind = 'my_ramp': the code of plugin my_ramp " \
            f"({plugin}) changed since the run was made" in line \
            and f"`perencode {command[0]} --accept-code`" in line, text
    assert (run_dir / "eval.json").read_bytes() == scored
    # figures reads the numbers the recorded code computed: it compares the runs' code with
    # each other (one run here), not with the code loaded now.
    code, text = perencode("--plugin", plugin, "figures", run_dir, "--out", tmp_path / "f")
    assert code == 0 and "error" not in text, text
    code, text = perencode("--plugin", plugin, "eval", run_dir, "--device", "cpu",
                           "--accept-code")
    assert code == 0, text
    result = json.loads((run_dir / "eval.json").read_text())
    assert "changed since the run was made" in result["code_changes_accepted"][0]
    accepted = json.loads((run_dir / "identity.json").read_text())["accepted"]
    assert [a["command"] for a in accepted] == ["eval"]
    # figures, verify and report go on when asked to, and say so.
    out = tmp_path / "report"
    code, text = perencode("--plugin", plugin, "report", run_dir, "--claims", "quick",
                           "--out", out, "--accept-code")
    assert code == 0, text
    assert "code_changes_accepted" in (out / "results.csv").read_text().splitlines()[0]
    assert "(other code accepted)" in (out / "report.html").read_text()


def _installed(site: Path, version: str, top: float) -> None:
    """A tiny installed package `ramp_pkg` (its dist-info and entry point, as pip leaves
    them) at `version`, whose encoding ramps from 0 to `top`."""
    for old in site.glob("ramp_pkg-*.dist-info"):
        shutil.rmtree(old)
    package = site / "ramp_pkg"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(RAMP.format(name="pkg_ramp")
                                         .replace("0.0, 1.0", f"0.0, {top}"))
    info = site / f"ramp_pkg-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: ramp-pkg\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("[perencode.kinds]\npkg_ramp = ramp_pkg\n")
    (info / "top_level.txt").write_text("ramp_pkg\n")


@pytest.mark.slow
def test_an_installed_plugin_at_another_version_is_refused(tmp_path):
    site = tmp_path / "site"
    _installed(site, "0.1.0", 1.0)
    env = {"PYTHONPATH": f"{site}:{ROOT}"}
    run = tmp_path / "run"
    code, text = perencode(*train_args(run, "encoding.kind=pkg_ramp"), env=env, autoload=True)
    assert code == 0, text
    recorded = json.loads((run / "identity.json").read_text())["code"]["encoding"]
    assert (recorded["package"], recorded["version"]) == ("ramp-pkg", "0.1.0")
    _installed(site, "0.2.0", 2.0)
    code, text = perencode("eval", run, "--device", "cpu", env=env, autoload=True)
    line = one_line(text)
    assert code == 2 and "encoding.kind = 'pkg_ramp': the code of plugin ramp_pkg " \
        "(ramp-pkg 0.2.0) changed since the run was made" in line \
        and "version 0.1.0 then, 0.2.0 now" in line, text


def test_source_hash_ignores_comments_and_docstrings_only(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f(x):\n    return x + 1\n")
    plain = identity.source_hash([path])
    path.write_text('"""Doc."""\n\n\ndef f(x):  # note\n    """Adds one."""\n\n    return x + 1\n')
    assert identity.source_hash([path]) == plain
    path.write_text("def f(x):\n    return x + 2\n")
    assert identity.source_hash([path]) != plain


# --------------------------------------------------------------------------------------
# Item 3: data identity
# --------------------------------------------------------------------------------------

LM = ["--set", f"task.vocab_size={VOCAB}", "--set", f"task.length={MAX_TOKENS}",
      "--set", "model.hidden_size=16", "--set", "model.embed_size=16",
      "--set", "train.iterations=10", "--set", "train.batch_size=8",
      "--set", "train.checkpoint_every=5", "--set", "train.log_every=5",
      "--set", "train.eval_batch_size=8", "--set", "optim.warmup=2"]


@pytest.mark.slow
def test_a_language_model_run_keeps_its_data(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    make_corpus(corpus)
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    prepare_cli(corpus, here / "lmdata")
    shutil.copytree(here / "lmdata", elsewhere / "lmdata")
    (elsewhere / "lmdata" / "valid.idx").write_bytes(b"")  # another, broken folder
    monkeypatch.chdir(here)
    run = here / "run"
    code, text = run_cli("train", ROOT / "recipes/lstm_wikitext103_pe.toml", "--run-dir", "run",
                         "--device", "cpu", "--no-progress", "--set", "task.data='lmdata'", *LM)
    assert code == 0, text
    # The relative folder is resolved when the run is made: the run keeps the absolute one.
    assert f'data = "{here / "lmdata"}"' in (run / "recipe.toml").read_text()
    data = json.loads((run / "identity.json").read_text())["data"]
    assert data["path"] == str(here / "lmdata") and len(data["manifest_sha256"]) == 64 \
        and len(data["content_sha256"]) == 64
    scored = json.loads((run / "eval.json").read_text())
    # From another folder with its own ./lmdata, in another process: the run's data.
    code, text = perencode("eval", run, "--device", "cpu", cwd=elsewhere)
    assert code == 0, text
    assert json.loads((run / "eval.json").read_text()) == scored
    # The same data rebuilt (another manifest: its time, timings and log differ): the same
    # data, accepted; a copy built elsewhere is the same data too (one fingerprint).
    manifest = (here / "lmdata" / "manifest.json").read_bytes()
    shutil.rmtree(here / "lmdata")
    prepare_cli(corpus, here / "lmdata")
    assert (here / "lmdata" / "manifest.json").read_bytes() != manifest
    code, text = run_cli("eval", run, "--device", "cpu")
    assert code == 0, text
    assert json.loads((run / "eval.json").read_text()) == scored
    prepare_cli(corpus, tmp_path / "again")
    entry = json.loads((run / "identity.json").read_text())
    again = validate({**entry["recipe"], "task": {**entry["recipe"]["task"],
                                                  "data": str(tmp_path / "again")}}, "again")
    copy = identity.data_record(again)
    assert copy is not None and copy["content_sha256"] == data["content_sha256"]
    assert identity.fingerprint(again.identity(), entry["code"], copy,
                                entry["modules"]) == entry["fingerprint"]
    # The data rebuilt in place (from another version of the corpus): refused.
    newer = tmp_path / "newer"
    newer.mkdir()
    make_corpus(newer, seed=1)
    result = run_cli("lm-prepare", "--source", newer, "--out", here / "lmdata", "--vocab-size",
                     VOCAB, "--max-tokens", MAX_TOKENS, "--threads", 1, "--no-progress")
    assert result[0] == 0 and "(rebuilt)" in result[1], result[1]
    before = (run / "eval.json").read_bytes()
    for command in (["eval", run, "--device", "cpu"],
                    ["train", run / "recipe.toml", "--run-dir", run, "--device", "cpu"]):
        code, text = run_cli(*command)
        line = one_line(text)
        assert code == 2 and f"{run}: its data {here / 'lmdata'} changed since the run was " \
            "made (content" in line and f"`perencode {command[0]} --accept-data`" in line, text
    assert (run / "eval.json").read_bytes() == before
    code, text = run_cli("eval", run, "--device", "cpu", "--accept-data")
    assert code == 0, text
    accepted = json.loads((run / "identity.json").read_text())["accepted"]
    assert [(a["command"], a["kind"]) for a in accepted] == [("eval", "data")]
    assert "its data" in json.loads((run / "eval.json").read_text())["code_changes_accepted"][0]


# --------------------------------------------------------------------------------------
# Item 6: a hand-edited recipe.toml
# --------------------------------------------------------------------------------------

def test_an_edited_recipe_is_noticed_by_every_command(run, tmp_path):
    path = run / "recipe.toml"
    path.write_text(path.read_text().replace('kind = "sinusoidal"', 'kind = "none"'))
    before = (run / "eval.json").read_bytes()
    for command in (["train", path, "--run-dir", run, "--device", "cpu"],
                    ["eval", run, "--device", "cpu"],
                    ["figures", run, "--out", tmp_path / "f"],
                    ["verify", run, "--claims", "quick", "--out", tmp_path / "v"],
                    ["report", run, "--claims", "quick", "--out", tmp_path / "r"]):
        code, text = run_cli(*command)
        line = one_line(text)
        assert code == 2 and f"{path} was edited after the run was made (encoding.kind: " \
            "'sinusoidal' when the run was made vs 'none' now)" in line, (command, text)
    assert (run / "eval.json").read_bytes() == before


def test_stability_notices_an_edited_recipe(tmp_path):
    run = tmp_path / "dual"
    sets = [a for item in fitting(TINY_DUAL) for a in ("--set", item)]
    code, text = run_cli("train", ROOT / "recipes/gru_dualfreq_vocab64.toml", *sets,
                         "--run-dir", run, "--device", "cpu", "--no-progress")
    assert code == 0, text
    path = run / "recipe.toml"
    path.write_text(path.read_text().replace("hidden_size = 16", "hidden_size = 32"))
    code, text = run_cli("stability", run, "--triplets", 4, "--device", "cpu", "--no-progress")
    assert code == 2 and "model.hidden_size: 16 when the run was made vs 32 now" \
        in one_line(text), text
    assert not (run / "stability.csv").exists()


# --------------------------------------------------------------------------------------
# Item 8: one fingerprint per run; runs made before the record
# --------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.compat
def test_one_fingerprint_shown_compared_and_reported(made, tmp_path):
    entry = json.loads((made / "identity.json").read_text())
    fingerprint = entry["fingerprint"]
    assert len(fingerprint) == 12 and entry["code"]["encoding"]["origin"] == "perencode"
    code, text = run_cli("show", made)
    assert code == 0 and f"\n# fingerprint: {fingerprint} " in text \
        and "encoding.kind = 'sinusoidal': perencode (perencode.kinds.encoding)" in text, text
    # The same experiment elsewhere: the same fingerprint; another seed: another.
    same, seed = tmp_path / "same", tmp_path / "seed"
    assert run_cli(*train_args(same))[0] == 0
    assert run_cli(*train_args(seed, "train.seed=5"))[0] == 0
    assert identity.short(same) == fingerprint != identity.short(seed)
    code, text = run_cli("report", made, "--claims", "quick", "--out", tmp_path / "r")
    assert code == 0, text
    page = (tmp_path / "r" / "report.html").read_text()
    assert f"<dt>fingerprints</dt><dd>{fingerprint}</dd>" in page


@pytest.mark.slow
@pytest.mark.compat
def test_a_run_made_before_the_record_is_read_with_a_note(run, tmp_path):
    (run / "identity.json").unlink()
    scored = json.loads((run / "eval.json").read_text())
    code, text = run_cli("eval", run, "--device", "cpu")
    assert code == 0 and f"note: {run}: no identity.json (made before perencode recorded" \
        in " ".join(text.split()), text
    assert json.loads((run / "eval.json").read_text()) == scored
    code, text = run_cli("figures", run, "--out", tmp_path / "f")
    assert code == 0 and "1 run(s) have no identity.json" in " ".join(text.split()), text
    assert "unverified" in (tmp_path / "f" / "results.csv").read_text()
    code, text = run_cli("show", run)
    assert code == 0 and "\n# fingerprint: unverified" in text, text
    assert not (run / "identity.json").exists()  # no past is made up


def test_an_old_unfinished_run_resumes_with_a_note(tmp_path):
    run = tmp_path / "run"
    code, _ = run_cli(*train_args(run, 'train.keep_checkpoints="all"'))
    assert code == 0
    whole = json.loads((run / "eval.json").read_text())
    # An unfinished run of a perencode before identity.json and status.json: stopped after
    # its checkpoint of iteration 5 (no end time, no later metrics row).
    for name in ("eval.json", "identity.json", "status.json", "checkpoints/step-10.pt"):
        (run / name).unlink()
    env = json.loads((run / "env.json").read_text())
    del env["end_time"]
    (run / "env.json").write_text(json.dumps(env))
    rows = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text(rows[0] + "\n")
    code, text = run_cli(*train_args(run))
    assert code == 0 and "no identity.json" in text and "resuming from iteration 5" in text, text
    assert json.loads((run / "eval.json").read_text()) == whole


def test_a_claim_cut_short_before_its_recipe_is_claimed_again(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "identity.json").write_text("{}")  # a kill between the two writes of a claim
    code, text = run_cli(*train_args(run))
    assert code == 0, text
    assert json.loads((run / "identity.json").read_text())["format"] == records.IDENTITY_FORMAT
