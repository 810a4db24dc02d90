"""The environment report: `perencode env`, and what every run records in env.json."""

import json
import subprocess
from importlib import metadata

import pytest
import torch
from conftest import ROOT, train_args
from typer.testing import CliRunner

from perencode.cli import app
from perencode.store import environment

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _head(folder) -> str | None:
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True,
                         text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def test_git_commit_is_the_checkout_head(monkeypatch):
    head = _head(ROOT)
    if head is None:
        pytest.skip("the tests run from a copy that is not a git checkout")
    monkeypatch.setenv(environment.GIT_COMMIT_VARIABLE, COMMIT)  # git wins where it answers
    assert environment.git_commit() == head


def test_git_commit_falls_back_to_the_variable(monkeypatch, tmp_path):
    assert _head(tmp_path) is None  # like an installed wheel or a container image
    monkeypatch.setenv(environment.GIT_COMMIT_VARIABLE, COMMIT)
    assert environment.git_commit(tmp_path) == COMMIT
    monkeypatch.setenv("PATH", str(tmp_path))  # no git at all
    assert environment.git_commit(ROOT) == COMMIT
    monkeypatch.delenv(environment.GIT_COMMIT_VARIABLE)
    assert environment.git_commit(tmp_path) is None


def test_env_command_reports_versions_and_device():
    result = CliRunner().invoke(app, ["env", "--json", "--device", "cpu"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    env = json.loads(result.stdout)
    assert env["torch"] == torch.__version__ and env["device"] == "cpu"
    assert env["perencode_version"] == metadata.version("perencode")
    assert env["torch_threads"] == torch.get_num_threads() and env["cpu_cores"] >= 1
    assert env["packages"]["numpy"] == metadata.version("numpy")
    assert env["packages"]["tensorboard"] == metadata.version("tensorboard")
    assert set(env["packages"]) == set(environment.PACKAGES)

    text = CliRunner().invoke(app, ["env", "--device", "cpu"], catch_exceptions=False).stdout
    lines = {line.split(None, 1)[0]: line.split(None, 1)[1] for line in text.splitlines()
             if len(line.split(None, 1)) == 2}
    assert lines["torch"] == torch.__version__ and lines["device"] == "cpu"
    assert lines["numpy"] == env["packages"]["numpy"] and "packages:" in text


def test_env_json_of_a_run_is_the_report(cli, tmp_path, monkeypatch):
    monkeypatch.setattr(environment, "PACKAGE_DIR", tmp_path)  # as if installed from a wheel
    monkeypatch.setenv(environment.GIT_COMMIT_VARIABLE, COMMIT)
    run = tmp_path / "run"
    code, text = cli(*train_args(run, "train.iterations=2", "task.vocab_size=8", "task.length=4"))
    assert code == 0, text
    recorded = json.loads((run / "env.json").read_text())
    report = environment.report(torch.device("cpu"))
    assert {k: recorded[k] for k in report} == report
    assert recorded["git_commit"] == COMMIT and recorded["seed"] == 111


def test_a_run_on_a_gpu_records_its_model_driver_and_the_builds_kernels(monkeypatch, tmp_path):
    """What a CUDA result depends on beyond the versions (simulated GPU and nvidia-smi);
    on the CPU the same keys, empty."""
    from types import SimpleNamespace

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 550.54.15\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_80", "sm_90"])
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(
        name="NVIDIA A100-SXM4-80GB", multi_processor_count=108, total_memory=80 << 30))
    before = torch.backends.cudnn.deterministic
    torch.backends.cudnn.deterministic = True  # as a session of train.deterministic sets it
    try:
        gpu = environment.gpu_report(torch.device("cuda"))
    finally:
        torch.backends.cudnn.deterministic = before
    assert gpu == {"gpu_model": "NVIDIA A100-SXM4-80GB (108 multiprocessors)",
                   "compute_capability": "8.0", "driver": "550.54.15",
                   "torch_cuda_archs": ["sm_80", "sm_90"], "cudnn_deterministic": True,
                   "cudnn_benchmark": torch.backends.cudnn.benchmark,
                   "tf32_cudnn": torch.backends.cudnn.allow_tf32,
                   "tf32_matmul": torch.backends.cuda.matmul.allow_tf32}
    cpu = environment.report(torch.device("cpu"))
    assert {k: cpu[k] for k in gpu} == {**{k: None for k in gpu}, "torch_cuda_archs": []}
    assert {"torch", "cuda", "cudnn"} <= set(cpu)  # the build's CUDA and cuDNN versions
    monkeypatch.setenv("PATH", "/nonexistent")
    assert environment.gpu_driver() is None


def test_cpu_model_is_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                    "model name\t: AMD EPYC 7763 64-Core Processor\nflags\t\t: avx2\n")
    assert environment.cpu_model(info) == "AMD EPYC 7763 64-Core Processor"
    # An ARM board's cpuinfo names its model under `Model`.
    info.write_text("processor\t: 0\nBogoMIPS\t: 108.00\n\nModel\t\t: Raspberry Pi 4\n")
    assert environment.cpu_model(info) == "Raspberry Pi 4"


def test_cpu_model_on_macos_is_sysctls_brand_string_else_the_platforms(monkeypatch, tmp_path):
    """No /proc/cpuinfo on macOS: `sysctl -n machdep.cpu.brand_string` names the CPU; where
    sysctl fails or says nothing, platform.processor(); None where that is empty too."""
    calls = []

    def sysctl(args, **kwargs):
        calls.append(args)
        return subprocess.CompletedProcess(args, 0, stdout="Apple M2 Pro\n", stderr="")

    monkeypatch.setattr(environment.sys, "platform", "darwin")
    monkeypatch.setattr(environment.subprocess, "run", sysctl)
    monkeypatch.setattr(environment.platform, "processor", lambda: "arm")
    assert environment.cpu_model(tmp_path / "absent") == "Apple M2 Pro"
    assert calls == [["sysctl", "-n", "machdep.cpu.brand_string"]]

    def missing(args, **kwargs):
        raise FileNotFoundError(args[0])

    monkeypatch.setattr(environment.subprocess, "run", missing)
    assert environment.cpu_model(tmp_path / "absent") == "arm"
    monkeypatch.setattr(environment.subprocess, "run", lambda args, **kwargs:
                        subprocess.CompletedProcess(args, 0, stdout="\n", stderr=""))
    monkeypatch.setattr(environment.platform, "processor", lambda: "")
    assert environment.cpu_model(tmp_path / "absent") is None

def test_the_report_records_the_cpu_and_torchs_vector_isa(monkeypatch):
    env = environment.report(torch.device("cpu"))
    assert env["cpu_model"] == environment.cpu_model()
    getter = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    if getter is None:  # torch 2.1: no call says which ISA the kernels use
        assert env["cpu_capability"] is None
    else:
        assert env["cpu_capability"] == getter()
        assert env["cpu_capability"] in ("DEFAULT", "VSX", "Z VECTOR", "NO AVX", "AVX",
                                         "AVX2", "AVX512", "SVE256", "SVE", "NEON")
    # torch 2.1.1 lacks torch.backends.cpu.get_cpu_capability: the field is None, no crash.
    if getter is not None:
        monkeypatch.delattr(torch.backends.cpu, "get_cpu_capability")
    assert environment.cpu_capability() is None
