"""The installed package, as the container and a plain `pip install` have it: a wheel, no
checkout. What `verify` and `quickstart` need must be inside it. Building the wheel takes
seconds: these run with the slow tests (`make test`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools leaves build/ and *.egg-info beside the sources.
    source = out / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "runs", "figures", "rehearsal", "build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "--wheel-dir", str(out), str(source)], check=True, capture_output=True)
    (path,) = out.glob("perencode-*.whl")
    return path


def test_wheel_carries_the_claims_files(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    bundled = {f"perencode/claims/{n}.toml" for n in ("paper", "quick", "quick_gpu")}
    assert bundled <= names


def test_claims_are_found_from_the_wheel_without_a_checkout(wheel, tmp_path):
    """The wheel unpacked as site-packages would hold it, run from a folder that has no
    checkout: `claims_file("paper")` resolves inside the installed package and parses."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "work"
    work.mkdir()
    code = ("from perencode.analysis.verdicts import claims_file, load_claims; "
            "p = claims_file('paper'); "
            "print(p); print(len(load_claims('quick')))")
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], cwd=work, env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    assert out[0] == str(site / "perencode" / "claims" / "paper.toml")
    assert out[1] == "4"


def test_every_test_has_a_time_limit(request):
    """pytest-timeout (the dev extra): pyproject's limit for every test, the longer one of
    tests/conftest.py for those marked slow; a test that hangs fails instead."""
    from conftest import SLOW_TIMEOUT
    assert request.config.pluginmanager.hasplugin("timeout")
    assert request.config.getini("timeout") == "300"
    slow = [item for item in request.session.items if item.get_closest_marker("slow")]
    for item in slow:
        assert item.get_closest_marker("timeout").args[0] in (SLOW_TIMEOUT,), item.nodeid
