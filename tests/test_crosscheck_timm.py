"""`perencode crosscheck` without a working timm, in a child process as a user would meet it:
timm absent, partial (a package without its scheduler) or broken (its scheduler raises on
import). Each is an incomplete crosscheck - the summary line says so first and names the
install line, exit INCOMPLETE - and nothing else changes: the checks that do not need timm
agree as they do with it, and no stand-in module is left to break them."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import ROOT
from test_crosscheck import AUTHORS, needs_authors

from perencode.commands import crosscheck
from perencode.commands.crosscheck.report import AGREE, NOT_RUN

# The central groups and two that import their scripts (whose Learner module imports timm's
# scheduler at its top) and compare their test methods and Learner.train.
GROUPS = ("schedule", "Adam trajectory", "training loop", "chunked loss", "resume",
          "fixed-length tasks", "predecessor")
CENTRAL = ["schedule", "Adam trajectory", "training loop", "chunked loss", "resume"]

CHILD = textwrap.dedent("""
    import sys
    if sys.argv[1] == "hidden":  # as without timm: found nowhere, imported never
        import importlib.machinery
        class NoTimm:
            def find_spec(self, name, path=None, target=None):
                if name == "timm" or name.startswith("timm."):
                    return importlib.machinery.ModuleSpec(name, self)
            def create_module(self, spec):
                raise ModuleNotFoundError(f"No module named {spec.name!r}", name=spec.name)
        sys.meta_path.insert(0, NoTimm())
    from perencode.commands import crosscheck
    from perencode.cli import app
    crosscheck.GROUPS = tuple(g for g in crosscheck.GROUPS if g[0] in sys.argv[4].split(","))
    sys.argv = ["perencode", "crosscheck", sys.argv[2], "--out", sys.argv[3], "--no-progress"]
    app()
""")

FAKES = {
    # timm's package without its scheduler folder (an interrupted install)
    "partial": {"timm/__init__.py": "raise ImportError('operator torchvision::nms does not "
                                    "exist')\n"},
    # a scheduler whose module fails as it loads
    "broken": {"timm/__init__.py": "raise RuntimeError('torchvision mismatch')\n",
               "timm/version.py": "__version__ = '0.9.12'\n",
               "timm/scheduler/__init__.py": "",
               "timm/scheduler/cosine_lr.py": "raise RuntimeError('half-installed')\n"},
}


@pytest.mark.slow  # ~10 s of CPU: in make test and test-compat, not test-fast
@pytest.mark.compat
@needs_authors
@pytest.mark.parametrize("how", ["hidden", "partial", "broken"])
def test_without_a_working_timm_the_crosscheck_is_incomplete(tmp_path, how):
    env = dict(os.environ, COLUMNS="80", OMP_NUM_THREADS="1")
    if how in FAKES:
        for name, text in FAKES[how].items():
            (tmp_path / "fake" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / "fake" / name).write_text(text)
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "fake"), str(ROOT)])
    out = tmp_path / "out"
    child = subprocess.run([sys.executable, "-c", CHILD, how, str(AUTHORS), str(out),
                            ",".join(GROUPS)], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=240)
    text = child.stdout + child.stderr
    assert child.returncode == crosscheck.INCOMPLETE, text
    assert "Traceback" not in text
    summary = text.strip().splitlines()[-1]
    assert summary.startswith("INCOMPLETE: central checks not run: schedule, Adam "
                              "trajectory, training loop, chunked loss, resume ("), summary
    assert "pip install timm==0.9.12 --no-deps" in summary
    assert "pip install 'perencode[crosscheck]'" in summary
    assert all(len(line) <= 80 for line in child.stdout.splitlines()[:-1]), child.stdout
    data = json.loads((out / "crosscheck.json").read_text())
    assert data["complete"] is False
    assert list(data["central_not_run"]) == CENTRAL == list(crosscheck.CENTRAL)
    verdicts = [(c["name"], c["verdict"]) for c in data["checks"]]
    # One "not run" line per central group, and every other check agrees.
    assert [n for n, v in verdicts if v == NOT_RUN] == CENTRAL
    others = [v for n, v in verdicts if v != NOT_RUN]
    assert len(others) > 10 and set(others) == {AGREE}
