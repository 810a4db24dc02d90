"""The repository is self-contained: every anchor of docs/paper-facts.md cited by the package
(its claims files included), the recipes, the docs or the tests is a heading of that file,
and no text points at a document the repository does not hold."""

from __future__ import annotations

import re
import subprocess

import pytest
from conftest import ROOT

FACTS = ROOT / "docs" / "paper-facts.md"
CITED = re.compile(r"paper-facts\.md#([A-Za-z0-9_-]+)")
# Built from parts so that this file does not match itself.
OUTSIDE = ["SPEC " + "§", "SPEC " + "section", "STYLE " + "rule", "shared" + "/"]


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    return {anchor(line.lstrip("#")) for line in markdown.splitlines()
            if re.match(r"#{1,6} ", line)}


def cited_files() -> list:
    files = [ROOT / "README.md", ROOT / "REPRODUCE.md"]
    for folder, pattern in [("perencode", "*.py"), ("perencode", "*.toml"), ("docs", "*.md"),
                            ("tests", "*.py"), ("recipes", "*.toml"), ("data", "*.md")]:
        files += sorted((ROOT / folder).rglob(pattern))
    return files


@pytest.mark.parametrize(("heading", "expected"), [
    ("Learning-rate schedule", "learning-rate-schedule"),
    ("Where the authors' code differs from the paper",
     "where-the-authors-code-differs-from-the-paper"),
    ("Claim 8", "claim-8"),
])
def test_anchor_follows_github(heading, expected):
    assert anchor(heading) == expected


def test_every_cited_fact_is_a_heading():
    known = anchors(FACTS.read_text(encoding="utf-8"))
    missing = []
    for path in cited_files():
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            missing += [f"{path.relative_to(ROOT)}:{i}: #{a}" for a in CITED.findall(line)
                        if a not in known]
    assert not missing, "cited anchors missing from docs/paper-facts.md:\n" + "\n".join(missing)


def test_the_package_cites_the_facts_it_uses():
    """The citations exist at all (a rename that dropped them would pass the test above)."""
    package = [p for p in (ROOT / "perencode").rglob("*.py")
               if CITED.search(p.read_text(encoding="utf-8"))]
    assert len(package) >= 10


def test_nothing_points_outside_the_repository():
    offenders = [f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
                 for path in cited_files()
                 for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if any(word in line for word in OUTSIDE)]
    assert not offenders, "\n".join(offenders)


def test_no_text_promises_a_dry_run_without_waiting():
    """`sweep --dry-run` trains nothing but imports torch and plans every cell: 15 s on a
    busy 2-core machine (Fig. 2's grid, 40 cells), which is what the README says of it."""
    word = "inst" + "ant"  # built from parts so that this file does not match itself
    offenders = [f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
                 for path in cited_files()
                 for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if "dry" in line.lower() and word in line.lower()]
    assert not offenders, "\n".join(offenders)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "--dry-run          # runs, disk, device-hours (trains nothing; 15-25 s)" in readme


def test_an_examples_commands_write_only_where_git_ignores():
    """Following an example's README from the checkout's root leaves nothing untracked:
    every folder its commands write into (--out, --runs, and their defaults figures/ and
    runs/) is ignored by .gitignore."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    folders = {"runs", "figures"}  # the defaults of --runs and --out
    for readme in sorted((ROOT / "examples").glob("*/README.md")):
        folders |= set(re.findall(r"--(?:out|runs)\s+([^\s`]+)", readme.read_text("utf-8")))
    assert "figures/mingru" in folders
    found = subprocess.run(["git", "check-ignore", "--no-index", *(f"{f}/x" for f in folders)],
                           cwd=ROOT, capture_output=True, text=True, check=False)
    assert set(found.stdout.split()) == {f"{f}/x" for f in folders}, found
