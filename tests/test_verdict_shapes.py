"""Verdicts say what they test (issue 55): a claim about an edge of a grid is decided there
or not at all, the multiplicity of a claims file is stated, the quantity and the assumption
behind each verdict's level are named and checked on the runs."""

from __future__ import annotations

import pytest
from fake_runs import fake_run

from perencode.analysis.verdicts import check_claims

LARGEST = '''
[[claim]]
id = "pe-better-at-largest"
statement = "PE beats vanilla at the largest K"
where = {{ "task.name" = "reverse"{extra} }}
metric = "token_accuracy"
by = ["task.vocab_size"]
cells = "{cells}"
test = "difference"
a = {{ "encoding.kind" = "sinusoidal" }}
b = {{ "encoding.kind" = "none" }}
'''


def write(tmp_path, text: str):
    path = tmp_path / "claims.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def lopsided_runs(tmp_path_factory):
    """PE at K = 32 and 1,024, vanilla at K = 32 only (three seeds each)."""
    root = tmp_path_factory.mktemp("lopsided")
    for i, seed in enumerate((111, 222, 333)):
        for vocab, enc, acc in ((32, "sinusoidal", 0.99), (1024, "sinusoidal", 0.9),
                                (32, "none", 0.5)):
            fake_run(root, f"{vocab}/{enc}/{seed}", encoding=enc, vocab=vocab, seed=seed,
                     metrics={"token_accuracy": acc + 0.003 * i})
    return root


def test_a_missing_edge_cell_is_not_run_never_decided_elsewhere(lopsided_runs, tmp_path):
    """Before: pass, shown '(vocab_size=32)': a claim about the largest K passed on the
    smallest. Now the largest K of the union of both groups' cells (1,024) lacks vanilla
    runs: not run, saying so."""
    (last,) = check_claims([lopsided_runs], write(tmp_path, LARGEST.format(
        extra="", cells="last"))).outcomes
    assert last.verdict == "not run"
    assert last.note == ("cells = 'last': no finished run of group b at vocab_size=1024 (the "
                         "runs' last value of task.vocab_size; group b has 32): never decided "
                         "at another value")
    (first,) = check_claims([lopsided_runs], write(tmp_path, LARGEST.format(
        extra="", cells="first"))).outcomes
    assert first.verdict == "pass" and "vocab_size=32" in first.shown


def test_the_edge_is_the_claims_own_list_when_it_names_one(lopsided_runs, tmp_path):
    """where lists K = 32, 1,024, 4,096: 'last' is about 4,096, which no run has."""
    text = LARGEST.format(extra=', "task.vocab_size" = [32, 1024, 4096]', cells="last")
    (last,) = check_claims([lopsided_runs], write(tmp_path, text)).outcomes
    assert last.verdict == "not run"
    assert last.note.startswith("cells = 'last': no finished run of group a at "
                                "vocab_size=4096 (the claim's last value of task.vocab_size; "
                                "group a has 32, 1024)")
    threshold = text.replace('test = "difference"', 'test = "threshold"\nvalue = 0.8')
    threshold = threshold.replace('"task.name" = "reverse"', '"task.name" = "reverse", '
                                  '"encoding.kind" = "sinusoidal"')
    threshold = threshold.replace('a = { "encoding.kind" = "sinusoidal" }\n'
                                  'b = { "encoding.kind" = "none" }\n', "")
    (one,) = check_claims([lopsided_runs], write(tmp_path, threshold)).outcomes
    assert one.verdict == "not run" and "no finished run of the claim at vocab_size=4096" \
        in one.note
