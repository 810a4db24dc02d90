"""A WikiText-103-shaped raw corpus of a chosen size, for lm-prepare's memory, progress and
interrupt tests (and its measurement at 100 MB and more): headings, blank lines and
paragraphs of 40-160 words drawn by a Zipf law from 200,000 made-up words of random
letters, varied enough that SentencePiece can fill a 32,768-piece vocabulary.

    python tests/wikitext_like.py FOLDER MEGABYTES
"""

from __future__ import annotations

import itertools
import random
import sys
from pathlib import Path

LETTERS = "etaoinshrdlcumwfgypbvkjxqz"


def write_wikitext_like(folder: str | Path, megabytes: float, seed: int = 0,
                        words: int = 200_000) -> Path:
    """wiki.{train,valid,test}.raw in `folder`, the training file about `megabytes` MB (the
    other two 0.5% of it, at least 50 kB); returns `folder`."""
    folder = Path(folder)
    rng = random.Random(seed)
    weights = [1 / (i + 2) for i in range(len(LETTERS))]
    vocab = ["".join(rng.choices(LETTERS, weights=weights, k=rng.randint(2, 11)))
             for _ in range(words)]
    vocab += [",", ".", "the", "of", "@-@", "(", ")", "1", "19", "and"]
    rng.shuffle(vocab)
    cumulative = list(itertools.accumulate(1 / (i + 1) for i in range(len(vocab))))
    folder.mkdir(parents=True, exist_ok=True)
    for split, size in {"train": megabytes, "valid": megabytes / 200 + 0.05,
                        "test": megabytes / 200 + 0.05}.items():
        target, written = size * 1e6, 0
        with open(folder / f"wiki.{split}.raw", "w", encoding="utf-8", newline="\n") as f:
            while written < target:
                lines = [f" = {rng.choice(vocab).title()} = \n", " \n"]
                for _ in range(rng.randint(2, 6)):
                    n = rng.randint(40, 160)
                    lines += [" " + " ".join(rng.choices(vocab, cum_weights=cumulative, k=n))
                              + " \n", " \n"]
                text = "".join(lines)
                f.write(text)
                written += len(text)
    return folder


if __name__ == "__main__":
    write_wikitext_like(sys.argv[1], float(sys.argv[2]))
