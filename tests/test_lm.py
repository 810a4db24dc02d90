"""Language modelling (docs/paper-facts.md#language-modelling): lm-prepare on a small
WikiText-shaped corpus (cleaning, truncation, manifest, rebuild rules), the data checks, the task's
batches and perplexity, and a few training iterations of the LM recipe end to end through the
CLI."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch
from typer.testing import CliRunner

from perencode.cli import app
from perencode.commands import lm_prepare
from perencode.commands.rehearsal import write_corpus as make_corpus
from perencode.common.errors import UserError
from perencode.config.recipe import TaskConfig
from perencode.kinds import lm_data
from perencode.kinds.lm_data import SPLITS, load
from perencode.kinds.tasks.lm import LanguageModelConfig, LanguageModelTask, model_ids

VOCAB = 96
MAX_TOKENS = 16


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])  # result object: exceptions kept


def one_line_error(result) -> str:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    return lines[0]


def prepare_cli(source: Path, out: Path, max_tokens: int = MAX_TOKENS):
    result = cli("lm-prepare", "--source", source, "--out", out, "--vocab-size", VOCAB,
                 "--max-tokens", max_tokens, "--threads", 1, "--no-progress")
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wikitext")
    return folder, make_corpus(folder)


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / "wikitext103"
    result = prepare_cli(corpus[0], out)
    assert "(built)" in result.output
    return out


def task_config(out: Path, **changes) -> LanguageModelConfig:
    config = TaskConfig.of(name="lm", vocab_size=VOCAB, length=MAX_TOKENS, data=str(out),
                           **changes)
    assert isinstance(config, LanguageModelConfig)
    return config


def test_prepare_cleans_truncates_and_counts(corpus, prepared):
    _, written = corpus
    manifest = json.loads((prepared / "manifest.json").read_text())
    sp = spm.SentencePieceProcessor(model_file=str(prepared / "sentencepiece.model"))
    assert sp.get_piece_size() == VOCAB
    data = load(prepared)
    for split in SPLITS:
        counts = manifest["splits"][split]
        paragraphs = written[split]["paragraphs"]
        assert counts["paragraphs"] == len(paragraphs)
        assert counts["headings"] == written[split]["headings"]
        # The stored sequences are exactly the first max_tokens + 1 pieces of each
        # paragraph of 2 pieces or more: headings and blank lines are gone.
        encoded = sp.encode(paragraphs)
        expected = [ids[:MAX_TOKENS + 1] for ids in encoded if len(ids) >= 2]
        stored = data[split]
        assert [stored.tokens[a:b].tolist() for a, b in zip(stored.offsets, stored.offsets[1:])
                ] == expected
        assert counts["truncated"] == sum(len(ids) > MAX_TOKENS + 1 for ids in encoded)
        assert counts["too_short"] == sum(len(ids) < 2 for ids in encoded)
        assert counts["sequences"] == len(expected)
        assert counts["scored_tokens"] == sum(len(ids) - 1 for ids in expected)
    assert manifest["splits"]["train"]["truncated"] >= 1  # the 80-word paragraph
    assert manifest["splits"]["train"]["too_short"] >= 1  # " . " is one piece
    assert manifest["tokenizer"]["trainer"]["vocab_size"] == VOCAB
    assert manifest["token_dtype"] == "uint16"


def test_manifest_hashes_every_output_file(prepared):
    manifest = json.loads((prepared / "manifest.json").read_text())
    on_disk = {p.name for p in prepared.iterdir()} - {"manifest.json"}
    assert set(manifest["files"]) == on_disk
    for name, record in manifest["files"].items():
        data = (prepared / name).read_bytes()
        assert record == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.mark.slow
def test_rerun_is_a_no_op_and_changes_rebuild(corpus, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(corpus[0], source)
    out = tmp_path / "out"
    prepare_cli(source, out)
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert "(up to date)" in prepare_cli(source, out).output
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps

    assert "(rebuilt)" in prepare_cli(source, out, max_tokens=8).output
    assert json.loads((out / "manifest.json").read_text())["max_tokens"] == 8

    with open(source / "wiki.valid.raw", "a", encoding="utf-8") as f:
        f.write(" ka to ri mu sen . \n")
    assert "(rebuilt)" in prepare_cli(source, out, max_tokens=8).output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["valid"]["paragraphs"] == len(corpus[1]["valid"]["paragraphs"]) + 1

    (out / "test.bin").write_bytes(b"\0\0")  # a damaged output is not trusted
    assert "(rebuilt)" in prepare_cli(source, out, max_tokens=8).output
    load(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "source"]  # no lock left


def test_prepare_errors(tmp_path):
    line = one_line_error(cli("lm-prepare", "--source", tmp_path / "nowhere", "--out",
                              tmp_path / "out"))
    assert "no such folder" in line
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "wiki.train.raw").write_text(" a . \n")
    line = one_line_error(cli("lm-prepare", "--source", tmp_path / "partial", "--out",
                              tmp_path / "out"))
    assert "missing wiki.test.raw, wiki.valid.raw" in line


def test_default_source_without_datasets_says_how_to_pass_files(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` fails
    line = one_line_error(cli("lm-prepare", "--out", tmp_path / "out"))
    assert "pip install 'perencode[hf]'" in line and "--source DIR" in line
    assert not (tmp_path / "out").exists()


def test_data_errors(prepared, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no manifest.json; run `perencode lm-prepare`"):
        load(tmp_path / "empty")
    with pytest.raises(UserError, match="task.vocab_size = 64"):
        load(prepared, vocab_size=64)
    with pytest.raises(UserError, match="task.length = 32"):
        load(prepared, max_tokens=32)
    tampered = tmp_path / "tampered"
    shutil.copytree(prepared, tampered)
    data = bytearray((tampered / "valid.bin").read_bytes())
    data[0] ^= 1
    (tampered / "valid.bin").write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"valid\.bin: contents differ"):
        load(tampered)


def test_vocabulary_layout():
    # SentencePiece <unk>, <s>, </s> = 0, 1, 2 go to the end: torchtext's specials order.
    assert model_ids(8).tolist() == [7, 5, 6, 0, 1, 2, 3, 4]


def test_sample_comes_from_the_generator_alone(prepared):
    task = LanguageModelTask(task_config(prepared), seed=0)
    s = task.shapes
    assert (s.num_classes, s.num_embeddings, s.pad_id) == (VOCAB - 1, VOCAB, VOCAB - 1)
    generator = torch.Generator().manual_seed(5)
    state = generator.get_state()
    batch = task.sample(32, generator)
    generator.set_state(state)
    again = task.sample(32, generator)
    assert torch.equal(batch.sequences, again.sequences)

    B, T = batch.inputs.shape
    assert batch.lengths is not None and batch.output_mask is not None
    assert B == 32 and T == int(batch.lengths.max()) - 1 <= MAX_TOKENS
    assert torch.equal(batch.inputs, batch.sequences[:, :-1])
    assert torch.equal(batch.output_targets, batch.sequences[:, 1:])
    steps = torch.arange(T)[None, :]
    # No <unk> in this corpus: the mask is exactly "inside the paragraph".
    assert torch.equal(batch.output_mask, steps < batch.lengths[:, None] - 1)
    pad_id = task.shapes.pad_id
    assert pad_id is not None
    assert bool((batch.inputs[steps >= batch.lengths[:, None]] == pad_id).all())


def test_uniform_logits_give_a_perplexity_of_the_class_count(prepared):
    task = LanguageModelTask(task_config(prepared), seed=0)
    manifest = json.loads((prepared / "manifest.json").read_text())
    valid = task.splits["valid"]
    covered = np.sort(np.concatenate(list(task.eval_batches(valid, batch_size=3))))
    assert covered.tolist() == list(range(len(valid)))

    result = task.evaluate(lambda batch: torch.zeros(*batch.output_targets.shape,
                                                     task.shapes.num_classes),
                           batch_size=3, per_position=True)
    for split in ("valid", "test"):
        assert result[f"{split}_perplexity"] == pytest.approx(task.shapes.num_classes, rel=1e-6)
        assert result[f"{split}_tokens"] == manifest["splits"][split]["scored_tokens"]
        by_position = result[f"{split}_perplexity_by_position"]
        assert len(by_position) == MAX_TOKENS
        assert all(p is None or p == pytest.approx(task.shapes.num_classes) for p in by_position)
        assert sum(result[f"{split}_tokens_by_position"]) == result[f"{split}_tokens"]


def test_train_and_eval_a_language_model(prepared, tmp_path):
    run = tmp_path / "run"
    result = cli("train", "recipes/lstm_wikitext103_pe.toml", "--run-dir", run, "--device", "cpu",
                 "--no-progress", "--set", f"task.data='{prepared}'",
                 "--set", f"task.vocab_size={VOCAB}", "--set", f"task.length={MAX_TOKENS}",
                 "--set", "model.hidden_size=16", "--set", "model.embed_size=16",
                 "--set", "train.iterations=20", "--set", "train.batch_size=16",
                 "--set", "train.checkpoint_every=20", "--set", "train.log_every=10",
                 "--set", "train.eval_batch_size=8", "--set", "optim.warmup=5")
    assert result.exit_code == 0, result.output
    result = cli("eval", run, "--device", "cpu", "--per-position")
    assert result.exit_code == 0, result.output
    scores = json.loads((run / "eval.json").read_text())
    manifest = json.loads((prepared / "manifest.json").read_text())
    for split in ("valid", "test"):
        assert 1.0 < scores[f"{split}_perplexity"] < float("inf")
        assert math.isfinite(scores[f"{split}_perplexity"])
        assert scores[f"{split}_tokens"] == manifest["splits"][split]["scored_tokens"]
        assert len(scores[f"{split}_perplexity_by_position"]) == MAX_TOKENS


def test_train_without_prepared_data_is_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    # --force: the paper's language model needs more memory than a small CPU box has.
    line = one_line_error(cli("train", "recipes/lstm_wikitext103.toml", "--run-dir",
                              tmp_path / "run", "--device", "cpu", "--no-progress", "--force",
                              "--set", f"task.data='{tmp_path / 'empty'}'"))
    assert "no manifest.json; run `perencode lm-prepare`" in line


@pytest.mark.slow
def test_a_full_disk_keeps_the_previous_build(corpus, tmp_path, monkeypatch):
    out = tmp_path / "out"
    prepare_cli(corpus[0], out)
    manifest = (out / "manifest.json").read_bytes()

    def full(sp, split, folder, *args):
        with open(folder / f"{split}.bin", "wb"):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(lm_prepare, "_encode", full)
    line = one_line_error(cli("lm-prepare", "--source", corpus[0], "--out", out,
                              "--vocab-size", VOCAB, "--max-tokens", 8, "--threads", 1,
                              "--no-progress"))
    assert "cannot write: no space left on device" in line
    assert line.endswith(f"{out} keeps its previous build")
    assert (out / "manifest.json").read_bytes() == manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_waiter_on_a_removed_lock_file_takes_the_paths_new_one(tmp_path):
    """The output's lock (`_locked`): its holder removes `.OUT.lock` before letting go, so a
    second lm-prepare blocked on it then holds the lock of a file no longer on the path; it
    tries again and holds the path's new file, which a third would wait on."""
    out = tmp_path / "wikitext103"
    lock = tmp_path / ".wikitext103.lock"
    held: list[bool] = []

    def second() -> None:
        with lm_prepare._locked(out):
            held.append(lock.exists())

    with lm_prepare._locked(out):
        waiter = threading.Thread(target=second)
        waiter.start()
        time.sleep(0.5)  # blocked on the first's lock
        assert waiter.is_alive() and held == []
    waiter.join(30)
    assert held == [True] and not lock.exists()



def test_a_prepared_folder_whose_manifest_or_files_are_not_lm_prepares_is_one_line(tmp_path):
    """The manifest of a prepared folder: missing, not JSON, another tool's, another format
    version; a file it lists missing or changed. Each is a UserError naming the path and
    the way out, never a KeyError from deeper in."""
    def refusal(folder: Path) -> str:
        with pytest.raises(UserError) as raised:
            lm_data.check_files(folder, lm_data.read_manifest(folder))
        return str(raised.value)

    manifest = tmp_path / "manifest.json"
    assert refusal(tmp_path) == f"{tmp_path}: no manifest.json; run `perencode lm-prepare`"
    manifest.write_bytes(b"\xff{")
    assert refusal(tmp_path) == f"{manifest}: not readable JSON; run `perencode lm-prepare` again"
    manifest.write_text("[1, 2]")
    assert refusal(tmp_path) == f"{manifest}: not a manifest of `perencode lm-prepare`"
    manifest.write_text(json.dumps({"format": "perencode-lm-data", "format_version": 9}))
    assert refusal(tmp_path) == (f"{manifest}: format version 9, this perencode reads 1; run "
                                 "`perencode lm-prepare` again")
    (tmp_path / "train.bin").write_bytes(b"1234")
    (tmp_path / "valid.bin").write_bytes(b"")
    listed = {name: lm_data.file_record(tmp_path / name) for name in ("train.bin", "valid.bin")}
    manifest.write_text(json.dumps({"format": "perencode-lm-data", "format_version": 1,
                                    "files": listed}))
    (tmp_path / "valid.bin").unlink()
    assert refusal(tmp_path) == (f"{tmp_path / 'valid.bin'}: missing (listed in manifest.json);"
                                 " run `perencode lm-prepare` again")
    (tmp_path / "valid.bin").write_bytes(b"")
    lm_data.check_files(tmp_path, lm_data.read_manifest(tmp_path))  # as listed: no error
    (tmp_path / "train.bin").write_bytes(b"1235")  # same size, other bytes
    assert refusal(tmp_path) == (f"{tmp_path / 'train.bin'}: contents differ from its SHA-256 in "
                                 "manifest.json (changed or corrupted); run `perencode "
                                 "lm-prepare` again")
