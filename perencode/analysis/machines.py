"""Which machine runs ran on, against the machine the package's quoted numbers came from:
the one line `verify` and `quickstart` print when they differ (issue 54).

CPU training repeats to the last digit on the same CPU model, vector ISA (the one torch's
kernels use there) and torch build, and not across them: a machine of the same `AMD EPYC`
name with AVX-512 gave other per-seed accuracies (by up to 0.7 points) and the same
verdicts. A GPU run's digits depend on the GPU model. So the line names what differs and
what still holds; it decides nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perencode.common.errors import UserError
from perencode.store.records import read_env

# The machine of the numbers the README, REPRODUCE.md ("The quick demo") and
# perencode/claims/quick.toml quote: this project's 2-core machine kind, PyTorch's CPU build
# 2.13 (README: "AMD EPYC, PyTorch 2.13 CPU build"); its ISA as torch reports it there
# (torch.backends.cpu.get_cpu_capability(), measured: AVX2).
QUOTED = {"cpu_model": "AMD EPYC", "cpu_capability": "AVX2", "torch": "2.13.0+cpu",
          "gpu_model": None}
FIELDS = ("cpu_model", "cpu_capability", "torch", "gpu_model")


def machine_of(env: dict[str, Any]) -> dict[str, Any]:
    """The fields of an env.json (environment.report) that decide a run's digits."""
    return {key: env.get(key) for key in FIELDS}


def read_machines(run_dirs: list[Path]) -> list[dict[str, Any]]:
    """The distinct machines (machine_of) of the runs' env.json, in first-seen order; runs
    without a readable env.json are left out."""
    seen: list[dict[str, Any]] = []
    for run_dir in run_dirs:
        try:
            found = read_env(Path(run_dir) / "env.json")
        except UserError:  # none (training never started) or unreadable
            continue
        machine = machine_of(found.as_dict())
        if machine not in seen:
            seen.append(machine)
    return seen


def describe(machine: dict[str, Any]) -> str:
    """'AMD EPYC, ISA AVX2, torch 2.13.0+cpu' (a GPU run: its GPU model first)."""
    parts = [machine["gpu_model"]] if machine.get("gpu_model") else []
    parts += [machine.get("cpu_model") or "CPU unknown",
              f"ISA {machine.get('cpu_capability') or 'not recorded'}",
              f"torch {machine.get('torch') or 'unknown'}"]
    return ", ".join(parts)


def machine_note(run_dirs: list[Path], quoted: dict[str, Any] = QUOTED) -> str | None:
    """One line when a run's machine differs from the quoted numbers' (None when every run's
    matches): the per-seed digits may differ, the verdicts and the direction should hold."""
    machines = read_machines(run_dirs)
    others = [m for m in machines if m != machine_of(quoted)]
    if not others:
        return None
    shown = "; ".join(describe(m) for m in others[:2])
    more = f" and {len(others) - 2} more" if len(others) > 2 else ""
    return (f"note: these runs ran on {shown}{more}, the numbers quoted in the docs on "
            f"{describe(quoted)}: per-seed digits may differ (training is chaotic); the "
            "verdicts and the direction of the effects are what holds across machines")
