"""A researcher's own study (issue 38): installed plugins that stay out of the way
(PERENCODE_DISABLE_PLUGIN_AUTOLOAD, a clean checkout after the example's install)."""

from __future__ import annotations

import subprocess

from conftest import PYTHON, ROOT, subprocess_env
from test_plugins import autoloading, error_line

from perencode import kinds, plugins

RECIPE = ROOT / "recipes" / "gru_vocab256.toml"

FAKE_PE = '''
import torch
from perencode.kinds import EncodingKind, register_encoding

register_encoding(EncodingKind("fake_ramp", label="Fake ramp",
                               table=lambda positions, dim: torch.zeros(positions, dim)))
'''


def installed_fake(folder) -> dict:
    """A distribution 'fake-pe' with a perencode.kinds entry point, installed by being on
    PYTHONPATH (a .dist-info beside its module, as pip leaves one); the env that sees it."""
    (folder / "fake_pe.py").write_text(FAKE_PE)
    info = folder / "fake_pe-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-pe\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[perencode.kinds]\nfake = fake_pe\n")
    env = subprocess_env()
    env["PYTHONPATH"] = f"{folder}:{env['PYTHONPATH']}"
    return env


def show(env: dict, *args) -> tuple[int, str]:
    proc = subprocess.run([PYTHON, "-m", "perencode", *args, "show", str(RECIPE), "--set",
                           "encoding.kind=fake_ramp"], capture_output=True, text=True,
                          env=env, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_suite_runs_with_entry_point_loading_off():
    assert not kinds.autoload()
    assert plugins.load_entry_points() == []  # the example may be installed beside it


def test_the_autoload_switch_turns_entry_points_off_and_leaves_explicit_plugins_on(tmp_path):
    env = installed_fake(tmp_path)
    code, text = show(autoloading(env))
    assert code == 0 and "fake_ramp" in text, text
    for off in ("1", "true"):
        code, text = show({**env, kinds.AUTOLOAD_OFF: off})
        assert code == 2 and "encoding.kind: Input should be " in error_line(text) \
            and "(got 'fake_ramp')" in text, text
    code, text = show({**env, kinds.AUTOLOAD_OFF: "0"})  # "0" is off-switch off: loads
    assert code == 0, text
    code, text = show({**env, kinds.AUTOLOAD_OFF: "1"}, "--plugin", "fake_pe")
    assert code == 0 and "fake_ramp" in text, text


def test_the_example_packages_build_leftovers_are_ignored():
    paths = ["examples/perencode-minrnn/build/lib/perencode_minrnn/plugin.py",
             "examples/perencode-minrnn/perencode_minrnn.egg-info/PKG-INFO", "build/x"]
    proc = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.stdout.split() == paths, proc.stderr
