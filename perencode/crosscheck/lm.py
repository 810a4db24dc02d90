"""The language model's vocabulary layout, batches and perplexity against the authors'
train_lm.py. Their LM code imports torchtext (and torchdata) at module level; where those
cannot be imported the check is reported "not run" with the reason."""

from __future__ import annotations

import importlib.util

from perencode.crosscheck.authors import Authors, NotRun

NEEDS = ("torchtext", "torchdata")


def check_lm(authors: Authors) -> list:
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise NotRun(f"needs {' and '.join(missing)}, which their train_lm.py imports "
                     "(torchtext 0.16.1 and torchdata 0.7.1 pair with the paper's torch "
                     "2.1.1; no wheel pairs with this torch)")
    raise NotRun("torchtext imports, but this version compares the language model only "
                 "through docs/paper-facts.md#language-modelling, not by running train_lm.py")
