"""`perencode lm-prepare`: WikiText-103 raw -> SentencePiece -> flat token files
(docs/paper-facts.md#language-modelling).

The steps of the authors' preprocess_wikitext.py, build_tokenizer.py and train_lm.py:
1. drop blank lines and headings (lines starting with " ="); every remaining line is one
   paragraph, one sequence;
2. train a SentencePiece unigram model on the training paragraphs (torchtext's
   `generate_sp_model`: SentencePiece's defaults except the vocabulary size);
3. encode every split and keep a paragraph's first max_tokens + 1 pieces (train_lm.py's
   `Truncate(max_length + 1)`: the input is tokens[:-1], the targets tokens[1:]).
A paragraph of fewer than 2 pieces has nothing to predict and is left out (counted).

The folder is built beside `out` and renamed into place once complete, so `out` is always
either the previous complete build or the new one. Re-running with the same inputs and
options finds the manifest's fingerprint unchanged and does nothing (even where the folder
above `out` is read-only). A build folder left by a killed run is removed by the next one,
which first ends the trainer still running in it, if any. Runs on one `out` take turns
through `.OUT.lock` beside it, removed when its holder ends.

SentencePiece holds every training sentence in memory (as the authors' torchtext call did):
about SPM_MEMORY_PER_BYTE bytes per byte of training text at its peak. Before training, that
estimate is checked against the memory this process may use (its cgroup's limit, SLURM's
allocation, the free RAM); a build that cannot fit is refused with the way out (`--force`,
or `--sample N`, a departure from the authors' full-corpus vocabulary). The
trainer runs in a child process, so that its progress is shown while it trains and Ctrl-C
ends it within a second; SIGTERM and SIGHUP are handled as Ctrl-C is, and the child dies
with this process however it dies (PR_SET_PDEATHSIG). A failed training is said in
perencode's words with the option to change, its log kept as OUT.sentencepiece.log.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import itertools
import json
import multiprocessing
import os
import re
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from perencode.common import defaults
from perencode.common.console import console
from perencode.common.errors import DISK_ERRORS, UserError
from perencode.common.files import disk_errors, fsync_dir, tail_lines
from perencode.common.host import available_cores, memory_available
from perencode.common.processes import set_parent_death_signal
from perencode.common.progress import Reporter
from perencode.kinds.lm_data import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    SPLITS,
    check_files,
    file_record,
    token_dtype,
)

RAW_FILES = {split: f"wiki.{split}.raw" for split in SPLITS}
HUB_DATASET = "wikitext"
DATASET_SPLITS = {"train": ("train",), "valid": ("validation", "valid"), "test": ("test",)}
NEEDS_SOURCE = ("pass --source DIR: a folder with wiki.train.raw, wiki.valid.raw and "
                "wiki.test.raw (unzipped wikitext-103-raw-v1.zip) or a `datasets` dataset "
                "saved with save_to_disk")
ENCODE_CHUNK = 8192  # paragraphs per multi-threaded SentencePiece call


# SentencePiece's unigram trainer at its peak, per byte of training text (every sentence,
# its suffix array and the seed pieces), SentencePiece 0.2.3: 17 on a 540 MB WikiText-shaped
# corpus (9.0 GB), 20 on tests/wikitext_like.py's 109 MB (2,271 MiB); the larger, so that
# the check errs towards a refusal `--force` overrides rather than a killed process.
SPM_MEMORY_PER_BYTE = 20
SPM_MEMORY_BASE = 200 << 20
# How often a log line reports the trainer's progress when the output is not a terminal.
PROGRESS_EVERY_S = 30.0


def trainer_options(vocab_size: int, sample_sentences: int = 0) -> dict:
    """SentencePiece trainer options: torchtext's call (unigram, vocabulary size) with the
    library defaults it relied on written out, so the manifest records them and another
    library default cannot change the tokenizer unnoticed. `sample_sentences` > 0 trains on
    that many sentences drawn at random (SentencePiece's own sampling), not on all of them.

    The trainer's thread count (`--threads`) is recorded beside these, not among them: the
    unigram EM sums per-thread statistics, so another count can move a score in its last
    digits, but a build made with any count is a valid build of the same options.
    SentencePiece's default, which the authors ran, is 16.
    """
    sample = {"input_sentence_size": sample_sentences, "shuffle_input_sentence": True} \
        if sample_sentences else {"input_sentence_size": 0}
    return {"model_type": "unigram", "vocab_size": vocab_size, "character_coverage": 0.9995,
            "max_sentence_length": 4192, **sample,
            "unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1}


def estimate_memory(train_bytes: int) -> int:
    """SentencePiece's peak memory, in bytes, training on `train_bytes` of text."""
    return SPM_MEMORY_BASE + SPM_MEMORY_PER_BYTE * train_bytes


def check_memory(train_bytes: int, paragraphs: int, sample_sentences: int) -> None:
    """Refuse, in one line with the way out, a tokenizer training that cannot fit."""
    used = train_bytes if not sample_sentences or sample_sentences >= paragraphs else \
        train_bytes * sample_sentences // max(paragraphs, 1)
    need = estimate_memory(used)
    limit = memory_available()
    if limit is None or need <= limit[0]:
        return
    fits = (limit[0] - SPM_MEMORY_BASE) // SPM_MEMORY_PER_BYTE * paragraphs \
        // max(train_bytes, 1)
    sample = (f", or --sample {min(fits, paragraphs)} to train the vocabulary on "
              f"a random sample of the paragraphs (a departure from the authors' full-corpus "
              f"vocabulary)") if fits >= 1 else ""
    raise UserError(f"training SentencePiece on {train_bytes / 1e6:,.1f} MB of text needs "
                    f"about {need / 2**30:.1f} GiB at its peak, more than the "
                    f"{limit[0] / 2**30:.1f} GiB of {limit[1]}: run it where there is more "
                    f"memory, or pass --force to try anyway{sample}")


def is_paragraph(line: str) -> bool:
    """preprocess_wikitext.py's filter: neither blank nor a heading (" = Title = ")."""
    return line.strip() != "" and not line.startswith(" =")


# -- sources ---------------------------------------------------------------------------

@dataclass
class Source:
    """Raw WikiText lines by split. `identity` fingerprints the content (not its location)."""

    identity: dict
    location: str
    read: Callable[[str], Iterator[str]]  # split -> raw lines without their newline


def _read_raw(path: Path) -> Iterator[str]:
    # Text mode with universal newlines, as the authors' open(path, 'r') read the files.
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                yield line.rstrip("\n")
    except UnicodeDecodeError:
        raise UserError(_not_utf8(path)) from None


def _not_utf8(path: Path) -> str:
    """One line naming the first line of `path` that is not UTF-8 (WikiText's raw files are)."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as exc:
                return (f"{path}: line {number} is not UTF-8 text (byte "
                        f"{line[exc.start]:#04x} at column {exc.start + 1}); WikiText's raw "
                        f"files are UTF-8: convert it, e.g. iconv -f latin1 -t utf-8")
    return f"{path}: not UTF-8 text"


def _file_source(folder: Path) -> Source:
    files = {split: folder / name for split, name in RAW_FILES.items()}
    return Source(identity={"kind": "files", "files": {p.name: file_record(p)
                                                       for p in files.values()}},
                  location=str(folder.resolve()), read=lambda split: _read_raw(files[split]))


def _import_datasets(what: str):
    try:
        import datasets
    except ImportError:
        raise UserError(f"{what} needs the Hugging Face `datasets` package (pip install "
                        f"'perencode[hf]'); otherwise {NEEDS_SOURCE}") from None
    return datasets


def _dataset_source(dataset, location: str) -> Source:
    """A `datasets` DatasetDict with a `text` column; its split fingerprints identify it."""
    chosen = {}
    for split, names in DATASET_SPLITS.items():
        found = [n for n in names if n in dataset]
        if not found:
            raise UserError(f"{location}: dataset has no '{names[0]}' split (has "
                            f"{', '.join(dataset)})")
        chosen[split] = dataset[found[0]]
        if "text" not in chosen[split].column_names:
            raise UserError(f"{location}: split '{found[0]}' has no 'text' column")

    def read(split: str) -> Iterator[str]:
        for rows in chosen[split].iter(batch_size=10_000):
            for text in rows["text"]:
                yield text.rstrip("\n")

    fingerprints = {split: ds._fingerprint for split, ds in chosen.items()}
    return Source(identity={"kind": "datasets", "fingerprints": fingerprints},
                  location=location, read=read)


def open_source(source: str | None) -> Source:
    """None -> the Hub's wikitext-103-raw-v1; a folder of raw files or a saved dataset;
    or a wikitext configuration name of the Hub (e.g. wikitext-2-raw-v1)."""
    if source is None or (not Path(source).expanduser().exists()
                          and re.fullmatch(r"wikitext-[\w-]+", source)):
        config = source or defaults.LM_SOURCE
        datasets = _import_datasets(f"{HUB_DATASET}/{config} (from the Hugging Face Hub)")
        try:
            dataset = datasets.load_dataset(HUB_DATASET, config)
        except Exception as exc:  # noqa: BLE001 - offline, proxy, hub errors alike
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise UserError(f"could not load {HUB_DATASET}/{config} with `datasets` "
                            f"({first}); without a network, {NEEDS_SOURCE}") from None
        return _dataset_source(dataset, f"{HUB_DATASET}/{config}")
    folder = Path(source).expanduser()
    if not folder.is_dir():
        raise UserError(f"{source}: no such folder; pass a folder with wiki.train.raw, "
                        f"wiki.valid.raw and wiki.test.raw, a `datasets` dataset saved with "
                        f"save_to_disk, or a wikitext configuration such as {defaults.LM_SOURCE}")
    present = [name for name in RAW_FILES.values() if (folder / name).is_file()]
    if len(present) == len(RAW_FILES):
        return _file_source(folder)
    if present:
        missing = sorted(set(RAW_FILES.values()) - set(present))
        raise UserError(f"{folder}: missing {', '.join(missing)}")
    if (folder / "dataset_dict.json").is_file():
        datasets = _import_datasets(f"{folder} (a dataset saved with save_to_disk)")
        return _dataset_source(datasets.load_from_disk(str(folder)), str(folder.resolve()))
    raise UserError(f"{folder}: neither wiki.train.raw, wiki.valid.raw, wiki.test.raw nor a "
                    f"`datasets` DatasetDict saved with save_to_disk")


# -- the build -------------------------------------------------------------------------

def _clean(lines: Iterator[str], path: Path) -> dict:
    """Write the paragraphs of `lines` to `path`, one a line; count what was dropped."""
    counts = {"lines": 0, "empty_lines": 0, "headings": 0, "paragraphs": 0}
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for line in lines:
            counts["lines"] += 1
            if is_paragraph(line):
                f.write(line + "\n")
                counts["paragraphs"] += 1
            elif line.strip() == "":
                counts["empty_lines"] += 1
            else:
                counts["headings"] += 1
    return counts


def _paragraphs(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8", newline="\n") as f:
        for line in f:
            yield line.rstrip("\n")


# In the build folder while the trainer runs: its pid, locked by it (perencode.commands.lm_prepare
# ends a trainer whose lm-prepare was killed before removing the folder).
TRAINER_PID = "trainer.pid"
FAILED = "perencode: SentencePiece training failed: "


def _die_with(parent: int) -> None:
    """End this process when `parent` dies, however it dies (Linux; elsewhere the next
    lm-prepare ends it, `_end_trainer`)."""
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _train_child(train_text: str, folder: str, options: dict, parent: int) -> None:
    """The child process that trains the tokenizer: SentencePiece logs to its own file
    descriptor 2, pointed at sentencepiece.log, and the model goes to sentencepiece.model.
    It dies with `parent` (its lm-prepare), and holds TRAINER_PID locked while it lives.
    Ctrl-C is the parent's to act on: it ends this process."""
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    mine = open(Path(folder) / TRAINER_PID, "w")  # noqa: SIM115 - held until the process ends
    fcntl.flock(mine, fcntl.LOCK_EX)
    mine.write(f"{os.getpid()}\n")
    mine.flush()
    import sentencepiece as spm

    if options.get("input_sentence_size"):
        spm.set_random_generator_seed(0)  # the same sample on every run
    with open(Path(folder) / "sentencepiece.log", "w", encoding="utf-8") as log:
        os.dup2(log.fileno(), 2)
        model = io.BytesIO()  # model_writer keeps build paths out of the model's trainer spec
        try:
            spm.SentencePieceTrainer.train(sentence_iterator=_paragraphs(Path(train_text)),
                                           model_writer=model, **options)
        except RuntimeError as exc:
            print(FAILED + " ".join(str(exc).split()), file=log, flush=True)
            raise SystemExit(1) from None
    (Path(folder) / "sentencepiece.model").write_bytes(model.getvalue())


def _end_trainer(build: Path) -> int | None:
    """End the trainer still running in a killed lm-prepare's build folder (one that
    predates PR_SET_PDEATHSIG, or off Linux) and wait until it has gone; its pid, or None
    when none was running. Called holding the output's lock: no live lm-prepare owns it."""
    path = build / TRAINER_PID
    try:
        f = open(path, "r+")  # noqa: SIM115 - closed below
    except OSError:
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return None  # nobody holds it: its trainer has ended
        except BlockingIOError:
            pass
        text = f.read().strip()
        if not text.isdigit():
            return None
        pid = int(text)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.1)
        else:
            raise UserError(f"{build}: its SentencePiece trainer (pid {pid}) does not end; "
                            f"end it (kill -9 {pid}) and run lm-prepare again")
    return pid


def _stage(log: Path) -> str:
    """The trainer's latest log line, without its source-file prefix."""
    try:
        lines = tail_lines(log, 2048)
    except OSError:
        return ""
    last = next((line for line in reversed(lines) if line.strip()), "")
    # 0.2.x glog style "I0000 00:00:17.5 123 trainer.cc:903] ...", older "x.cc(12) LOG(INFO) "
    return re.sub(r"^.*?\.cc(?::\d+\]|\(\d+\))\s*(?:LOG\(\w+\)\s*)?", "", last).strip()[:100]


class _TrainerFailed(Exception):
    """The trainer ended with `exitcode` (its message, or None)."""

    def __init__(self, exitcode: int | None, message: str | None):
        super().__init__(message)
        self.exitcode, self.message = exitcode, message


def _failure_message(log: Path) -> str | None:
    """SentencePiece's whole message, as the child wrote it at the end of its log."""
    try:
        lines = tail_lines(log, 8192)
    except OSError:
        return None
    found = [line[len(FAILED):] for line in lines if line.startswith(FAILED)]
    return found[-1] if found else None


def _failure(failed: _TrainerFailed, options: dict, train_text: Path, log: str) -> str:
    """A failed trainer in perencode's words: what is wrong and the option to change."""
    message = failed.message or ""
    where = f"SentencePiece's message is in {log}"
    too_many = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value "
                         r"<= (\d+)", message)
    if too_many:
        return (f"--vocab-size {too_many.group(1)} is too large for this corpus: SentencePiece "
                f"can make at most {too_many.group(2)} pieces from it; pass --vocab-size "
                f"{too_many.group(2)} or less, or a larger corpus ({where})")
    few = re.search(r"input_sentence_size\(\) > (\d+)\]", message)
    if few:
        return (f"--sample {options.get('input_sentence_size')} is too small: SentencePiece "
                f"samples at least {int(few.group(1)) + 1} paragraphs; pass --sample "
                f"{int(few.group(1)) + 1} or more, or leave --sample out to train on every "
                f"paragraph ({where})")
    if "!sentences_.empty()" in message:
        limit = options["max_sentence_length"]
        longest, count = 0, 0
        with open(train_text, "rb") as f:
            for line in f:
                longest, count = max(longest, len(line) - 1), count + 1
        if count and longest > limit:
            return (f"no training paragraph is short enough for SentencePiece: the longest has "
                    f"{longest:,} bytes and it skips those over {limit:,}; WikiText has one "
                    f"paragraph a line, and this corpus has {count:,} line"
                    f"{'s' if count > 1 else ''} (a file without its line breaks?) ({where})")
    if failed.exitcode is not None and failed.exitcode < 0:
        return (f"SentencePiece training was killed by signal {-failed.exitcode} (out of "
                f"memory? `--sample N` needs less) ({where})")
    return (f"SentencePiece training failed (exit code {failed.exitcode}): "
            f"{message or 'no message'} ({where})")


def _elapsed(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _train_tokenizer(train_text: Path, folder: Path, options: dict, progress: bool):
    """Train the unigram model on the training paragraphs in a child process, saying how
    long it has been at it and what it is doing; write .model, .vocab and the log. Ctrl-C
    or SIGTERM (KeyboardInterrupt, Stopped) ends the child within a second and
    propagates; SIGKILL ends it too (PR_SET_PDEATHSIG). A failure is a UserError in
    perencode's words (`_failure`)."""
    import sentencepiece as spm

    log = folder / "sentencepiece.log"
    child = multiprocessing.get_context("spawn").Process(
        target=_train_child, args=(str(train_text), str(folder), options, os.getpid()),
        daemon=True)
    t0 = time.monotonic()
    child.start()
    status = console.status("") if progress and console.is_terminal else None
    last_line = t0
    try:
        if status is not None:
            status.start()
        while child.is_alive():
            child.join(0.2)
            now = time.monotonic()
            if status is not None:
                status.update(f"SentencePiece {_elapsed(now - t0)}: {_stage(log)}")
            elif progress and now - last_line >= PROGRESS_EVERY_S:
                last_line = now
                console.print(f"[lm-prepare] SentencePiece training, {_elapsed(now - t0)} "
                              f"elapsed: {_stage(log)}", markup=False, highlight=False,
                              soft_wrap=True)
    finally:
        if status is not None:
            status.stop()
        if child.is_alive():  # interrupted: end it now, not when its training ends
            child.terminate()
            child.join(1.0)
            if child.is_alive():
                child.kill()
                child.join()
    (folder / TRAINER_PID).unlink(missing_ok=True)
    if child.exitcode != 0:
        raise _TrainerFailed(child.exitcode, _failure_message(log))
    # The largest child this process has waited for: the trainer (Linux: KiB; macOS: bytes).
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    peak_mb = peak / 2**20 if sys.platform == "darwin" else peak / 2**10
    if progress:
        console.print(f"trained SentencePiece in {_elapsed(time.monotonic() - t0)}, peak "
                      f"memory {peak_mb:,.0f} MiB", highlight=False)
    model = (folder / "sentencepiece.model").read_bytes()
    sp = spm.SentencePieceProcessor(model_proto=model)
    with open(folder / "sentencepiece.vocab", "w", encoding="utf-8", newline="\n") as f:
        for i in range(sp.get_piece_size()):  # the layout SentencePiece's own .vocab has
            f.write(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n")
    return sp, round(peak_mb)


def _encode(sp, split: str, folder: Path, paragraphs: int, max_tokens: int, threads: int,
            progress: bool) -> dict:
    """Encode a split's paragraphs into <split>.bin / <split>.idx; return the counts."""
    keep = max_tokens + 1  # Truncate(max_length + 1): inputs tokens[:-1], targets tokens[1:]
    dtype = token_dtype(sp.get_piece_size())
    unk = sp.unk_id()
    counts = {"too_short": 0, "truncated": 0, "sequences": 0, "pieces": 0, "tokens": 0,
              "unk_tokens": 0, "scored_tokens": 0}
    lengths = []
    text = _paragraphs(folder / f"{split}.txt")
    with open(folder / f"{split}.bin", "wb") as out, \
            Reporter(f"encode {split}", paragraphs, log_every=ENCODE_CHUNK * 16, unit="par",
                     enabled=progress) as reporter:
        while chunk := list(itertools.islice(text, ENCODE_CHUNK)):
            encoded = sp.encode(chunk, out_type=int, num_threads=threads)
            kept = [ids[:keep] for ids in encoded if len(ids) >= 2]
            n = np.fromiter(map(len, kept), dtype=np.int64, count=len(kept))
            flat = np.fromiter(itertools.chain.from_iterable(kept), dtype=dtype,
                               count=int(n.sum()))
            flat.tofile(out)
            pieces = sum(map(len, encoded))
            is_unk = flat == unk
            first_unk = int(is_unk[np.cumsum(n) - n].sum()) if len(n) else 0
            counts["too_short"] += len(encoded) - len(kept)
            counts["truncated"] += sum(len(ids) > keep for ids in encoded)
            counts["sequences"] += len(kept)
            counts["pieces"] += pieces
            counts["tokens"] += len(flat)
            counts["unk_tokens"] += int(is_unk.sum())
            # Targets are tokens[1:] that are not <unk> (<unk> is masked out;
            # docs/paper-facts.md#language-modelling).
            counts["scored_tokens"] += len(flat) - len(kept) - (int(is_unk.sum()) - first_unk)
            lengths.append(n)
            reporter.advance(len(chunk), tokens=counts["tokens"])
        out.flush()
        os.fsync(out.fileno())
    counted = np.concatenate(lengths or [np.zeros(0, np.int64)])
    offsets = np.concatenate([[0], np.cumsum(counted)]).astype(np.int64)
    with open(folder / f"{split}.idx", "wb") as f:
        offsets.tofile(f)
        f.flush()
        os.fsync(f.fileno())
    return counts


def _build(src: Source, folder: Path, vocab_size: int, max_tokens: int, threads: int,
           fingerprint: str, progress: bool, out: Path, force: bool = False,
           sample_sentences: int = 0) -> dict:
    import sentencepiece as spm

    seconds = {}
    t0 = time.perf_counter()
    splits = {split: _clean(src.read(split), folder / f"{split}.txt") for split in SPLITS}
    seconds["clean"] = time.perf_counter() - t0
    train_bytes = (folder / "train.txt").stat().st_size
    if not splits["train"]["paragraphs"]:
        raise UserError(f"{src.location}: the training split has no paragraph (its "
                        f"{splits['train']['lines']:,} lines are blank or headings): nothing "
                        "to train the vocabulary on; pass --source a WikiText-shaped corpus")
    if not force:
        check_memory(train_bytes, splits["train"]["paragraphs"], sample_sentences)

    trainer = {**trainer_options(vocab_size, sample_sentences), "num_threads": threads}
    if progress:
        sample = f" (a sample of {sample_sentences:,})" if sample_sentences else ""
        console.print(f"training SentencePiece unigram ({vocab_size} pieces, {threads} threads)"
                      f" on {splits['train']['paragraphs']:,} paragraphs{sample}, "
                      f"{train_bytes / 1e6:,.1f} MB, about "
                      f"{estimate_memory(train_bytes) / 2**30:.1f} GiB at its peak; its log: "
                      f"{folder / 'sentencepiece.log'} (kept as {out / 'sentencepiece.log'})",
                      highlight=False, soft_wrap=True)
    t0 = time.perf_counter()
    try:
        sp, peak_mb = _train_tokenizer(folder / "train.txt", folder, trainer, progress)
    except _TrainerFailed as failed:
        kept = failed_log(out)
        try:
            shutil.copyfile(folder / "sentencepiece.log", kept)
            where = str(kept)
        except OSError as exc:
            where = f"its log, which could not be kept as {kept} ({exc.strerror})"
        raise UserError(_failure(failed, trainer, folder / "train.txt", where)) from None
    seconds["tokenizer"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    for split in SPLITS:
        splits[split] |= _encode(sp, split, folder, splits[split]["paragraphs"], max_tokens,
                                 threads, progress)
        (folder / f"{split}.txt").unlink()
    seconds["encode"] = time.perf_counter() - t0

    files = sorted(p.name for p in folder.iterdir())
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "fingerprint": fingerprint,
        "source": {**src.identity, "location": src.location},
        "vocab_size": vocab_size,
        "max_tokens": max_tokens,
        "token_dtype": token_dtype(vocab_size).name,
        "tokenizer": {"model": "sentencepiece.model", "vocab": "sentencepiece.vocab",
                      "log": "sentencepiece.log", "trainer": trainer,
                      "sentencepiece_version": spm.__version__,
                      "peak_memory_mib": peak_mb, "training_text_bytes": train_bytes},
        "splits": splits,
        "files": {name: file_record(folder / name) for name in files},
        "encode_threads": threads,
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    with open(folder / MANIFEST, "w", encoding="utf-8") as f:  # the folder swap is atomic
        f.write(json.dumps(manifest, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return manifest


# -- the folder swap -------------------------------------------------------------------

def failed_log(out: Path) -> Path:
    """Where a failed tokenizer training's log is kept (removed by the next build)."""
    return out.parent / f"{out.name}.sentencepiece.log"


@contextmanager
def _locked(out: Path):
    """One lm-prepare per output folder at a time (so leftovers can be removed safely): a
    second waits for the first. The lock file `.OUT.lock` beside `out` lives only while its
    holder runs: the holder removes it before letting go, and a waiter that then gets the
    lock of a removed file tries again on the path's new one."""
    path = out.parent / f".{out.name}.lock"
    while True:
        f = open(path, "a")  # noqa: SIM115 - closed below
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            same = os.path.samestat(os.stat(path), os.fstat(f.fileno()))
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        f.close()


def _up_to_date(out: Path, fingerprint: str) -> dict | None:
    """The manifest of `out` when it is a complete build of `fingerprint`, else None."""
    previous = _previous_manifest(out)
    if previous is None or previous.get("fingerprint") != fingerprint:
        return None
    try:
        check_files(out, previous)
    except UserError:
        return None  # an output file changed: build again
    return previous


def _previous_manifest(out: Path) -> dict | None:
    """The manifest of an earlier build in `out` (any format version); None if `out` is
    absent or empty; UserError if `out` holds something else, which is never replaced."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise UserError(f"{out}: exists and is not a folder; choose another --out")
    path = out / MANIFEST
    if not path.is_file():
        if any(out.iterdir()):
            raise UserError(f"{out}: exists but was not made by `perencode lm-prepare` (no "
                            f"{MANIFEST}); choose another --out or remove it")
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserError(f"{path}: not a manifest of `perencode lm-prepare`; choose another "
                        f"--out or remove {out}")
    return manifest


def prepare(source: str | None = None, out: str | Path = defaults.LM_DATA,
            vocab_size: int = defaults.LM_VOCAB_SIZE, max_tokens: int = defaults.LM_MAX_TOKENS,
            threads: int = defaults.LM_THREADS, progress: bool = True, force: bool = False,
            sample_sentences: int = defaults.LM_SAMPLE) -> dict:
    """Build `out` from WikiText-103 (or confirm it is up to date); returns its manifest
    plus `status`: "built", "rebuilt" or "up to date".

    threads: SentencePiece's training and encoding threads (0: the cores this process may
    use). force: skip the memory check. sample_sentences: train the tokenizer on that many
    random paragraphs (0: all of them, as the authors did).
    """
    import sentencepiece as spm

    out = Path(out)
    threads = threads or available_cores()
    src = open_source(source)
    options = {"vocab_size": vocab_size, "max_tokens": max_tokens,
               "trainer": trainer_options(vocab_size, sample_sentences),
               "sentencepiece": spm.__version__, "format_version": FORMAT_VERSION}
    fingerprint = hashlib.sha256(json.dumps({"source": src.identity, "options": options},
                                            sort_keys=True).encode()).hexdigest()
    out.parent.mkdir(parents=True, exist_ok=True)
    if not os.access(out.parent, os.W_OK):  # read-only: it can still be found up to date
        current = _up_to_date(out, fingerprint)
        if current is not None:
            return current | {"status": "up to date"}
        read_only = hasattr(os, "statvfs") and os.statvfs(out.parent).f_flag & os.ST_RDONLY
        why = DISK_ERRORS[errno.EROFS if read_only else errno.EACCES]
        raise UserError(f"{out.parent}: cannot write: {why}; {out} is not an up-to-date "
                        "build of these inputs and options: choose an --out in a writable "
                        "folder")
    with _locked(out), _stopped_by_signals():
        for leftover in out.parent.iterdir():  # a crashed build's folders: never trusted
            if leftover.name.startswith((f".{out.name}.build-", f".{out.name}.old-")):
                pid = _end_trainer(leftover)
                shutil.rmtree(leftover, ignore_errors=True)
                ended = f" and ended its SentencePiece trainer (pid {pid})" if pid else ""
                console.print(f"[yellow]note:[/] removed {leftover}{ended}, left by an "
                              "lm-prepare that was killed", highlight=False, soft_wrap=True)
        previous = _previous_manifest(out)
        current = _up_to_date(out, fingerprint)
        if current is not None:
            return current | {"status": "up to date"}
        build = Path(tempfile.mkdtemp(prefix=f".{out.name}.build-", dir=out.parent))
        umask = os.umask(0)
        os.umask(umask)
        build.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide the data from other users
        kept = (f"{out} keeps its previous build" if out.exists()
                else f"{out} was not created")
        try:
            with disk_errors(build, kept):
                manifest = _build(src, build, vocab_size, max_tokens, threads, fingerprint,
                                  progress, out, force, sample_sentences)
                if out.exists():
                    old = build.with_name(build.name.replace(".build-", ".old-"))
                    os.rename(out, old)
                    os.rename(build, out)
                    shutil.rmtree(old)
                else:
                    os.rename(build, out)
                fsync_dir(out.parent)
                failed_log(out).unlink(missing_ok=True)
        finally:
            shutil.rmtree(build, ignore_errors=True)
    return manifest | {"status": "built" if previous is None else "rebuilt"}


class Stopped(KeyboardInterrupt):
    """lm-prepare stopped by SIGTERM or SIGHUP: handled as Ctrl-C is (the trainer ended, the
    unfinished build removed), `signum` for the exit status."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def _stopped_by_signals():
    """SIGTERM and SIGHUP (a `kill`, a closed terminal) raise Stopped in the main thread, so
    that the build is cleaned up as on Ctrl-C instead of the process dying mid-build."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        for name in (signal.SIGTERM, signal.SIGHUP):  # once: the clean-up is not cut short
            signal.signal(name, signal.SIG_IGN)
        raise Stopped(signum)

    previous = {name: signal.signal(name, stop) for name in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for name, handler in previous.items():
            signal.signal(name, handler)
