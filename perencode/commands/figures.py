"""The results table and the paper's figures (`perencode figures`): the runs under its
paths collected (perencode.analysis.results) and drawn (perencode.analysis.plots)."""

from __future__ import annotations

from pathlib import Path

from perencode.analysis.plots import draw_figures
from perencode.analysis.results import collect
from perencode.common import defaults


def make_figures(runs: list[Path], out: Path = defaults.FIGURES,
                 accept_code_change: bool = False) -> list[Path]:
    """results.csv, the per-row tables and every figure the runs under `runs` cover, in
    `out` (perencode.analysis.plots.draw_figures)."""
    return draw_figures(collect([Path(p) for p in runs], "figures", accept_code_change), out)
