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

import ast
import contextlib
import functools
import importlib.util
import io
import os
import random
import subprocess
import sys
import tempfile
import types
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import perencode
from perencode.commands.crosscheck.authors import Authors, NotRun
from perencode.commands.crosscheck.models import DTYPES, script_tree, their_state_dict
from perencode.commands.crosscheck.report import Comparison, numeric
from perencode.commands.crosscheck.tasks import Log
from perencode.config.recipe import EncodingConfig
from perencode.kinds.lm_data import SPLITS, Split, load
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


# -- the preparation: lm-prepare against their preprocess_wikitext.py and train_lm.py ----

# A small WikiText-shaped corpus: SentencePiece pieces, the longest input (--max-tokens).
PREP_VOCAB, PREP_MAX_TOKENS = 64, 12
# Lines that tell a heading rule from its near misses: their preprocess_wikitext.py drops
# blank lines (strip() == "") and lines starting with " =", nothing else.
EDGE_LINES = (" = Heading = ", " = = Section = = ", " = = = Deep = = = ", " =", "", " ",
              "\t \t", "=no space before = kept ", "  = two spaces before = kept ",
              " a = inside = kept ", " . ")


def write_corpus(folder: Path, seed: int = 0) -> None:
    """wiki.{train,valid,test}.raw in `folder`: headings, blank lines, paragraphs of made-up
    words (some longer than PREP_MAX_TOKENS pieces, some of one piece) and EDGE_LINES."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    syllables = ["ka", "to", "ri", "mu", "sen", "la", "po", "dra", "ne", "vo"]
    words = ["".join(rng.choices(syllables, k=rng.randint(1, 3))) for _ in range(200)]
    for split, n in {"train": 240, "valid": 30, "test": 30}.items():
        lines = [" ", f" = {split.title()} = ", " "]
        for i in range(n):
            if i % 10 == 5:
                lines.append(EDGE_LINES[i // 10 % len(EDGE_LINES)])
            size = rng.choice([1, 2, 5, 9, 20, 30])
            lines += [" " + " ".join(rng.choices(words, k=size)) + " . ", " "]
        lines += list(EDGE_LINES)
        (folder / f"wiki.{split}.raw").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _prepare_with_cli(source: Path, out: Path) -> None:
    """`perencode lm-prepare` as a user runs it, in its own process (a command does not
    import another), with this perencode first on the path."""
    root = str(Path(perencode.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [sys.executable, "-m", "perencode", "lm-prepare", "--source", str(source), "--out",
         str(out), "--vocab-size", str(PREP_VOCAB), "--max-tokens", str(PREP_MAX_TOKENS),
         "--threads", "1", "--no-progress"], capture_output=True, text=True, env=env,
        timeout=600)
    if done.returncode:
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"perencode lm-prepare exited {done.returncode}: {tail[0]}")


def their_truncation(authors: Authors, max_length: int) -> int:
    """The sequence length train_lm.py hands its Learner for `--max_length`: the expression
    it passes as `max_length=` (`args.max_length+1`), read from the script and evaluated
    with that argument (its __main__ block cannot run without torchtext)."""
    tree = script_tree(authors.repo.code / "train_lm.py")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "learner":
            for kw in node.keywords:
                if kw.arg == "max_length":
                    code = compile(ast.Expression(kw.value), "train_lm.py", "eval")
                    value = eval(code, {"__builtins__": {}},
                                 {"args": types.SimpleNamespace(max_length=max_length)})
                    return int(value)
    raise ValueError("train_lm.py: no `learner(..., max_length=...)` call found")


def _head(paragraphs: list[list[int]], at: int) -> str:
    """Paragraph `at`'s first pieces, for a reason line."""
    if at >= len(paragraphs):
        return "-"
    ids = paragraphs[at]
    return str(ids[:6])[:-1] + (", ...]" if len(ids) > 6 else "]")


def check_preparation(authors: Authors,
                      prepare: Callable[[Path, Path], None] = _prepare_with_cli
                      ) -> list[Comparison]:
    """lm-prepare on a generated WikiText-shaped corpus against their preprocess_wikitext.py
    (run): the paragraphs of each split, in order, after blank lines and headings are
    dropped; then the pieces kept of each (their Truncate(max_length + 1), the length
    train_lm.py passes, evaluated from its source). Their tokenizer training, vocabulary and
    padding are torchtext's (check_vocabulary)."""
    import sentencepiece as spm

    module = authors.script("preprocess_wikitext.py")
    with tempfile.TemporaryDirectory(prefix="perencode-crosscheck-") as tmp:
        folder = Path(tmp)
        write_corpus(folder / "raw")
        prepare(folder / "raw", folder / "prepared")
        splits = load(folder / "prepared", PREP_VOCAB, PREP_MAX_TOKENS)
        sp = spm.SentencePieceProcessor(model_file=str(folder / "prepared" /
                                                       "sentencepiece.model"))
        keep = their_truncation(authors, PREP_MAX_TOKENS)
        theirs: dict[str, list[str]] = {}
        for split in SPLITS:
            saved = folder / "theirs" / f"wiki.{split}.raw"
            with contextlib.redirect_stdout(io.StringIO()):
                module.main(str(folder / "raw" / f"wiki.{split}.raw"), str(saved))
            # LineReader (torchdata) hands each line without its newline to the tokenizer.
            theirs[split] = saved.read_text(encoding="utf-8").split("\n")[:-1]
        raw_lines = {split: (folder / "raw" / f"wiki.{split}.raw").read_text(
            encoding="utf-8").split("\n")[:-1] for split in SPLITS}
    wrong, shown, short, truncated = [], [], 0, 0
    for split in SPLITS:
        pieces = sp.encode(theirs[split], out_type=int)
        kept = [ids[:keep] for ids in pieces if len(ids) >= 2]
        short += len(pieces) - len(kept)
        truncated += sum(len(ids) > keep for ids in pieces)
        ours = [splits[split].tokens[a:b].tolist() for a, b in
                zip(splits[split].offsets[:-1], splits[split].offsets[1:])]
        differ = [i for i, (a, b) in enumerate(zip(ours, kept)) if a != b]
        if len(ours) != len(kept) or differ:
            at = differ[0] if differ else min(len(ours), len(kept))
            wrong.append(f"{split}: {len(ours)} paragraphs ours, {len(kept)} theirs; first "
                         f"differing paragraph {at}: ours {_head(ours, at)}, theirs "
                         f"{_head(kept, at)}")
        shown.append(f"{split} {len(kept)} of {len(raw_lines[split])} lines")
    check = Comparison(
        "language model: preparation", f"lm-prepare on a generated WikiText-shaped corpus "
        f"(headings, blank lines, {len(EDGE_LINES)} edge lines: headings, blanks and near "
        "misses of the heading rule): the "
        f"paragraphs of each split in order and the pieces kept of each ({keep} = their "
        f"max_length + 1 for --max-tokens {PREP_MAX_TOKENS}; {truncated} truncated); "
        + ", ".join(shown), "preprocess_wikitext.main (run); train_lm.py's max_length "
        "expression (evaluated); the pieces by our SentencePiece model",
        {"fp32": 0.0, "fp64": 0.0}, {"fp32": float(len(wrong)), "fp64": float(len(wrong))},
        unit="splits that differ", reason="; ".join(wrong),
        difference=f"paragraphs of fewer than 2 pieces ({short} here) are left out by "
        "lm-prepare; theirs are padded rows with no scored target").settle()
    return [check]
