"""Verdicts say what they test (issue 55): a claim about an edge of a grid is decided there
or not at all, the multiplicity of a claims file is stated, the quantity and the assumption
behind each verdict's level are named and checked on the runs."""

from __future__ import annotations

import math

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


# -- item 2: the quantity, the assumption, and runs that contradict it -----------------------

def _runs(root, cells: dict):
    """cells: (vocab, encoding) -> accuracies, one run per seed."""
    for (vocab, enc), accs in cells.items():
        for i, acc in enumerate(accs):
            fake_run(root, f"{vocab}/{enc}/{i}", encoding=enc, vocab=vocab, seed=111 * (i + 1),
                     metrics={"token_accuracy": acc} if acc is not None else {"dl_distance": 1})
    return root


DIFFERENCE = '''
[[claim]]
id = "pe-better"
statement = "PE beats vanilla"
where = { "task.name" = "reverse" }
metric = "token_accuracy"
test = "difference"
a = { "encoding.kind" = "sinusoidal" }
b = { "encoding.kind" = "none" }
'''


def test_a_seed_stuck_on_a_plateau_is_named_with_the_other_readings(tmp_path):
    """PE solves on two seeds and sticks at 0.17 on the third; vanilla ~0.5. Welch's t on the
    mean is inconclusive; the line says a seed split off and what the verdict is without it
    (pass) and distribution-free (exact rank test: U = 6 of 9, p = 7/20)."""
    root = _runs(tmp_path / "runs", {(32, "sinusoidal"): (0.99, 0.985, 0.17),
                                     (32, "none"): (0.50, 0.52, 0.51)})
    (o,) = check_claims([root], write(tmp_path, DIFFERENCE)).outcomes
    assert o.verdict == "inconclusive"
    assert o.quantity == "the mean over seeds of a minus that of b"
    assert o.assumption.startswith("each group near-normal, or both of one shape; not seeds "
                                   "split between a plateau and success")
    assert o.shape.startswith("shape: group a: 1 of 3 seeds set apart from the others by "
                              "Dixon's Q test (0.17 vs 0.985-0.99: a plateau beside success, "
                              "or an outlier): the t-test's level does not hold")
    assert "without the outlying seeds pass (p = 8.9e-06)" in o.shape  # as docs/claims.md shows
    assert o.shape.endswith("distribution-free (exact rank test, on most seeds) inconclusive "
                            "(p = 0.35)")
    from perencode.analysis.verdicts import reproduced
    assert o.shape in reproduced(o)  # on the verdict's line


def test_seeds_at_exactly_one_are_named_and_the_median_reading_given(tmp_path):
    """Four of five seeds at 1.0, one at 0.8: the mean's test passes > 0.9; the line names
    the seeds at the bound (and the split-off one) and the sign test's reading: 4 of 5
    above, p = 6/32."""
    root = _runs(tmp_path / "runs", {(32, "sinusoidal"): (1.0, 1.0, 1.0, 1.0, 0.8)})
    claim = ('[[claim]]\nid = "above"\nstatement = "above 90%"\nmetric = "token_accuracy"\n'
             'test = "threshold"\nvalue = 0.9\n')
    (o,) = check_claims([root], write(tmp_path, claim)).outcomes
    assert "4 of 5 seeds exactly at a bound (0 or 1)" in o.shape
    assert "1 of 5 seeds set apart from the others by Dixon's Q test (0.8 vs 1-1" in o.shape
    assert o.shape.endswith("distribution-free (sign test of the median, on most seeds) "
                            "inconclusive (p = 0.19)")
    # The claim may choose the median: the exact sign test decides, at the full alpha.
    (m,) = check_claims([root], write(tmp_path, claim + 'statistic = "median"\n')).outcomes
    assert m.verdict == "inconclusive" and m.p == pytest.approx(6 / 32)
    assert m.quantity == "the median over seeds: most seeds on the claimed side"
    assert m.assumption.startswith("none on the seeds' shape: exact")
    assert m.method.startswith("exact sign test of the median, one-sided, alpha = 0.05, n = 5")
    (all_five,) = check_claims([_runs(tmp_path / "five", {(32, "none"): (1.0,) * 4 + (0.99,)})],
                               write(tmp_path, claim + 'statistic = "median"\n')).outcomes
    assert all_five.verdict == "pass" and all_five.p == pytest.approx(1 / 32)


def test_tidy_runs_raise_no_shape_warning(tmp_path):
    root = _runs(tmp_path / "runs", {(32, "sinusoidal"): (0.97, 0.98, 0.975),
                                     (32, "none"): (0.50, 0.52, 0.51)})
    (o,) = check_claims([root], write(tmp_path, DIFFERENCE)).outcomes
    assert o.verdict == "pass" and o.shape == ""


def test_a_median_claim_of_a_difference_uses_the_exact_rank_test(tmp_path):
    root = _runs(tmp_path / "runs", {(32, "sinusoidal"): (0.97, 0.98, 0.975, 0.96),
                                     (32, "none"): (0.50, 0.52, 0.51, 0.53)})
    (o,) = check_claims([root], write(tmp_path, DIFFERENCE + 'statistic = "median"\n')).outcomes
    assert o.verdict == "pass" and o.p == pytest.approx(1 / 70)  # every a above every b
    assert o.quantity == "on most seeds: a seed of a beats a seed of b more often than not"


def test_runs_left_out_are_counted_on_the_verdicts_line(tmp_path):
    root = _runs(tmp_path / "runs", {(32, "sinusoidal"): (0.97, 0.98, 0.975, None)})
    claim = ('[[claim]]\nid = "above"\nstatement = "above 90%"\nmetric = "token_accuracy"\n'
             'test = "threshold"\nvalue = 0.9\n')
    (o,) = check_claims([root], write(tmp_path, claim)).outcomes
    assert o.n == [3] and o.method.endswith(
        "; left out before the test: 1 finished run without a value of token_accuracy")


# -- item 3: multiplicity ----------------------------------------------------------------------

def test_holm_and_benjamini_hochberg_known_answers():
    from pathlib import Path

    from perencode.analysis.verdicts import Checked, Claim, Outcome, adjust

    def outcome(i, p, verdict="pass"):
        claim = Claim(id=f"c{i}", statement="s", metric="m", test="threshold")
        return Outcome(claim, verdict, p_claim=p, alpha=0.05)

    outcomes = [outcome(0, 0.01), outcome(1, 0.04), outcome(2, 0.03), outcome(3, 0.005),
                outcome(4, math.nan, "inconclusive")]
    adjust(outcomes)
    # Holm: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04,
    # made monotone: 0.02, 0.03, 0.06, 0.06. BH: m p / rank = 0.02, 0.02, 0.04, 0.04.
    assert [o.p_holm for o in outcomes[:4]] == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert [o.q_bh for o in outcomes[:4]] == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert math.isnan(outcomes[4].p_holm)
    text = Checked(Path("claims.toml"), outcomes, None).multiplicity()  # type: ignore[arg-type]
    assert text == ("Of the 4 tested claims' 4 passes, 2 remain with the family-wise error "
                    "held at each claim's alpha (Holm) and 4 with the false-discovery rate "
                    "held (Benjamini-Hochberg); were every tested claim false at its boundary, "
                    "0.2 false passes would be expected by chance.")


# -- item 5: the smaller items -------------------------------------------------------------------

def test_the_rule_says_which_alpha_each_kind_of_claim_uses():
    from perencode.analysis.verdicts import RULE

    assert "alpha = 0.05 on each side" not in RULE
    assert "half of that for a threshold on a metric in [0, 1] (an accuracy: 0.025" in RULE
    assert "the mean at the last value of `along` minus at the first" in RULE


def test_trend_says_it_compares_two_ends(tmp_path):
    root = _runs(tmp_path / "runs", {(32, "none"): (0.97, 0.98, 0.975),
                                     (64, "none"): (0.8, 0.82, 0.81),
                                     (128, "none"): (0.5, 0.52, 0.51)})
    claim = ('[[claim]]\nid = "down"\nstatement = "drops"\nmetric = "token_accuracy"\n'
             'test = "trend"\nalong = "task.vocab_size"\nop = "<"\n')
    (o,) = check_claims([root], write(tmp_path, claim)).outcomes
    assert o.verdict == "pass" and o.method.startswith(
        "Welch t of the mean at the last value of task.vocab_size minus at the first (two "
        "ends; the values between are not tested), one-sided, alpha = 0.05, n = 3 + 3")


@pytest.mark.slow
@pytest.mark.compat
def test_the_quick_demos_numbers_in_the_docs_are_what_verify_prints():
    """REPRODUCE.md's quick-demo verdicts are generated by tools/quick_demo_section.py from
    `verify`'s output on the per-seed values its table records (the demo's runs are not kept
    here); README.md quotes q2 the same way. Before: plain-t numbers at 95% that verify did
    not print ("t = 15.2, p = 3e-4, lower bound 0.980")."""
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location(
        "quick_demo_section", ROOT / "tools" / "quick_demo_section.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    text = (ROOT / "REPRODUCE.md").read_text(encoding="utf-8")
    section = tool.section(text)
    assert tool.with_section(text, section) == text, "run `python tools/quick_demo_section.py`"
    assert "lower bounds 0.972 for vanilla (mean 0.986, p = 0.0018)" in section
    assert "t = 15.2" not in text and "p = 3e-4" not in text
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    q2 = tool.verdicts(text)["q2-pe-better-large-vocabulary"]
    assert tool.q2_sentence(q2) == ("PE minus vanilla +0.087, one-sided Welch t at alpha = "
                                    "0.05: p = 0.014, lower bound +0.035 (pass)")
    assert tool.q2_sentence(q2) in readme


def test_a_claim_with_one_run_a_group_is_not_counted_among_the_tests(tmp_path):
    root = _runs(tmp_path / "runs", {(32, "sinusoidal"): (0.97,), (32, "none"): (0.5,)})
    checked = check_claims([root], write(tmp_path, DIFFERENCE))
    (o,) = checked.outcomes
    assert o.verdict == "inconclusive" and not o.tested and math.isnan(o.p_holm)
    assert checked.multiplicity() == ""
    assert checked.summary() == ("1 claims; 1 concern the 2 finished runs given: 0 pass, 0 "
                                 "fail, 1 inconclusive.")
