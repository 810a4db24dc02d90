"""Write REPRODUCE.md's cost section from `perencode plan` (the whole paper on an A100, and
budgets of 24, 100 and 500 GPU-hours): `python tools/cost_section.py`. tests/test_plan.py
checks that the committed section is what this writes."""

from __future__ import annotations

import os
from pathlib import Path

from perencode.commands.plan import cost_section, with_section
from perencode.common.files import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    os.chdir(ROOT)  # the grids' relative paths (the corpus folder) as a checkout has them
    reproduce = ROOT / "REPRODUCE.md"
    section = cost_section([Path("recipes/paper")])
    atomic_write_text(reproduce, with_section(reproduce.read_text(encoding="utf-8"), section))
    print(f"wrote the cost section of {reproduce}")
