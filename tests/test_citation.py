"""The package says how to cite it and under which licence: LICENSE, CITATION.cff, README."""

import re

import yaml
from conftest import ROOT

import perencode
from perencode.config.recipe import tomllib

TITLE = "Positional Encoding Helps Recurrent Neural Networks Handle a Large Vocabulary"
URL = "https://openreview.net/forum?id=PtnuXd13SF"


def test_citation_cff_names_the_package_and_the_paper():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    for key in ("cff-version", "message", "title", "authors", "type", "version", "license"):
        assert cff.get(key), key
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert cff["version"] == project["version"] == perencode.__version__
    assert cff["license"] == project["license"] == "MIT"  # an SPDX expression
    assert all("name" in a or "family-names" in a for a in cff["authors"])
    paper = cff["preferred-citation"]
    assert paper["type"] == "article" and paper["title"] == TITLE
    assert paper["authors"] == [{"family-names": "Morita", "given-names": "Takashi"}]
    assert paper["journal"] == "Transactions on Machine Learning Research"
    assert paper["url"] == URL


def test_license_is_mit():
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n") and "Copyright (c) 2026 the perencode authors" in text


def test_readme_cites_the_paper_in_bibtex():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Citing", 1)[1]
    found = re.search(r"```bibtex\n(@article\{.*?\n\})\n```", section, flags=re.S)
    assert found, section
    bibtex = found.group(1)
    fields = dict(re.findall(r"^\s+(\w+)\s+= \{(.*)\},?$", bibtex, flags=re.M))
    assert fields == {"title": TITLE, "author": "Morita, Takashi",
                      "journal": "Transactions on Machine Learning Research", "url": URL}
