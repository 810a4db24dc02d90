"""The paths crosscheck round 3 reaches: dense sampling, the dual-frequency bands, scoring
through Session.evaluate, trained encodings, the S4D loop, the chunked loss, resuming, the
perplexity formula. For each, the unchanged package agrees and one planted fault (the
package's function monkeypatched, as a reimplementer's slip would change it) disagrees."""

import pytest
import torch
from test_crosscheck import AUTHORS, by_name, needs_authors, needs_timm

from perencode.commands.crosscheck import authors as au
from perencode.commands.crosscheck import loop, models, tasks
from perencode.commands.crosscheck.report import AGREE, DISAGREE
from perencode.training import session


@pytest.fixture(scope="module")
def authors():
    with au.authors_code(au.locate(AUTHORS)) as a:
        yield a


@pytest.mark.slow
@pytest.mark.compat
@needs_authors
def test_dense_sampling_agrees_and_a_uniform_list_disagrees(authors, monkeypatch):
    from perencode.kinds.tasks.base import SyntheticTask
    from perencode.kinds.tasks.dual_frequency import DualFrequencyTask
    checks = by_name(tasks.check_dual_frequency(authors))
    assert checks["dual_frequency: dense sampling"].verdict == AGREE
    assert "from the list of rows left: True" in checks["dual_frequency: dense sampling"].compared
    assert by_name(tasks.check_fixed_length(authors))["reverse: dense sampling"].verdict == AGREE
    # The rows left drawn uniformly, not by their chance under `draw`: rare rows too often.
    monkeypatch.setattr(DualFrequencyTask, "chance", SyntheticTask.chance)
    checks = by_name(tasks.check_dual_frequency(authors))
    assert checks["dual_frequency: dense sampling"].verdict == DISAGREE
    assert checks["dual_frequency: sampling"].verdict == AGREE  # the sparse path is unchanged


@pytest.mark.slow
@pytest.mark.compat
@needs_authors
def test_bands_agree_and_bands_one_position_off_disagree(authors, monkeypatch):
    from perencode.kinds.tasks.dual_frequency import DualFrequencyTask
    assert by_name(tasks.check_dual_frequency(authors))["dual_frequency: by band"].verdict == AGREE
    score = DualFrequencyTask.score

    def shifted(self, batches, predictions):  # bands of 0-based positions 1..L
        out = score(self, batches, predictions)
        for band in out["by_band"]:
            cells = [r for r in out["by_condition"] if r["target"] == band["target"]
                     and r["disturbants"] == band["disturbants"]
                     and band["first"] <= r["position"] + 1 <= band["last"]]
            band["accuracy"] = sum(r["accuracy"] for r in cells) / len(cells)
        return out

    monkeypatch.setattr(DualFrequencyTask, "score", shifted)
    checks = by_name(tasks.check_dual_frequency(authors))
    assert checks["dual_frequency: by band"].verdict == DISAGREE
    assert checks["dual_frequency: scoring"].verdict == AGREE


@needs_authors
def test_scoring_goes_through_session_evaluate(authors, monkeypatch):
    """Session.evaluate reading the outputs one step early: the targets no longer agree."""
    def early(model, batch):
        h = model(batch.inputs)  # [B, T, K]
        T_out = batch.output_targets.shape[1]
        return model.head(h[:, -T_out - 1:-1])

    monkeypatch.setattr(session, "output_logits", early)
    checks = by_name(tasks.check_fixed_length(authors))
    assert checks["reverse: targets"].verdict == DISAGREE
    assert checks["reverse: scoring"].verdict == DISAGREE
    assert checks["reverse: sampling"].verdict == AGREE


def _after_encoding_init(monkeypatch, change):
    from perencode.kinds.encoding import PositionalEncoding
    init = PositionalEncoding.__init__

    def changed(self, cfg, dim, steps):
        init(self, cfg, dim, steps)
        change(self)

    monkeypatch.setattr(PositionalEncoding, "__init__", changed)


@pytest.mark.slow
@pytest.mark.compat
@needs_timm
@needs_authors
def test_trained_encodings_agree_and_a_frozen_or_detached_one_disagrees(authors, monkeypatch):
    cases = [("gru", "none"), ("gru", "learnable"), ("gru", "duplicate")]
    assert {c.verdict for c in models.check_trajectory(authors, steps=3, cases=cases)} == {AGREE}

    def frozen(enc):  # the learnable table left out of training
        if enc.kind == "learnable":
            enc.table.requires_grad_(False)

    _after_encoding_init(monkeypatch, frozen)
    checks = by_name(models.check_trajectory(authors, steps=3, cases=cases))
    assert checks["Adam trajectory: gru learnable"].verdict == DISAGREE
    assert "ours only [], theirs only ['time_encoder.embeddings']" in \
        checks["Adam trajectory: gru learnable"].reason
    assert checks["Adam trajectory: gru none"].verdict == AGREE
    monkeypatch.undo()

    def detached(enc):  # the duplicate copy passes no gradient to the embedding
        if enc.kind == "duplicate":
            enc.vectors = lambda x: x.detach()

    _after_encoding_init(monkeypatch, detached)
    checks = by_name(models.check_trajectory(authors, steps=3, cases=cases))
    assert checks["Adam trajectory: gru duplicate"].verdict == DISAGREE
    assert checks["Adam trajectory: gru learnable"].verdict == AGREE


@pytest.mark.slow
@pytest.mark.compat
@needs_timm
@needs_authors
def test_s4d_loop_agrees_and_untrained_poles_disagree(authors, monkeypatch):
    check = loop.compare(authors, "s4d")
    assert check.verdict == AGREE, check.reason
    assert "clipping fired on" in check.compared
    original = session.make_optimizer

    def without_poles(model, optim):  # S4D's A left fixed, as some reimplementations do
        keep = [p for n, p in model.named_parameters() if n not in ("s4d.log_A_real",
                                                                    "s4d.A_imag")]
        holder = torch.nn.ParameterList(keep)
        return original(holder, optim)

    monkeypatch.setattr(session, "make_optimizer", without_poles)
    assert loop.compare(authors, "s4d").verdict == DISAGREE
    (trajectory,) = models.check_trajectory(authors, steps=3, cases=[("s4d", "none")])
    assert trajectory.verdict == DISAGREE and "kernel.log_A_real" in trajectory.reason


@needs_timm
@needs_authors
def test_chunked_loss_agrees_and_a_mean_of_chunk_means_disagrees(authors, monkeypatch):
    from perencode.commands.crosscheck import loss
    assert {c.verdict for c in loss.check_chunked_loss(authors)} == {AGREE}
    original = session.loss_fn

    def chunk_means(model, batch, count_hits=False, chunk_logits=session.CHUNK_LOGITS):
        """The chunked path averaging each chunk's mean: wrong when the last is shorter."""
        if chunk_logits >= session.CHUNK_LOGITS:
            return original(model, batch, count_hits, chunk_logits)
        h = session.output_features(model, batch)
        target = batch.output_targets
        if batch.output_mask is not None:
            h, target = h[batch.output_mask], target[batch.output_mask]
        else:
            h, target = h.reshape(-1, h.shape[-1]), target.reshape(-1)
        rows = max(1, chunk_logits // model.head.out_features)
        means = [torch.nn.functional.cross_entropy(model.head(h[s:s + rows]), target[s:s + rows])
                 for s in range(0, len(target), rows)]
        hits = (model.head(h).argmax(-1) == target).sum() if count_hits else None
        return torch.stack(means).mean(), hits

    monkeypatch.setattr(session, "loss_fn", chunk_means)
    assert [c.verdict for c in loss.check_chunked_loss(authors)] == [DISAGREE, DISAGREE]


@pytest.mark.slow
@pytest.mark.compat
@needs_timm
@needs_authors
def test_resume_agrees_and_a_resume_without_adam_state_disagrees(authors, monkeypatch):
    from perencode.commands.crosscheck import resume
    (check,) = resume.check_resume(authors)
    assert check.verdict == AGREE, check.reason
    assert "warmup_lr_init (0, not 0.007)" in check.difference
    load = session.Session.load

    def forgetful(self, path, state):  # the weights and the stream, not Adam's moments
        load(self, path, state)
        self.optimizer = session.make_optimizer(self.model, self.recipe.optim)

    monkeypatch.setattr(session.Session, "load", forgetful)
    (check,) = resume.check_resume(authors)
    assert check.verdict == DISAGREE and "ours resumed vs uninterrupted" in check.reason


@needs_authors
def test_initialisation_tells_a_trained_table_from_a_buffer(authors, monkeypatch):
    from perencode.commands.crosscheck import initial_weights
    checks = by_name(initial_weights.check_init(authors))
    assert checks["initialisation: gru random"].verdict == AGREE
    assert "trainable parameters by name" in checks["initialisation: gru random"].compared

    def trained_random(enc):  # the random table a parameter: same values, but it trains
        if enc.kind == "random":
            table = enc.table
            del enc.table
            enc.table = torch.nn.Parameter(table)

    _after_encoding_init(monkeypatch, trained_random)
    checks = by_name(initial_weights.check_init(authors))
    assert checks["initialisation: gru random"].verdict == DISAGREE
    assert "ours only ['time_encoder.embeddings']" in checks["initialisation: gru random"].reason
    assert checks["initialisation: gru learnable"].verdict == AGREE


# -- round 4: the structure of what is compared (one planted fault per area) -------------


@pytest.mark.slow
@pytest.mark.compat
@needs_authors
def test_rows_structure_agrees_and_a_coin_per_row_disagrees(authors, monkeypatch):
    from perencode.kinds.tasks.dual_frequency import DualFrequencyTask, half_tokens
    checks = by_name(tasks.check_dual_frequency(authors))
    assert checks["dual_frequency: rows' structure"].verdict == AGREE

    def coin_per_row(self, n, generator):  # a whole row RARE with chance rarity
        rare = torch.rand((n, 1), generator=generator) < self.cfg.rarity
        return half_tokens(rare.expand(n, self.L), self.K, generator)

    monkeypatch.setattr(DualFrequencyTask, "draw", coin_per_row)
    checks = by_name(tasks.check_dual_frequency(authors))
    assert checks["dual_frequency: rows' structure"].verdict == DISAGREE
    assert "RARE tokens per row" in checks["dual_frequency: rows' structure"].compared
    assert checks["dual_frequency: sampling"].verdict == AGREE  # the marginals are the same


def _bands_from_positions(monkeypatch, band_of):
    """DualFrequencyTask.score with its bands made by `band_of(position, L)` (0..3), each
    band's span read off its own members, as a reimplementation would report them."""
    from perencode.kinds.tasks.dual_frequency import DualFrequencyTask
    score = DualFrequencyTask.score

    def banded(self, batches, predictions):
        out = score(self, batches, predictions)
        bands: list[dict] = []
        for row in out["by_band"]:
            if any(b["target"] == row["target"] and b["disturbants"] == row["disturbants"]
                   for b in bands):
                continue
            cells = [r for r in out["by_condition"] if r["target"] == row["target"]
                     and r["disturbants"] == row["disturbants"]]
            for q in range(4):
                members = [r for r in cells if band_of(r["position"], self.L) == q]
                if members:
                    first, last = members[0]["position"], members[-1]["position"]
                    acc = sum(r["accuracy"] * r["n"] for r in members) / sum(
                        r["n"] for r in members)
                    bands.append({"target": row["target"], "disturbants": row["disturbants"],
                                  "band": f"{first}-{last}", "first": first, "last": last,
                                  "accuracy": acc, "n": sum(r["n"] for r in members)})
        out["by_band"] = bands
        return out

    monkeypatch.setattr(DualFrequencyTask, "score", banded)


@pytest.mark.slow
@pytest.mark.compat
@needs_authors
def test_band_membership_agrees_and_a_boundary_one_position_off_disagrees(authors, monkeypatch):
    _bands_from_positions(monkeypatch, lambda p, L: (p - 1) * 4 // L)  # the package's rule
    checks = by_name(tasks.check_dual_frequency(authors))
    assert checks["dual_frequency: band membership"].verdict == AGREE
    assert checks["dual_frequency: by band"].verdict == AGREE
    monkeypatch.undo()
    _bands_from_positions(monkeypatch, lambda p, L: p * 4 // L)  # 1-based p as if 0-based
    checks = by_name(tasks.check_dual_frequency(authors))
    assert checks["dual_frequency: band membership"].verdict == DISAGREE
    assert "in the caption's 1-2" in checks["dual_frequency: band membership"].reason
    assert checks["dual_frequency: by band"].verdict == DISAGREE
    assert checks["dual_frequency: scoring"].verdict == AGREE  # the positions are right


@needs_authors
def test_training_stream_agrees_and_a_repeated_batch_disagrees(authors, monkeypatch):
    from perencode.commands.crosscheck import seeds
    (check,) = seeds.check_stream(authors)
    assert check.verdict == AGREE, check.reason
    assert "distinct 8/8" in check.compared
    batch = session.Session.batch

    def first_again(self):  # the first batch drawn, then trained on at every iteration
        if not hasattr(self, "_first"):
            self._first = batch(self)
        return self._first

    monkeypatch.setattr(session.Session, "batch", first_again)
    (check,) = seeds.check_stream(authors)
    assert check.verdict == DISAGREE
    assert "distinct batches: ours 1, theirs 8" in check.reason


def _forward(authors, names):
    return {c.name: c for c in models.check_forward(authors) if c.name in names}


@needs_authors
def test_models_with_embed_apart_from_hidden_agree_and_swapped_sizes_disagree(authors,
                                                                            monkeypatch):
    from perencode.kinds.models import rnn, s4d
    names = {"forward: gru sinusoidal E!=H", "forward: lstm sinusoidal E!=H",
             "forward: s4d sinusoidal E!=H", "forward: gru sinusoidal"}
    assert {c.verdict for c in _forward(authors, names).values()} == {AGREE}
    rnn_init, s4d_init = rnn.RecurrentModel.__init__, s4d.S4DModel.__init__

    def rnn_swapped(self, arch, shapes, embed_size, hidden_size, encoding):
        rnn_init(self, arch, shapes, hidden_size, embed_size, encoding)

    def s4d_swapped(self, shapes, embed_size, hidden_size, d_state, encoding):
        s4d_init(self, shapes, hidden_size, embed_size, d_state, encoding)

    monkeypatch.setattr(rnn.RecurrentModel, "__init__", rnn_swapped)
    monkeypatch.setattr(s4d.S4DModel, "__init__", s4d_swapped)
    checks = _forward(authors, names)
    for name in names - {"forward: gru sinusoidal"}:
        assert checks[name].verdict == DISAGREE, name
    assert checks["forward: gru sinusoidal"].verdict == AGREE  # E = H cannot tell


@needs_authors
def test_add_mode_agrees_and_a_scaled_encoding_disagrees(authors, monkeypatch):
    from perencode.kinds import encoding
    names = {"forward: gru sinusoidal add E!=H", "forward: gru random add E!=H",
             "forward: gru learnable add E!=H", "forward: s4d sinusoidal add E!=H",
             "forward: gru sinusoidal E!=H"}
    assert {c.verdict for c in _forward(authors, names).values()} == {AGREE}

    def scaled(x, v):  # x + sqrt(E) v, as some transformer code adds its encoding
        return x + v * x.shape[-1] ** 0.5

    monkeypatch.setitem(encoding.JOINS, "add", encoding.Join(scaled, 1))
    checks = _forward(authors, names)
    for name in names - {"forward: gru sinusoidal E!=H"}:
        assert checks[name].verdict == DISAGREE, name
    assert checks["forward: gru sinusoidal E!=H"].verdict == AGREE  # concat is unchanged


@needs_authors
def test_predecessor_scored_through_session_evaluate_and_a_wrong_target_disagrees(
        authors, monkeypatch):
    from perencode.kinds.tasks.predecessor import PredecessorTask
    checks = by_name(tasks.check_predecessor(authors))
    assert checks["predecessor: targets"].verdict == AGREE
    assert checks["predecessor: scoring"].verdict == AGREE

    def queried_token(self, batches, predictions):  # scored against x_q, not x_{q-1}
        hits = torch.cat([(p.squeeze(1) == b.sequences.gather(1, b.queries[:, None])
                           .squeeze(1)).cpu() for b, p in zip(batches, predictions)])
        accuracy = float(hits.double().mean())
        return {"accuracy": accuracy, "token_accuracy": accuracy, "n_sequences": len(hits)}

    monkeypatch.setattr(PredecessorTask, "score", queried_token)
    checks = by_name(tasks.check_predecessor(authors))
    assert checks["predecessor: targets"].verdict == DISAGREE
    assert checks["predecessor: sampling"].verdict == AGREE


@pytest.mark.slow
@pytest.mark.compat
@needs_authors
def test_lm_preparation_with_a_looser_heading_rule_disagrees(authors, monkeypatch):
    """lm-prepare in this process (the check runs the CLI; the agreement is
    test_crosscheck's group test), with headings taken as any line whose first non-blank
    character is '=': the near misses their rule keeps are dropped."""
    from perencode.commands import lm_prepare
    from perencode.commands.crosscheck import lm

    def in_process(source, out):
        lm_prepare.prepare(str(source), out, vocab_size=lm.PREP_VOCAB,
                           max_tokens=lm.PREP_MAX_TOKENS, threads=1, progress=False)

    monkeypatch.setattr(lm_prepare, "is_paragraph",
                        lambda line: line.strip() != "" and not line.lstrip().startswith("="))
    (check,) = lm.check_preparation(authors, prepare=in_process)
    assert check.verdict == DISAGREE
    assert "train: 243 paragraphs ours, 249 theirs" in check.reason, check.reason
