"""The one line that says a run's machine is not the one the docs' numbers came from."""

from __future__ import annotations

import json

from perencode.analysis import machines
from perencode.store import environment


def write_env(run_dir, **fields) -> None:
    run_dir.mkdir(parents=True)
    env = {"torch": "2.13.0+cpu", "cpu_model": "AMD EPYC", "cpu_capability": "AVX2",
           "gpu_model": None, "hostname": "vm", **fields}
    (run_dir / "env.json").write_text(json.dumps(env))


def test_runs_on_the_quoted_machine_say_nothing(tmp_path):
    write_env(tmp_path / "a", hostname="other")  # another host of the same kind
    write_env(tmp_path / "b")
    assert machines.machine_note([tmp_path / "a", tmp_path / "b", tmp_path / "absent"]) is None


def test_another_isa_or_torch_or_a_gpu_is_named_in_one_line(tmp_path):
    write_env(tmp_path / "a", cpu_capability="AVX512")
    write_env(tmp_path / "b", torch="2.1.1", cpu_capability=None)
    write_env(tmp_path / "c", gpu_model="NVIDIA A100-SXM4-80GB (108 SMs)")
    note = machines.machine_note([tmp_path / p for p in "abc"])
    assert note is not None and "\n" not in note
    assert note.startswith("note: these runs ran on AMD EPYC, ISA AVX512, torch 2.13.0+cpu; "
                           "AMD EPYC, ISA not recorded, torch 2.1.1 and 1 more, the numbers "
                           "quoted in the docs on AMD EPYC, ISA AVX2, torch 2.13.0+cpu")
    assert "verdicts" in note


def test_the_machine_fields_are_those_env_json_records():
    env = environment.report(__import__("torch").device("cpu"))
    assert set(machines.FIELDS) <= set(env)
