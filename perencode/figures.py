"""The results table and the paper's figures (`perencode figures`): the runs under its
paths collected (perencode.results) and drawn (perencode.plots)."""

from __future__ import annotations

from pathlib import Path

from perencode import defaults
from perencode.plots import draw_figures
from perencode.results import collect


def make_figures(runs: list[Path], out: Path = defaults.FIGURES,
                 accept_code_change: bool = False) -> list[Path]:
    """results.csv, the per-row tables and every figure the runs under `runs` cover, in
    `out` (perencode.plots.draw_figures)."""
    return draw_figures(collect([Path(p) for p in runs], "figures", accept_code_change), out)
