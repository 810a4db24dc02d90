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
options finds the manifest's fingerprint unchanged and does nothing.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import itertools
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from perencode.console import console
from perencode.errors import UserError
from perencode.io import disk_errors, fsync_dir
from perencode.lm.data import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    SPLITS,
    check_files,
    file_record,
    token_dtype,
)
from perencode.progress import Reporter

RAW_FILES = {split: f"wiki.{split}.raw" for split in SPLITS}
HUB_DATASET = "wikitext"
HUB_CONFIG = "wikitext-103-raw-v1"
DATASET_SPLITS = {"train": ("train",), "valid": ("validation", "valid"), "test": ("test",)}
NEEDS_SOURCE = ("pass --source DIR: a folder with wiki.train.raw, wiki.valid.raw and "
                "wiki.test.raw (unzipped wikitext-103-raw-v1.zip) or a `datasets` dataset "
                "saved with save_to_disk")
ENCODE_CHUNK = 8192  # paragraphs per multi-threaded SentencePiece call


def trainer_options(vocab_size: int) -> dict:
    """SentencePiece trainer options: torchtext's call (unigram, vocabulary size) with the
    library defaults it relied on written out, so the manifest records them and another
    library default cannot change the tokenizer unnoticed.

    num_threads is among them because the unigram EM sums per-thread statistics: another
    thread count gives slightly different scores and pieces. 16 is SentencePiece's default,
    so it is what the authors ran; `--threads` sets the encoding threads only.
    """
    return {"model_type": "unigram", "vocab_size": vocab_size, "character_coverage": 0.9995,
            "max_sentence_length": 4192, "input_sentence_size": 0, "num_threads": 16,
            "unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1}


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
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield line.rstrip("\n")


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
        config = source or HUB_CONFIG
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
                        f"save_to_disk, or a wikitext configuration such as {HUB_CONFIG}")
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


@contextmanager
def _stderr_to(path: Path):
    """Point file descriptor 2, where SentencePiece's C++ trainer logs, at `path` meanwhile
    (its own `logstream` needs a `sys.stderr` with a file number, which notebooks and test
    runners lack)."""
    saved = os.dup(2)
    try:
        with open(path, "w", encoding="utf-8") as log:
            os.dup2(log.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _train_tokenizer(train_text: Path, folder: Path, vocab_size: int):
    """Train the unigram model on the training paragraphs; write .model, .vocab and .log."""
    import sentencepiece as spm

    model = io.BytesIO()  # model_writer keeps build paths out of the model's trainer spec
    try:
        with _stderr_to(folder / "sentencepiece.log"):
            spm.SentencePieceTrainer.train(sentence_iterator=_paragraphs(train_text),
                                           model_writer=model, **trainer_options(vocab_size))
    except RuntimeError as exc:
        raise UserError(f"SentencePiece training failed: {str(exc).splitlines()[0]}") from None
    (folder / "sentencepiece.model").write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    with open(folder / "sentencepiece.vocab", "w", encoding="utf-8", newline="\n") as f:
        for i in range(sp.get_piece_size()):  # the layout SentencePiece's own .vocab has
            f.write(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n")
    return sp


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
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths or [[]]))]).astype(np.int64)
    with open(folder / f"{split}.idx", "wb") as f:
        offsets.tofile(f)
        f.flush()
        os.fsync(f.fileno())
    return counts


def _build(src: Source, folder: Path, vocab_size: int, max_tokens: int, threads: int,
           fingerprint: str, progress: bool) -> dict:
    import sentencepiece as spm

    seconds = {}
    t0 = time.perf_counter()
    splits = {split: _clean(src.read(split), folder / f"{split}.txt") for split in SPLITS}
    seconds["clean"] = time.perf_counter() - t0

    if progress:
        console.print(f"training SentencePiece unigram ({vocab_size} pieces) on "
                      f"{splits['train']['paragraphs']:,} paragraphs", highlight=False)
    t0 = time.perf_counter()
    sp = _train_tokenizer(folder / "train.txt", folder, vocab_size)
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
                      "log": "sentencepiece.log", "trainer": trainer_options(vocab_size),
                      "sentencepiece_version": spm.__version__},
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

@contextmanager
def _locked(out: Path):
    """One lm-prepare per output folder at a time (so leftovers can be removed safely)."""
    with open(out.parent / f".{out.name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


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


def prepare(source: str | None = None, out: str | Path = "data/wikitext103",
            vocab_size: int = 32768, max_tokens: int = 1024, threads: int = 0,
            progress: bool = True) -> dict:
    """Build `out` from WikiText-103 (or confirm it is up to date); returns its manifest
    plus `status`: "built", "rebuilt" or "up to date".

    threads: encoding threads (0: all cores); it does not change the output.
    """
    import sentencepiece as spm

    out = Path(out)
    threads = threads or os.cpu_count() or 1
    src = open_source(source)
    options = {"vocab_size": vocab_size, "max_tokens": max_tokens,
               "trainer": trainer_options(vocab_size), "sentencepiece": spm.__version__,
               "format_version": FORMAT_VERSION}
    fingerprint = hashlib.sha256(json.dumps({"source": src.identity, "options": options},
                                            sort_keys=True).encode()).hexdigest()
    out.parent.mkdir(parents=True, exist_ok=True)
    with _locked(out):
        for leftover in out.parent.iterdir():  # a crashed build's folders: never trusted
            if leftover.name.startswith((f".{out.name}.build-", f".{out.name}.old-")):
                shutil.rmtree(leftover, ignore_errors=True)
        previous = _previous_manifest(out)
        if previous is not None and previous.get("fingerprint") == fingerprint:
            try:
                check_files(out, previous)
                return previous | {"status": "up to date"}
            except UserError:
                pass  # an output file changed: build again
        build = Path(tempfile.mkdtemp(prefix=f".{out.name}.build-", dir=out.parent))
        umask = os.umask(0)
        os.umask(umask)
        build.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide the data from other users
        kept = (f"{out} keeps its previous build" if out.exists()
                else f"{out} was not created")
        try:
            with disk_errors(build, kept):
                manifest = _build(src, build, vocab_size, max_tokens, threads, fingerprint,
                                  progress)
                if out.exists():
                    old = build.with_name(build.name.replace(".build-", ".old-"))
                    os.rename(out, old)
                    os.rename(build, out)
                    shutil.rmtree(old)
                else:
                    os.rename(build, out)
                fsync_dir(out.parent)
        finally:
            shutil.rmtree(build, ignore_errors=True)
    return manifest | {"status": "built" if previous is None else "rebuilt"}

