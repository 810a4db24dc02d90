"""`perencode crosscheck`: the checks against the authors' repository (when it is on disk),
their sensitivity to one changed constant on our side, the report and the exit codes."""

import functools
import json
import math
import os
import sys
import types
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_cli

from perencode.analysis import gradient_stability as our_stability
from perencode.commands import crosscheck
from perencode.commands.crosscheck import authors as au
from perencode.commands.crosscheck import gradient_stability as stability
from perencode.commands.crosscheck import models, schedule, tasks, training
from perencode.commands.crosscheck.report import AGREE, DISAGREE, NOT_RUN, UNDECIDED, Comparison
from perencode.common.errors import UserError
from perencode.kinds import encoding
from perencode.training import session

AUTHORS = Path(os.environ.get("PERENCODE_AUTHORS_REPO",
                              ROOT.parent / "shared" / "authors" / "position-encoded_rnn"))
needs_authors = pytest.mark.skipif(
    not (AUTHORS / "code" / "model" / "rnn.py").is_file(),
    reason=f"the authors' repository is not at {AUTHORS} (set PERENCODE_AUTHORS_REPO to a "
    "clone of github.com/tkc-morita/position-encoded_rnn)")


@pytest.fixture(scope="module")
def authors():
    with au.authors_code(au.locate(AUTHORS)) as a:
        yield a


def by_name(checks: list[Comparison]) -> dict[str, Comparison]:
    return {c.name: c for c in checks}


def fake_repository(root: Path) -> Path:
    for name in au.REQUIRED:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("")
    return root


# -- locating the repository ---------------------------------------------------------------


def test_missing_and_foreign_folders_exit_2_in_one_line(tmp_path):
    code, out = run_cli("crosscheck", tmp_path / "nowhere")
    assert code == 2 and "no such folder" in out and len(out.strip().splitlines()) == 1
    (tmp_path / "code" / "model").mkdir(parents=True)
    code, out = run_cli("crosscheck", tmp_path)
    assert code == 2 and len(out.strip().splitlines()) == 1
    assert "not the authors' repository" in out and "code/model/rnn.py" in out


def test_commit_is_read_from_git_and_another_commit_warns(tmp_path):
    root = fake_repository(tmp_path)
    assert au.locate(root).commit is None and "could not be read" in au.locate(root).note
    git = root / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "packed-refs").write_text(f"# pack-refs\n{au.KNOWN_COMMIT}abcdef refs/heads/main\n")
    found = au.locate(root)
    assert found.commit == f"{au.KNOWN_COMMIT}abcdef" and found.note == ""
    (git / "refs" / "heads" / "main").write_text("0123456789abcdef\n")  # a loose ref wins
    found = au.locate(root)
    assert found.commit == "0123456789abcdef"
    assert found.note.startswith("warning:") and au.KNOWN_COMMIT in found.note
    (git / "HEAD").write_text("fedcba9876543210\n")  # detached HEAD
    assert au.locate(root).commit == "fedcba9876543210"
    assert au.locate(root / "code").root == root  # the code/ folder names the repository


def test_their_modules_are_unloaded_and_ours_put_back(tmp_path):
    root = fake_repository(tmp_path)
    (root / "code" / "model" / "__init__.py").write_text("WHO = 'theirs'\n")
    mine = types.ModuleType("model")
    sys.modules["model"] = mine
    path = list(sys.path)
    try:
        with au.authors_code(au.locate(root)) as a:
            assert a.module("model").WHO == "theirs"
        assert sys.modules["model"] is mine and sys.path == path
    finally:
        del sys.modules["model"]


def test_their_modules_are_those_whose_files_resolve_into_their_code(tmp_path):
    """A module is theirs by its file's real path: through a linked folder or a linked file
    into their code/ folder it is theirs; a file in a folder beside it is not, nor in a
    folder whose name begins as code/'s does."""
    code = tmp_path / "repo" / "code"
    code.mkdir(parents=True)
    (code / "theirs_own.py").write_text("")
    (tmp_path / "beside").mkdir()
    (tmp_path / "beside" / "code_like.py").write_text("")
    (tmp_path / "linked_folder").symlink_to(code)
    (tmp_path / "beside" / "linked_file.py").symlink_to(code / "theirs_own.py")
    (code.parent / "code_old").mkdir()  # a name that begins as theirs does
    (code.parent / "code_old" / "old.py").write_text("")
    files = {"_t_direct": code / "theirs_own.py",
             "_t_via_folder": tmp_path / "linked_folder" / "theirs_own.py",
             "_t_via_file": tmp_path / "beside" / "linked_file.py",
             "_t_beside": tmp_path / "beside" / "code_like.py",
             "_t_sibling": code.parent / "code_old" / "old.py"}
    for name, file in files.items():
        module = types.ModuleType(name)
        module.__file__ = str(file)
        sys.modules[name] = module
    try:
        found = set(au._their_modules(code)) & set(files)
        assert found == {"_t_direct", "_t_via_folder", "_t_via_file"}
    finally:
        for name in files:
            del sys.modules[name]


def test_welch_known_answers():  # Welch's p-value beside TOST in --train's row
    t, df, p = training.welch([0.9, 0.92, 0.91], [0.88, 0.93, 0.90])
    assert (t, df, p) == pytest.approx((0.4264014327, 2.6162162162, 0.7024220395), rel=1e-8)
    t, df, p = training.welch([0.5, 0.51, 0.49], [0.7, 0.71, 0.69])
    assert df == pytest.approx(4.0) and p == pytest.approx(1.648308899e-05, rel=1e-6)
    assert training.welch([1.0, 1.0], [1.0, 1.0])[2] == 1.0
    assert training.welch([1.0, 1.0], [0.5, 0.5])[2] == 0.0


# -- the report and exit codes (stand-in groups: no repository needed beyond its files) ---


def _groups(*verdicts):
    def group(verdict):
        def run(_):
            if verdict == "raise":
                raise RuntimeError("boom")
            if verdict == NOT_RUN:
                raise au.NotRun("needs something")
            error = 0.0 if verdict == AGREE else 1.0
            return [models.numeric(f"g {verdict}", "x", "y", {"fp32": 0.5, "fp64": 0.5},
                                   {"fp32": error, "fp64": error})]
        return (verdict, "what", "theirs", run)
    return tuple(group(v) for v in verdicts)


@pytest.mark.parametrize("verdicts, code", [((AGREE, NOT_RUN), 0), ((AGREE, DISAGREE), 1),
                                            ((AGREE, "raise"), 1)])
def test_exit_code_report_and_files(tmp_path, monkeypatch, verdicts, code):
    monkeypatch.setattr(crosscheck, "GROUPS", _groups(*verdicts))
    out = tmp_path / "out"
    got, text = run_cli("crosscheck", fake_repository(tmp_path / "repo"), "--out", out)
    assert got == code
    data = json.loads((out / "crosscheck.json").read_text())
    assert data["written_against"] == au.KNOWN_COMMIT and data["commit"] is None
    seen = [c["verdict"] for c in data["checks"]]
    assert seen == [AGREE if v == AGREE else NOT_RUN if v == NOT_RUN else DISAGREE
                    for v in verdicts]
    md = (out / "crosscheck.md").read_text()
    assert "| check | compared |" in md and "could not be read" in md
    if "raise" in verdicts:
        assert "could not compare: RuntimeError: boom" in md
    if NOT_RUN in verdicts:
        assert "not run: needs something" in md


def test_a_central_check_not_run_is_incomplete_not_agree(tmp_path, monkeypatch):
    def missing(_):
        raise au.NotRun("needs timm 0.9.12: pip install timm==0.9.12 --no-deps")

    agree = _groups(AGREE)[0]
    monkeypatch.setattr(crosscheck, "GROUPS", (agree, ("schedule", "x", "y", missing)))
    out = tmp_path / "out"
    got, text = run_cli("crosscheck", fake_repository(tmp_path / "repo"), "--out", out)
    assert got == crosscheck.INCOMPLETE and got not in (0, 1)
    summary = text.strip().splitlines()[-1]
    assert summary.startswith("INCOMPLETE: central checks not run: schedule (needs timm")
    assert "pip install timm==0.9.12 --no-deps" in summary and "1 agree, 0 disagree" in summary
    assert json.loads((out / "crosscheck.json").read_text())["complete"] is False
    assert "INCOMPLETE" in (out / "crosscheck.md").read_text()
    # A disagreement still exits 1, the incompleteness named beside it.
    monkeypatch.setattr(crosscheck, "GROUPS", (_groups(DISAGREE)[0],
                                               ("schedule", "x", "y", missing)))
    got, text = run_cli("crosscheck", fake_repository(tmp_path / "repo"), "--out", out)
    assert got == 1 and text.strip().splitlines()[-1].startswith("INCOMPLETE")


def test_terminal_lines_fit_80_columns():
    long = Comparison("training loop: lstm variable_length", "x" * 300, "y" * 300,
                      {"fp32": 1e-5}, {"fp32": 2e-6})
    bad = Comparison("dual_frequency: by band", "x", "y", verdict=DISAGREE, reason="r" * 500)
    shown = crosscheck.lines([long, bad], 80)
    plain = [line.replace("[green]", "").replace("[bold red]", "").replace("[/]", "")
             for line in shown]
    assert len(plain) == 2 and all(len(p) <= 80 for p in plain)
    assert plain[0].startswith("agree     training loop: lstm variable_length max error")
    assert plain[1].startswith("disagree  dual_frequency: by band") and plain[1].endswith("…")


# -- every check agrees with the authors' code ---------------------------------------------

GROUP_FUNCTIONS = [g for g in crosscheck.GROUPS if g[0] not in ("language model",)]
# ~10 s of CPU each: in make test and test-compat, not in make test-fast.
HEAVY_GROUPS = {"recipes", "language model preparation", "training loop"}
GROUP_PARAMS = [pytest.param(g, id=g[0], marks=[pytest.mark.slow, pytest.mark.compat]
                             if g[0] in HEAVY_GROUPS else []) for g in GROUP_FUNCTIONS]


@pytest.mark.slow
@pytest.mark.compat
@needs_authors
@pytest.mark.parametrize("group", GROUP_PARAMS)
def test_group_agrees_with_the_authors(authors, group):
    try:
        checks = group[3](authors)
    except au.NotRun as exc:  # timm missing: the reason names the install line
        pytest.skip(str(exc))
    assert checks
    for c in checks:
        assert c.verdict == AGREE, (c.name, c.reason)
        assert set(c.tolerance) == {"fp32", "fp64"} and set(c.error) == {"fp32", "fp64"}
        assert all(math.isfinite(v) for v in c.error.values())


@pytest.mark.slow
@pytest.mark.compat
@needs_authors
def test_documented_differences_are_named(authors):
    named = {c.name: c.difference for c in tasks.check_dual_frequency(authors)
             + tasks.check_predecessor(authors) if c.difference}
    assert set(named) == {"dual_frequency: mixed cells", "dual_frequency: test-set size",
                          "predecessor: test queries"}


@needs_authors
def test_language_model_perplexity_agrees_and_no_stand_in_is_left(authors, monkeypatch):
    from perencode.kinds.tasks.lm import LanguageModelTask
    checks = by_name(crosscheck.lm.check_lm(authors))
    assert checks["language model: perplexity"].verdict == AGREE
    vocabulary = checks["language model: vocabulary"]
    if crosscheck.lm.missing():  # torchtext is not here: the layout check says what it needs
        assert vocabulary.verdict == NOT_RUN and "torchtext 0.16.1" in vocabulary.reason
        assert "stand-ins" in checks["language model: perplexity"].theirs
        assert not [n for n in sys.modules if n.split(".")[0] in ("torchtext", "torchdata")]
    else:
        assert vocabulary.verdict == AGREE
    rows = LanguageModelTask.rows

    def first_unscored(self, split, index, device):  # a paragraph's second token not scored
        batch = rows(self, split, index, device)
        assert batch.output_mask is not None  # the LM masks padding and <unk>
        batch.output_mask[:, 0] = False
        return batch

    monkeypatch.setattr(LanguageModelTask, "rows", first_unscored)
    assert disagrees(crosscheck.lm.check_lm(authors), "language model: perplexity")


class _NoTimm:
    """A meta-path finder that makes timm not importable and not found, as without it."""

    def find_spec(self, name, path=None, target=None):
        if name == "timm" or name.startswith("timm."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


@pytest.mark.slow
@pytest.mark.compat
@needs_authors
def test_without_timm_only_the_scheduler_checks_are_not_run(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", [_NoTimm(), *sys.meta_path])
    monkeypatch.setattr(au, "_timm_folder", lambda: None)
    before = sys.modules.get("timm")
    with au.authors_code(au.locate(AUTHORS)) as a:
        for fn in (schedule.check_schedule, models.check_trajectory):
            (check,) = crosscheck._run("x", "x", "x", functools.partial(fn, a))
            assert check.verdict == NOT_RUN
            assert "pip install timm==0.9.12 --no-deps" in check.reason
            assert "perencode[crosscheck]" in check.reason
        # Their scripts still import: the task checks run their test methods.
        assert {c.verdict for c in tasks.check_fixed_length(a)} == {AGREE}
    assert sys.modules.get("timm") is before  # the stand-in is gone with their modules


# -- sensitivity: one constant changed on our side turns the matching check to disagree -----


def disagrees(checks: list[Comparison], name: str) -> bool:
    return by_name(checks)[name].verdict == DISAGREE


@needs_authors
def test_pe_base_is_seen(authors, monkeypatch):
    monkeypatch.setattr(encoding, "SINUSOIDAL_BASE", 10_001.0)
    assert disagrees(models.check_encodings(authors), "encoding: sinusoidal")
    assert disagrees(models.check_forward(authors), "forward: lstm sinusoidal")


@needs_authors
def test_s4d_gelu_is_seen(authors, monkeypatch):
    from perencode.kinds.models.s4d import S4D
    monkeypatch.setattr(S4D, "mix", lambda self, y: torch.nn.functional.glu(
        self.out_proj(torch.nn.functional.gelu(y, approximate="tanh")), dim=-1))
    checks = by_name(models.check_forward(authors))
    assert checks["forward: s4d none"].verdict == DISAGREE
    assert checks["forward: gru none"].verdict == AGREE


needs_timm = pytest.mark.skipif(au.timm_version() is None, reason=f"needs timm: "
                                f"{au.TIMM_INSTALL}")


@needs_authors
@needs_timm
def test_schedule_off_by_one_is_seen(authors, monkeypatch):
    original = schedule.learning_rate
    monkeypatch.setattr(schedule, "learning_rate", lambda k, o, n: original(k + 1, o, n))
    assert all(c.verdict == DISAGREE for c in schedule.check_schedule(authors))


@needs_authors
@needs_timm
def test_adam_eps_is_seen(authors, monkeypatch):
    original = session.make_optimizer
    monkeypatch.setattr(session, "make_optimizer",
                        lambda m, o: original(m, o.model_copy(update={"eps": 1e-8})))
    checks = models.check_trajectory(authors, steps=3, cases=[("gru", "none"), ("s4d", "none")])
    assert all(c.verdict == DISAGREE for c in checks)
    assert all(c.error["fp64"] > 1e-11 for c in checks)


@needs_authors
def test_reverse_target_and_dl_are_seen(authors, monkeypatch):
    from rapidfuzz.distance import Levenshtein

    from perencode.kinds import scoring as metrics
    from perencode.kinds.tasks.reverse import ReverseTask
    monkeypatch.setattr(metrics, "dl_distance", lambda p, t: Levenshtein.distance(p, t))
    checks = by_name(tasks.check_fixed_length(authors))
    assert checks["reverse: Damerau-Levenshtein"].verdict == DISAGREE
    assert checks["reverse: targets"].verdict == AGREE
    monkeypatch.setattr(ReverseTask, "transform", lambda self, rows: rows)
    checks = by_name(tasks.check_fixed_length(authors))
    assert checks["reverse: targets"].verdict == DISAGREE
    assert checks["sort: targets"].verdict == AGREE  # sort has its own transform


@needs_authors
def test_a_held_out_leak_is_seen(authors, monkeypatch):
    from perencode.kinds.tasks.base import SyntheticTask
    monkeypatch.setattr(SyntheticTask, "sample",
                        lambda self, n, generator: self.build(self.draw(n, generator)))
    checks = by_name(tasks.check_fixed_length(authors))
    assert checks["reverse: held-out set"].verdict == DISAGREE
    assert checks["reverse: sampling"].verdict == AGREE


@pytest.mark.slow
@pytest.mark.compat
@needs_authors
def test_rarity_and_predecessor_target_are_seen(authors, monkeypatch):
    from perencode.kinds.tasks.dual_frequency import DualFrequencyTask, half_tokens
    from perencode.kinds.tasks.predecessor import PredecessorTask

    def draw(self, n, generator):
        rare = torch.rand((n, self.L), generator=generator) < 0.25  # "three times"
        return half_tokens(rare, self.K, generator)

    monkeypatch.setattr(DualFrequencyTask, "draw", draw)
    checks = by_name(tasks.check_dual_frequency(authors))
    assert checks["dual_frequency: sampling"].verdict == DISAGREE
    assert checks["dual_frequency: test set"].verdict == AGREE
    build = PredecessorTask.build

    def successor(self, rows):  # the token after the queried one instead of before
        batch = build(self, rows)
        x, q = rows[:, :self.L], rows[:, self.L]
        batch.targets = x.gather(1, ((q + 1) % self.L)[:, None]).squeeze(1)
        batch.output_targets = batch.targets[:, None]
        return batch

    monkeypatch.setattr(PredecessorTask, "build", successor)
    assert disagrees(tasks.check_predecessor(authors), "predecessor: targets")


@needs_authors
def test_variable_length_distribution_and_targets_are_seen(authors, monkeypatch):
    from perencode.kinds.tasks.reverse import VariableLengthReverseTask

    def longer(self, n, generator):  # lengths from min_length + 1: one length never drawn
        lengths = torch.randint(self.cfg.min_length + 1, self.L + 1, (n,), generator=generator)
        return self._rows(lengths, generator)

    monkeypatch.setattr(VariableLengthReverseTask, "draw", longer)
    assert disagrees(tasks.check_variable_length(authors), "variable_length: sampling")
    monkeypatch.undo()
    build = VariableLengthReverseTask.build

    def unreversed(self, rows):  # the output in input order
        batch = build(self, rows)
        assert batch.output_mask is not None
        batch.output_targets = batch.sequences.masked_fill(~batch.output_mask, -1)
        return batch

    monkeypatch.setattr(VariableLengthReverseTask, "build", unreversed)
    assert disagrees(tasks.check_variable_length(authors), "variable_length: targets")


@needs_authors
def test_stability_weighting_is_seen(authors, monkeypatch):
    monkeypatch.setitem(our_stability.METRICS, "weighted", our_stability.METRICS["mean"])
    assert all(c.verdict == DISAGREE for c in stability.check_stability(authors))


def test_stability_metric_against_the_code_and_the_printed_eq_3_4_by_hand():
    """The stability metric has no counterpart to run in the authors' figures: a hand-worked
    case pins what docs/paper-facts.md#gradient-stability says the code computes, and shows
    Eq. 3-4 as printed differ. Rows: J^A = [[3, 4], [0, 1]], J^B = [[4, 3], [0, 2]]:
    n^A = (5, 1), n^B = (5, 2); cos = (24/25, 1); w = (25, 2) / 27, so the weighted cosine
    is (25 * 24/25 + 2 * 1) / 27 = 26/27 and the plain mean 0.98. Eq. 4: alpha^A = (5, 1)/6,
    alpha^B = (5, 2)/7; Eq. 3: sum_i alpha^A_i alpha^B_i <J^A_i, J^B_i>
    = (25/42) 24 + (2/42) 2 = 604/42."""
    A = torch.tensor([[3.0, 4.0], [0.0, 1.0]], dtype=torch.float64)
    B = torch.tensor([[4.0, 3.0], [0.0, 2.0]], dtype=torch.float64)
    assert float(our_stability.gradient_stability(A, B)) == pytest.approx(26 / 27, abs=1e-15)
    metrics = our_stability.stability_metrics(A, B)
    assert float(metrics["weighted"]) == pytest.approx(26 / 27, abs=1e-15)
    assert float(metrics["mean"]) == pytest.approx(0.98, abs=1e-15)
    assert float(metrics["printed"]) == pytest.approx(604 / 42, abs=1e-12)
    # Identical Jacobians: 1 as the weighted cosine, not 1 as printed
    # (alpha = (5, 1)/6: (25/36) 25 + (1/36) 1 = 626/36).
    same = our_stability.stability_metrics(A, A)
    assert float(same["weighted"]) == pytest.approx(1.0, abs=1e-15)
    assert float(same["printed"]) == pytest.approx(626 / 36, abs=1e-12)


# -- the whole command ---------------------------------------------------------------------


@needs_authors
@needs_timm
@pytest.mark.compat
@pytest.mark.slow
def test_crosscheck_command_agrees_and_trains(tmp_path):
    code, out = run_cli("crosscheck", AUTHORS, "--out", tmp_path, "--train", "--seeds", "2",
                        "--iterations", "20", "--no-progress")
    assert code == 0, out
    assert "crosscheck --train: 2 seeds x 2 implementations x 20 iterations" in out
    data = json.loads((tmp_path / "crosscheck.json").read_text())
    verdicts = {c["name"]: c["verdict"] for c in data["checks"]}
    assert DISAGREE not in verdicts.values()
    # 20 iterations and 2 seeds: equivalence within the margin may not be shown yet.
    assert verdicts["training: cpu"] in (AGREE, UNDECIDED)
    reason = by_name([Comparison(**c) for c in data["checks"]])["training: cpu"].reason
    assert "TOST with margin 0.05" in reason and "seeds per side give 80% power" in reason
    assert "crosscheck --train: seed 111 took" in out


def test_bad_train_shape_is_one_line(tmp_path):
    code, out = run_cli("crosscheck", fake_repository(tmp_path), "--train-shape", "huge")
    assert code == 2 and "--train-shape huge: must be one of cpu, paper" in out
    with pytest.raises(UserError):
        crosscheck.run_crosscheck(tmp_path, tmp_path / "o", train_shape="huge")
