"""The defaults of the commands' library functions, each written once.

The library functions take their defaults from here, and the CLI shows and passes the same
values: this module imports only pathlib, so `perencode --help` reads it without loading torch
(which the functions' own modules import). A default the CLI does not show stays in its
function's signature.
"""

from __future__ import annotations

from pathlib import Path

# Shared by several commands.
DEVICE = "auto"            # perencode.common.device.resolve_device: cuda if available, else cpu
RUNS = Path("runs")        # the root of the run directories
FIGURES = Path("figures")  # figures, verify and report write here
CLAIMS = "paper"           # the bundled claims file of the paper (perencode/claims)

# perencode.commands.sweep.SweepOptions
SWEEP_EXECUTOR = "local"
SWEEP_JOBS = 1
SWEEP_RUNS_PER_GPU = 1

# perencode.commands.stability.analyse_run (docs/stability.md)
STABILITY_TRIPLETS = 1024
STABILITY_METRIC = "weighted"
STABILITY_EVERY = 1
STABILITY_BATCH = 16

# perencode.commands.lm_prepare.prepare: the authors' corpus, vocabulary and paragraph length
LM_SOURCE = "wikitext-103-raw-v1"  # the configuration of the Hugging Face dataset `wikitext`
LM_DATA = Path("data/wikitext103")
LM_VOCAB_SIZE = 32768
LM_MAX_TOKENS = 1024
LM_THREADS = 0  # the cores this process may use
LM_SAMPLE = 0   # paragraphs the vocabulary is trained on: 0, all of them (as the authors did)

# perencode.commands.bench.bench and .sampling
BENCH_ITERATIONS = 20
BENCH_WARMUP = 3

# perencode.commands.crosscheck.run_crosscheck
CROSSCHECK_SHAPE = "cpu"
CROSSCHECK_SEEDS = 3

# perencode.training.tensorboard.tensorboard_command
TENSORBOARD_PORT = 6006
