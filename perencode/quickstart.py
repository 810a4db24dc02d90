"""`perencode quickstart` (`make quickstart`): the paper's headline effect in about 15
minutes. On the CPU, a small GRU at a CPU-sized vocabulary; where a CUDA device is present,
Fig. 2's GRU at the paper's own shapes on one GPU. Each demo is a grid in recipes/quick/
and a claims file bundled in perencode/claims/; the command (perencode.cli) sweeps the
grid, checks the claims (verify.md), draws the figures beside them in report.html and
prints the wall time: `start` and `finish` here, the sweep, verify and report between."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from perencode import defaults
from perencode.console import console
from perencode.errors import UserError
from perencode.grid import repository_root


@dataclass(frozen=True)
class Demo:
    name: str
    grid: Path        # relative to the repository root (perencode.grid.repository_root)
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
