"""WikiText-103 next-token prediction (Appendix E, Table 1; docs/paper-facts.md#language-modelling).

Vocabulary layout, as the authors' torchtext vocab built it (`vocab(..., specials=['<s>',
'</s>', '<unk>'], special_first=False)` over the SentencePiece .vocab file): the
SentencePiece pieces 3..V-1 become model ids 0..V-4, then `<s>` = V-3, `</s>` = V-2 and
`<unk>` = V-1. `task.vocab_size` is the SentencePiece vocabulary V (32,768, the paper's
number); the head has K = V - 1 = 32,767 classes (`<s>` and `</s>` among them, never a
target); embedding row K is `<unk>`, which doubles as the padding id and is masked out of
the loss and the perplexity. No BOS/EOS is added: a paragraph's first token is never
predicted. Every row starts at time step 0, so the positional encoding is aligned with the
paragraph's start.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, field_validator, model_validator
from torch import Tensor

from perencode.config.recipe import TaskConfig
from perencode.config.registry import TaskKind, register_task
from perencode.kinds.lm_data import MANIFEST, Split, load, sha256_file
from perencode.kinds.tasks.base import Batch, Shapes


def model_ids(vocab_size: int) -> np.ndarray:
    """Lookup table SentencePiece id -> model id [V] (ids 0, 1, 2 = <unk>, <s>, </s>)."""
    table = np.arange(vocab_size, dtype=np.int64) - 3
    table[:3] = [vocab_size - 1, vocab_size - 3, vocab_size - 2]
    return table


def shapes(cfg: LanguageModelConfig) -> Shapes:
    """LanguageModelTask's sizes without reading the data (which a dry run may not have):
    V embedding rows (K = V - 1 tokens, then <unk>, which is also padding), K classes, and
    inputs of at most `length` tokens (tokens[:-1] of at most length + 1 kept)."""
    V = cfg.vocab_size
    return Shapes(num_embeddings=V, num_classes=V - 1, steps=cfg.length, outputs=cfg.length,
                  pad_id=V - 1)


class LanguageModelTask:
    """Paragraphs of a folder made by `perencode lm-prepare`; scored on valid and test.

    Training batches draw paragraphs uniformly with replacement from the generator, padded
    to the longest one as the authors' ToTensor did. The authors streamed epochs through a
    10,000-line shuffle buffer (torch's DataLoader adds one to their line reader when
    shuffle=True); drawing from the generator alone keeps a resumed run bit-identical, and
    over 300,000 x 512 draws (over 100 passes through the training paragraphs) the two
    differ mainly in how evenly paragraphs recur.
    """

    def __init__(self, cfg: LanguageModelConfig, seed: int, device: torch.device | str = "cpu"):
        # `seed` is part of the task interface; nothing is drawn before training here:
        # the valid and test splits are fixed.
        self.cfg = cfg
        self.device = torch.device(device)
        assert cfg.data is not None  # LanguageModelConfig requires it
        self.splits = load(cfg.data, vocab_size=cfg.vocab_size, max_tokens=cfg.length)
        self.shapes = shapes(cfg)
        self._model_ids = model_ids(cfg.vocab_size)

    def rows(self, split: Split, index: np.ndarray, device: torch.device) -> Batch:
        """The batch of paragraphs `index` of `split`, padded to the longest with <unk>."""
        starts = split.offsets[index]  # [B]
        lengths = split.offsets[index + 1] - starts  # [B], each >= 2
        steps = np.arange(lengths.max())
        inside = steps[None, :] < lengths[:, None]  # [B, T+1]
        pieces = split.tokens[np.where(inside, starts[:, None] + steps, 0)]  # [B, T+1]
        pad = self.shapes.pad_id
        assert pad is not None  # `shapes` pads with id K
        tokens = np.where(inside, self._model_ids[pieces], pad)
        sequences = torch.from_numpy(tokens).to(device)  # [B, T+1]
        inputs, targets = sequences[:, :-1], sequences[:, 1:]  # [B, T] each
        # Padding and <unk> inside a paragraph are both id K: neither is scored
        # (docs/paper-facts.md#language-modelling).
        return Batch(sequences=sequences, inputs=inputs, targets=targets,
                     output_targets=targets, output_mask=targets != pad,
                     lengths=torch.from_numpy(lengths).to(device))

    def sample(self, batch_size: int, generator: torch.Generator) -> Batch:
        """A training batch on the generator's device: paragraphs drawn with replacement."""
        train = self.splits["train"]
        index = torch.randint(len(train), (batch_size,), generator=generator,
                              device=generator.device)
        return self.rows(train, index.cpu().numpy(), generator.device)

    def eval_batches(self, split: Split, batch_size: int) -> Iterator[np.ndarray]:
        """Paragraph indices longest first, at most batch_size x length input tokens a
        batch: little padding, and the memory of one batch of the longest paragraphs."""
        lengths = split.lengths()
        order = np.argsort(-lengths, kind="stable")
        budget = batch_size * self.shapes.steps
        start = 0
        while start < len(order):
            rows = max(1, budget // int(lengths[order[start]] - 1))
            yield order[start:start + rows]
            start += rows

    def evaluate(self, logits_fn: Callable[[Batch], Tensor], batch_size: int,
                 per_position: bool = False) -> dict:
        """Perplexity = exp(mean cross-entropy over the non-<unk> targets) on the valid and
        test splits (the authors' script scored valid; Table 1 says test;
        docs/paper-facts.md#language-modelling).

        per_position: also the perplexity at each target position (1 = the paragraph's
        second token, as the authors' test_lm.py CSV) and its token count.
        """
        result: dict[str, Any] = {}
        for name in ("valid", "test"):
            split = self.splits[name]
            loss = torch.zeros(self.shapes.steps, dtype=torch.float64, device=self.device)
            count = torch.zeros(self.shapes.steps, dtype=torch.long, device=self.device)
            for index in self.eval_batches(split, batch_size):
                batch = self.rows(split, index, self.device)
                logits = logits_fn(batch)  # [B, T, K]
                mask = batch.output_mask
                assert mask is not None  # `rows` masks padding and <unk>
                target = batch.output_targets.masked_fill(~mask, 0)  # [B, T]
                ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                                     reduction="none").view_as(target)  # [B, T]
                T = target.shape[1]
                loss[:T] += ce.masked_fill(~mask, 0.0).sum(0).double()
                count[:T] += mask.sum(0)
            mean = float(loss.sum() / count.sum())
            result[f"{name}_perplexity"] = math.exp(mean)
            result[f"{name}_cross_entropy"] = mean
            result[f"{name}_tokens"] = int(count.sum())
            result[f"{name}_paragraphs"] = len(split)
            if per_position:
                losses, counts = loss.cpu().tolist(), count.cpu().tolist()
                result[f"{name}_perplexity_by_position"] = [
                    math.exp(s / c) if c else None for s, c in zip(losses, counts)]
                result[f"{name}_tokens_by_position"] = counts
        return result


class LanguageModelConfig(TaskConfig):
    """[task] of lm: the prepared data; its test sets are the corpus's valid and test."""

    data: str | None = Field(
        None, description="Prepared data folder (made by `perencode lm-prepare`); a "
        "relative one is resolved against the working directory when the recipe is read, "
        "and a run keeps the absolute path.")

    @field_validator("data")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        # Resolved once, where the recipe is first read (a run stores it absolute): an
        # `eval` from another folder reads the run's data, not a ./lmdata there.
        return os.path.abspath(os.path.expanduser(value)) if value else value

    @model_validator(mode="after")
    def _has_data(self) -> LanguageModelConfig:
        if self.data is None:
            raise ValueError("field 'data': task.name = 'lm' needs task.data (a folder made "
                             "by `perencode lm-prepare`)")
        return self


# What training reads of a prepared folder (perencode.kinds.lm_data.load): the token files and
# the tokenizer model. The manifest's other entries (its creation time, the build's stage
# timings, the SentencePiece log) change at every rebuild of the same data.
READ_FILES = (".bin", ".idx", ".model")
READ_FIELDS = ("format_version", "vocab_size", "max_tokens", "token_dtype")


def data_identity(cfg: LanguageModelConfig) -> dict:
    """The data a run reads (perencode.store.identity): its folder, its manifest's SHA-256, and
    the SHA-256 of its content (`content_sha256`: the files training reads, by the hashes
    their manifest lists, which loading checks against the files, and the sizes they were
    prepared with), so that a byte-identical rebuild is the same data."""
    assert cfg.data is not None  # LanguageModelConfig requires it
    manifest = Path(cfg.data) / MANIFEST
    content = None
    if manifest.is_file():
        try:
            listed = json.loads(manifest.read_text(encoding="utf-8"))
            read = {name: entry["sha256"] for name, entry in listed["files"].items()
                    if name.endswith(READ_FILES)}
            whole = {"files": read, **{key: listed.get(key) for key in READ_FIELDS}}
            content = hashlib.sha256(json.dumps(whole, sort_keys=True).encode()).hexdigest()
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            content = None  # a damaged manifest: loading the data says what is wrong
    return {"field": "data", "path": cfg.data,
            "manifest_sha256": sha256_file(manifest) if manifest.is_file() else None,
            "content_sha256": content}


def results(row: dict, metrics: list[dict], tables: dict) -> None:
    """A run's training perplexity (exp of its last logged loss) and its training curve
    with the perplexity at each logged step (Fig. 15; other tasks' curves stay in their
    runs)."""
    if "train_loss" in row:
        row["train_perplexity"] = math.exp(row["train_loss"])
    if metrics:
        perplexity = np.exp([m["loss"] for m in metrics])
        tables["curves"] = [{"step": m["step"], "loss": m["loss"], "accuracy": m["accuracy"],
                             "train_perplexity": p} for m, p in zip(metrics, perplexity)]


register_task(TaskKind("lm", LanguageModelTask, label="Language model",
                       summary="WikiText-103 language modelling (Table 1, Fig. 15)",
                       config=LanguageModelConfig, shapes=shapes, results=results,
                       data=data_identity))
