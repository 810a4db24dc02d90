"""`perencode quickstart` (`make quickstart`): the paper's headline effect in about 15
minutes. On the CPU, a small GRU at a CPU-sized vocabulary; where a CUDA device is present,
Fig. 2's GRU at the paper's own shapes on one GPU. Each demo is a grid in recipes/quick/
and a claims file bundled in perencode/claims/; `quickstart` sweeps the grid, checks the
claims (verify.md), draws the figures beside them in report.html and prints the wall time.

A pipeline of three commands (sweep, verify, report), so it stands above them as the CLI
does: no command imports it (tests/test_layout.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from perencode.commands.report import make_report
from perencode.commands.sweep.options import SweepOptions
from perencode.commands.sweep.run import run_sweep
from perencode.commands.verify import verify_runs
from perencode.common import defaults
from perencode.common.console import console
from perencode.common.errors import UserError
from perencode.config.grid import repository_root


@dataclass(frozen=True)
class Demo:
    name: str
    grid: Path        # relative to the repository root (perencode.config.grid.repository_root)
    claims: str       # a bundled claims file (perencode/claims/<name>.toml)
    device: str       # what the sweep's runs use
    jobs: int         # runs at once
    runs_per_gpu: int = 1


DEMOS = {
    "cpu": Demo("cpu", Path("recipes/quick/quickstart.toml"), "quick",
                "cpu", jobs=2),
    "cuda": Demo("cuda", Path("recipes/quick/quickstart_gpu.toml"),
                 "quick_gpu", "cuda", jobs=6, runs_per_gpu=6),
}


def choose_demo(device: str, cuda_available: bool) -> Demo:
    """auto: the GPU demo where a CUDA device is present, else the CPU demo; cpu or cuda
    choose one (cuda without a device is an error)."""
    if device == "auto":
        return DEMOS["cuda" if cuda_available else "cpu"]
    if device == "cpu":
        return DEMOS["cpu"]
    if device == "cuda":
        if not cuda_available:
            raise UserError("--device cuda: no CUDA device is available (the CPU demo runs "
                            "with --device cpu or auto)")
        return DEMOS["cuda"]
    raise UserError(f"--device '{device}': expected auto, cpu or cuda")


def start(device: str = defaults.DEVICE, runs: Path = defaults.RUNS,
          figures: Path = defaults.FIGURES) -> tuple[Demo, Path, Path]:
    """The demo `device` chooses (choose_demo), announced, with the folders of its runs and
    of its figures and claims (below `runs` and `figures`, named after its grid)."""
    demo = choose_demo(device, torch.cuda.is_available())
    demo = replace(demo, grid=repository_root() / demo.grid)
    if not demo.grid.is_file():
        raise UserError(f"{demo.grid}: not found; run the quick demo from the repository root "
                        "(or /work in the container)")
    runs_dir, figures_dir = Path(runs) / demo.grid.stem, Path(figures) / demo.grid.stem
    console.print(f"quick demo ({demo.name}): {demo.grid} -> {runs_dir}", highlight=False)
    return demo, runs_dir, figures_dir


def finish(demo: Demo, figures_dir: Path, seconds: float, drawn: bool) -> None:
    """The closing lines: the wall time and where the figure (`drawn`: the file the runs
    gave, named for its settings), the table, the claims and the page are."""
    figure = figures_dir / "fig02_reverse_vocabulary.png"
    if drawn:  # the demo's settings are not the paper's: the file says so in its name
        figure = next(p for p in sorted(figures_dir.glob("fig02*.png")))
    took = int(seconds)
    console.print(f"\nquick demo ({demo.name}) trained and checked in {took // 60} min "
                  f"{took % 60} s\nfigure: {figure} "
                  f"(and .pdf)\ntable:  {figures_dir / 'results.csv'}\nclaims: "
                  f"{figures_dir / 'verify.md'}\nreport: {figures_dir / 'report.html'}",
                  highlight=False)


def quickstart(device: str = defaults.DEVICE, runs: Path = defaults.RUNS,
               out: Path = defaults.FIGURES, jobs: int | None = None,
               progress: bool = True) -> int:
    """The demo `device` chooses, swept into `runs`, its claims checked and its figures drawn
    into `out`; the exit code of the sweep, else of verify (1: a claim failed)."""
    demo, runs_dir, figures_dir = start(device, runs, out)
    began = time.monotonic()
    code = run_sweep(demo.grid, out=runs, options=SweepOptions(
        jobs=jobs or demo.jobs, runs_per_gpu=demo.runs_per_gpu, device=demo.device,
        progress=progress))
    swept = code == 0
    if swept:  # verify.md, then the page a reviewer opens: each figure beside its claims
        code = verify_runs([runs_dir], claims=demo.claims, out=figures_dir)
        make_report([runs_dir], claims=demo.claims, out=figures_dir)
    finish(demo, figures_dir, time.monotonic() - began, drawn=swept)
    return code
