"""The rehearsal's final check (perencode.commands.rehearsal.check_outputs) on a hand-made figures
folder: every claim decided or reported in verify.json, a non-empty file of every figure."""

from __future__ import annotations

import json

import pytest

from perencode.analysis.plots import FIGURES
from perencode.analysis.verdicts import FAIL, NOT_RUN, PASS, claims_file, load_claims
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
