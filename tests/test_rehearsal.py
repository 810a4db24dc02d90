"""The rehearsal's final check (perencode.commands.rehearsal.check_outputs) on a hand-made figures
folder: every claim decided or reported in verify.json, a non-empty file of every figure."""

from __future__ import annotations

import json

import pytest

from perencode.analysis.plots import FIGURES
from perencode.analysis.verdicts import FAIL, NOT_RUN, PASS, claims_file, load_claims
from perencode.commands import rehearsal
from perencode.commands.rehearsal import check_outputs
from perencode.common.errors import UserError


def left_behind(folder, verdicts: dict[str, str]) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "verify.json").write_text(json.dumps(
        {"results": [{"id": c, "verdict": v} for c, v in verdicts.items()]}))
    for figure in FIGURES:
        (folder / f"{figure.name}__nonpaper.png").write_bytes(b"png")


def test_a_complete_reproduction_passes_with_a_line_per_figure(tmp_path):
    ids = [c.id for c in load_claims(claims_file("quick"))]
    verdicts = {c: (PASS, FAIL, NOT_RUN)[i % 3] for i, c in enumerate(ids)}
    left_behind(tmp_path, verdicts)
    lines = check_outputs(tmp_path, "quick")
    counts = {v: list(verdicts.values()).count(v) for v in (PASS, FAIL, NOT_RUN)}
    assert lines[0] == (f"claims: {len(ids)} reported ({counts[PASS]} pass, {counts[FAIL]} "
                        f"fail, 0 inconclusive, {counts[NOT_RUN]} not run)")
    assert lines[1:] == [f"{f.name}: {f.name}__nonpaper.png" for f in FIGURES]


def test_a_claim_not_reported_or_a_figure_not_drawn_is_named(tmp_path):
    ids = [c.id for c in load_claims(claims_file("quick"))]
    left_behind(tmp_path, {c: PASS for c in ids[1:]})
    with pytest.raises(UserError, match=f"1 claim\\(s\\) neither decided nor reported: "
                                        f"{ids[0]}$"):
        check_outputs(tmp_path, "quick")
    left_behind(tmp_path, {c: PASS for c in ids})
    (tmp_path / f"{FIGURES[0].name}__nonpaper.png").write_bytes(b"")  # an empty file
    with pytest.raises(UserError, match=f"no file of {FIGURES[0].name}$"):
        check_outputs(tmp_path, "quick")
    (tmp_path / "verify.json").unlink()
    with pytest.raises(UserError, match="verify.json: not found"):
        check_outputs(tmp_path, "quick")


# ---- the rehearsal's own claims: every verdict path decided ----------------------------

REHEARSAL = {c.id: c for c in load_claims(claims_file("rehearsal"))}
# What each rehearsal claim gave on the rehearsal's runs (measured 2026-11-28: verdicts,
# methods as verify.json writes them, the cells combined).
MEASURED = {
    "r1-lstm-dl-above-2": (PASS, "exact sign test, one-sided, alpha = 0.3, n = 2, p = 0.25, "
                           "2 cells: fail at alpha / 2", 2),
    "r2-lstm-pe-dl-below-1": (FAIL, "exact sign test, one-sided, alpha = 0.3, n = 2", 2),
    "r3-gru-vanilla-dl-trend": (PASS, "Welch t, one-sided, alpha = 0.3, n = 2 + 2", 1),
    "r4-gru-pe-dl-trend-above-1": (FAIL, "exact permutation test, one-sided", 1),
    "r5-s4d-pe-dl-difference-last": (PASS, "exact permutation test, one-sided", 2),
    "r6-lstm-pe-dl-difference-first": (FAIL, "exact permutation test, one-sided", 2),
    "r7-lstm-min-dl": (PASS, "observed min over the seeds (no test), n = 2", 2),
    "b1-lstm-vanilla-below-90-every-band": (PASS, "exact sign test, n = 3", 16),
    "b2-gru-pe-nearly-perfect-first-band": (FAIL, "exact sign test, n = 3", 4),
    "b3-s4d-rare-minus-frequent": (PASS, "exact permutation test, n = 3 + 3", 1),
    "s1-gru-vanilla-stability-trend": (PASS, "Welch t, one-sided, alpha = 0.3", 1),
    "s2-lstm-pe-minus-vanilla-last": (PASS, "Welch t, one-sided, alpha = 0.3", 2),
    "s3-s4d-pe-minus-vanilla-first": (FAIL, "Welch t, one-sided, alpha = 0.3", 2),
    "s4-gru-pe-stability-every-checkpoint": (PASS, "Student t, one-sided", 2),
    "g1-every-arm-below-90-every-band": (PASS, "Student t, one-sided, alpha = 0.15", 96),
    "g2-every-arm-stability-above-minus-1": (PASS, "Student t, one-sided", 12),
    "g3-every-arm-pe-minus-vanilla-dl-last": (PASS, "exact permutation test, n = 2 + 2", 6),
}


def write_verdicts(path, verdicts: dict) -> None:
    results = [{"id": cid, "verdict": v, "method": m, "note": "",
                "cells": [{"cell": str(i)} for i in range(cells)]}
               for cid, (v, m, cells) in verdicts.items()]
    path.write_text(json.dumps({"results": results}))


def test_the_rehearsal_claims_are_the_paper_grammar_at_the_rehearsal_sizes():
    assert set(MEASURED) == set(REHEARSAL)
    for claim in REHEARSAL.values():
        # Never mistaken for the paper's runs, nor these for the rehearsal's.
        assert claim.where.get("model.hidden_size") == 8, claim.id
        assert claim.level == 0.7
    # Every path the rehearsal requires is one some rehearsal claim takes.
    taken = set().union(*(rehearsal.verdict_paths(REHEARSAL[c], {"method": m, "cells": [0] * k})
                          for c, (_, m, k) in MEASURED.items()))
    assert set(rehearsal.REQUIRED_PATHS) <= taken


def test_every_path_decided_passes_with_a_line_per_path(tmp_path):
    write_verdicts(tmp_path / "verify.json", MEASURED)
    lines = rehearsal.check_paths(tmp_path / "verify.json", list(rehearsal.REQUIRED_PATHS))
    assert lines[0] == "rehearsal claims: 17 (12 pass, 5 fail, 0 inconclusive, 0 not run)"
    shown = {line.split(":")[0] for line in lines[1:]}
    assert {f"path {p}" for p in rehearsal.REQUIRED_PATHS} <= shown
    assert "path table by_band: b1-lstm-vanilla-below-90-every-band pass, " \
           "b2-gru-pe-nearly-perfect-first-band fail, b3-s4d-rare-minus-frequent pass, " \
           "g1-every-arm-below-90-every-band pass" in lines
    assert lines[-1] == "also decided: observed min/max (no test)"


def test_a_path_no_claim_decided_fails_the_check_and_says_why(tmp_path):
    stability = [c for c in MEASURED if REHEARSAL[c].table == "stability"]
    undecided = {**MEASURED, **{c: (NOT_RUN, "", 0) for c in stability}}
    write_verdicts(tmp_path / "verify.json", undecided)
    with pytest.raises(UserError, match=r"1 verdict path\(s\) decided by no claim: "
                       r"table stability: s1-gru-vanilla-stability-trend: not run"):
        rehearsal.check_paths(tmp_path / "verify.json", list(rehearsal.REQUIRED_PATHS))
    # Inconclusive is not decided either; the constant cells' exact tests all became t tests.
    t_only = {c: (v, m.replace("exact sign test", "Student t").replace(
        "exact permutation test", "Welch t"), k) for c, (v, m, k) in MEASURED.items()}
    write_verdicts(tmp_path / "verify.json", t_only)
    with pytest.raises(UserError, match=r"exact test \(constant cells\)"):
        rehearsal.check_paths(tmp_path / "verify.json", list(rehearsal.REQUIRED_PATHS))
    # Decided, but never a fail: the claims must go both ways.
    write_verdicts(tmp_path / "verify.json", {c: (PASS, m, k) for c, (_, m, k) in
                                             MEASURED.items()})
    with pytest.raises(UserError, match="no claim fails"):
        rehearsal.check_paths(tmp_path / "verify.json", list(rehearsal.REQUIRED_PATHS))
    # A plan's rehearsal: the paths alone (its arms may leave the failing claims unrun).
    assert rehearsal.check_paths(tmp_path / "verify.json", list(rehearsal.REQUIRED_PATHS),
                                 both=False)[0].startswith("rehearsal claims: 17 (17 pass")
    with pytest.raises(UserError, match="not found"):
        rehearsal.check_paths(tmp_path / "absent.json", [])


def test_a_plans_rehearsal_requires_the_paths_of_the_claims_it_decides(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"decided": ["1a-gru-pe-above-95", "3-s4d-pe-larger-vocabulary"],
                                "left_out": []}))
    # 1a: a threshold over the cells of K (all of several); 3: a difference in the last cell.
    assert rehearsal.required_paths(plan) == [
        "test threshold", "test difference", "cells all (several)", "cells last",
        "table runs", "t test"]
    assert rehearsal.required_paths(None) == list(rehearsal.REQUIRED_PATHS)
    plan.write_text("{}")
    with pytest.raises(UserError, match="not a plan.json"):
        rehearsal.required_paths(plan)


def test_the_check_command_requires_every_path_with_verdicts(tmp_path):
    from conftest import run_cli

    ids = [c.id for c in load_claims(claims_file("quick"))]
    left_behind(tmp_path / "paper", {c: NOT_RUN for c in ids})
    write_verdicts(tmp_path / "rehearsal.json", MEASURED)
    code, text = run_cli("rehearsal", "check", tmp_path / "paper", "--claims", "quick",
                         "--verdicts", tmp_path / "rehearsal.json")
    assert code == 0, text
    assert "rehearsal claims: 17 (12 pass, 5 fail" in text and "path table stability" in text
    no_stability = {**MEASURED, **{c: (NOT_RUN, "", 0) for c in MEASURED
                                   if REHEARSAL[c].table == "stability"}}
    write_verdicts(tmp_path / "rehearsal.json", no_stability)
    code, text = run_cli("rehearsal", "check", tmp_path / "paper", "--claims", "quick",
                         "--verdicts", tmp_path / "rehearsal.json")
    assert code == 2 and "error:" in text and "table stability" in text


def make_variable(name: str, *assignments: str, tmp_path) -> str:
    """A variable of the Makefile as make expands it (a one-rule makefile that prints it)."""
    import shutil
    import subprocess

    from conftest import ROOT

    if shutil.which("make") is None:
        pytest.skip("no make")
    printer = tmp_path / "print.mk"
    printer.write_text("print-%:\n\t@echo '$($*)'\n")
    return subprocess.run(["make", "-s", "-f", "Makefile", "-f", str(printer),
                           f"print-{name}", "PERENCODE_DEPS=", *assignments], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout


def test_make_rehearsal_shrinks_the_paper_grids_or_a_plans_by_their_source(tmp_path):
    paper = make_variable("REHEARSAL_GRIDS", tmp_path=tmp_path)
    assert paper.count("SWEEP_ARGS_") == 18
    assert ('SWEEP_ARGS_fig02_lstm_reverse="--set task.held_out=8 --only seed=111,222 '
            '--only vocab_size=256,16384"') in paper
    assert 'SWEEP_ARGS_fig03_gru_dual_frequency="--set task.held_out_per_cell=2 --only ' \
           'seed=111,222,333' in paper
    plan = tmp_path / "plan"
    plan.mkdir()
    for name in ("fig02_lstm_reverse-2.toml", "fig05_s4d_stability.toml"):
        (plan / name).write_text("")
    planned = make_variable("REHEARSAL_GRIDS", f"GRIDS={plan}", tmp_path=tmp_path)
    # The plan's cells and seeds: no --only; a plan's part takes its source grid's sizes.
    assert "--only" not in planned
    assert 'SWEEP_ARGS_fig02_lstm_reverse-2="--set task.held_out=8' in planned
    assert ('SWEEP_ARGS_fig05_s4d_stability="--set task.held_out_per_cell=2  '
            '--set model.d_state=4 --set task.length=24') in planned
    assert make_variable("REHEARSAL_PLAN", f"GRIDS={plan}", tmp_path=tmp_path).strip() == \
        f"--plan {plan}/plan.json"


def test_a_plans_rehearsal_requires_the_figures_of_its_grids_only(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"grids": ["fig02_gru_reverse-1.toml", "fig05_gru_stability.toml",
                                          "fig15_table1_lstm_wikitext103.toml"]}))
    assert rehearsal.planned_figures(plan) == {"fig02_reverse_vocabulary", "fig05_stability",
                                               "fig15_lm_training", "table1_lm_perplexity"}
    ids = [c.id for c in load_claims(claims_file("quick"))]
    left_behind(tmp_path / "figures", {c: NOT_RUN for c in ids})
    for figure in FIGURES:
        if figure.name not in rehearsal.planned_figures(plan):
            (tmp_path / "figures" / f"{figure.name}__nonpaper.png").unlink()
    lines = check_outputs(tmp_path / "figures", "quick", plan)
    assert [line.split(":")[0] for line in lines[1:]] == [
        "fig02_reverse_vocabulary", "fig05_stability", "fig15_lm_training", "table1_lm_perplexity"]
    with pytest.raises(UserError, match="no file of fig03_dual_frequency"):
        check_outputs(tmp_path / "figures", "quick")  # the paper's rehearsal needs them all
