"""The language model against the authors' train_lm.py: the perplexity of the same weights on
the same paragraphs, and the vocabulary layout.

Perplexity: ours is perencode.kinds.tasks.lm.LanguageModelTask.evaluate (exp of the mean
cross-entropy over the non-<unk> targets, `perencode eval`'s) with the package's
output_logits, over a small set of paragraphs with <unk> inside them and padding at their
ends; theirs is their train_lm.py Learner.test (exp of the summed losses of their
model.rnn.RNN's `forward(input, target=...)` over the summed counts of non-<unk> targets)
on the same batches and our weights. Their script imports torchtext and torchdata at its top
but its test uses neither: where those cannot be imported (no torchtext wheel pairs with
current torch), the script is loaded with inert stand-ins for those two imports only, taken
out of sys.modules as soon as it has loaded, and the row says so.

The vocabulary layout (their torchtext `vocab(..., specials=['<s>', '</s>', '<unk>'],
special_first=False)` against perencode.kinds.tasks.lm.model_ids) needs torchtext itself: "not run"
without it (not a central check).
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import types
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from perencode.commands.crosscheck.authors import Authors, NotRun
from perencode.commands.crosscheck.models import DTYPES, their_state_dict
from perencode.commands.crosscheck.report import Comparison, numeric
from perencode.commands.crosscheck.tasks import Log
from perencode.config.recipe import EncodingConfig
from perencode.kinds.lm_data import Split
from perencode.kinds.models.rnn import RecurrentModel
from perencode.kinds.tasks.lm import LanguageModelConfig, LanguageModelTask, model_ids, shapes
from perencode.training import session

NEEDS = ("torchtext", "torchdata")
# SentencePiece pieces (with <unk>, <s>, </s> as ids 0, 1, 2), embedding and hidden sizes,
# the longest input, and paragraphs per split.
V, E, H, LENGTH, PARAGRAPHS = 20, 8, 8, 12, 9
# The names train_lm.py imports from torchtext and torchdata at its top.
_IMPORTED = {"torchtext": (), "torchtext.vocab": ("vocab",),
             "torchtext.transforms": ("SentencePieceTokenizer",),
             "torchdata": (), "torchdata.datapipes": (),
             "torchdata.datapipes.iter": ("FileOpener", "LineReader")}


def missing() -> list[str]:
    return [name for name in NEEDS if importlib.util.find_spec(name) is None]


def _their_script(authors: Authors) -> tuple[types.ModuleType, str]:
    """train_lm.py as a module, and how it was loaded."""
    absent = missing()
    if not absent:
        return authors.script("train_lm.py"), "imported with torchtext and torchdata"
    added = []
    for name, symbols in _IMPORTED.items():
        if name in sys.modules:
            continue
        stand_in: Any = types.ModuleType(name)
        stand_in.__path__ = []
        for symbol in symbols:
            setattr(stand_in, symbol, None)  # never called: Learner.test uses neither
        sys.modules[name] = stand_in
        added.append(name)
    try:
        module = authors.script("train_lm.py")
    finally:
        for name in added:
            del sys.modules[name]
    return module, (f"{' and '.join(absent)} not installed: loaded with inert stand-ins for "
                    "its top-level imports, removed after loading")


def _task(seed: int = 0) -> LanguageModelTask:
    """A LanguageModelTask over generated paragraphs (no prepared folder): SentencePiece ids
    with <unk> (0) inside some paragraphs, lengths 2..LENGTH + 1 tokens."""
    cfg = LanguageModelConfig.model_construct(name="lm", vocab_size=V, length=LENGTH,
                                              data="generated")
    task = LanguageModelTask.__new__(LanguageModelTask)
    task.cfg, task.device = cfg, torch.device("cpu")
    task.shapes, task._model_ids = shapes(cfg), model_ids(V)
    gen = np.random.default_rng(seed)
    task.splits = {}
    for name in ("valid", "test"):
        lengths = gen.integers(2, LENGTH + 2, PARAGRAPHS)
        tokens = gen.integers(1, V, int(lengths.sum()))
        tokens[gen.random(len(tokens)) < 0.1] = 0  # <unk> inside paragraphs
        task.splits[name] = Split(tokens, np.concatenate([[0], np.cumsum(lengths)]))
    return task


def check_perplexity(authors: Authors) -> Comparison:
    task = _task()
    K = V - 1
    module, how = _their_script(authors)
    errors, parts = {}, {}
    for name, dtype in DTYPES.items():
        torch.manual_seed(3)
        mine = RecurrentModel("lstm", task.shapes, E, H, EncodingConfig(kind="sinusoidal",
                                                                        mode="concat"))
        their_rnn = authors.module("model.rnn").RNN(
            K, H, "LSTM", embed_size=E, time_encoding="concat",
            time_encoding_form="sinusoidal", max_length=LENGTH)
        their_rnn.load_state_dict(their_state_dict(mine, their_rnn), strict=True)
        mine, their_rnn = mine.to(dtype).eval(), their_rnn.to(dtype).eval()
        with torch.no_grad():
            ours = task.evaluate(functools.partial(session.output_logits, mine), 4)
        learner: Any = module.Learner.__new__(module.Learner)
        learner.logger, learner.device, learner.rnn = Log(), torch.device("cpu"), their_rnn
        worst, shown = 0.0, []
        for split in ("valid", "test"):
            batches = [task.rows(task.splits[split], index, torch.device("cpu")).sequences
                       for index in task.eval_batches(task.splits[split], 4)]
            with torch.no_grad():
                learner.test(batches)
            theirs = learner.logger.number(r"Test perplexity")
            tokens = learner.logger.number(r"# non-<unk> tokens")
            learner.logger.lines.clear()
            worst = max(worst, abs(ours[f"{split}_perplexity"] - theirs) / theirs,
                        abs(ours[f"{split}_tokens"] - tokens))
            shown.append(f"{split} {ours[f'{split}_perplexity']:.4f} vs {theirs:.4f}")
        errors[name], parts[name] = worst, ", ".join(shown)
    # fp64: the sinusoidal tables are fp32-computed on both sides (the forward check's).
    return numeric(
        "language model: perplexity", f"perplexity and non-<unk> token count of an LSTM with "
        f"sinusoidal PE (V={V}, K={K}, E=H={E}) on {PARAGRAPHS} generated paragraphs per "
        f"split (<unk> inside, padding at the ends) by LanguageModelTask.evaluate; "
        f"{parts['fp64']}", f"train_lm.Learner.test over model.rnn.RNN.forward(input, "
        f"target) ({how})", {"fp32": 1e-5, "fp64": 1e-7}, errors,
        unit="max of relative perplexity difference, token count difference")


def check_vocabulary(authors: Authors) -> Comparison:
    absent = missing()
    if absent:
        raise NotRun(f"needs {' and '.join(absent)} (their vocabulary is torchtext's): "
                     "torchtext 0.16.1 and torchdata 0.7.1 pair with the paper's torch 2.1.1 "
                     "(make test-compat's container); no wheel pairs with this torch")
    module = authors.script("train_lm.py")
    pieces = ["<unk>", "<s>", "</s>"] + [f"p{i}" for i in range(V - 3)]  # SentencePiece order
    vocab = module.ordered2vocab(OrderedDict((p, -float(i)) for i, p in enumerate(pieces)),
                                 specials=["<s>", "</s>", "<unk>"], special_first=False,
                                 min_freq=-torch.inf)
    theirs = np.array([vocab[p] for p in pieces])
    ours = model_ids(V)
    wrong = int((theirs != ours).sum()) + (0 if len(vocab) - 1 == V - 1 else 1)
    return numeric(
        "language model: vocabulary", f"model id of each of {V} SentencePiece pieces "
        "(<unk> last, doubling as padding; K = V - 1 classes)",
        "train_lm.py's torchtext vocab(specials=['<s>', '</s>', '<unk>'], "
        "special_first=False)", {"fp32": 0.0, "fp64": 0.0},
        {"fp32": float(wrong), "fp64": float(wrong)}, unit="pieces placed differently")


def check_lm(authors: Authors) -> list[Comparison]:
    checks = [check_perplexity(authors)]
    try:
        checks.append(check_vocabulary(authors))
    except NotRun as exc:
        checks.append(Comparison("language model: vocabulary", "model id of each piece",
                                 "train_lm.py's torchtext vocab", verdict="not run",
                                 reason=str(exc)))
    return checks
