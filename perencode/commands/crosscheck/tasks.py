"""The synthetic tasks: sampling statistics, held-out sets, targets and their scoring, ours
against the authors' datasets (data/dataset.py) and their Learners' `test` methods.

Scoring is compared by handing their `test` a stand-in network (`Oracle`) that reads the
inputs their code builds and answers with predictions we choose: our targets (their score
must be perfect: the targets and the input layout agree), then our targets with
substitutions and adjacent swaps (their token/sequence accuracy and Damerau-Levenshtein
distance must equal ours on the same predictions). Our side scores the same answers the way
`perencode eval` does: perencode.training.session.Session.evaluate around a model (`OracleModel`)
whose logits are the oracle's, so the output steps it reads, the argmax and task.evaluate
are all on the path compared.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor

from perencode.commands.crosscheck.authors import Authors
from perencode.commands.crosscheck.report import Comparison, numeric
from perencode.config.recipe import Recipe, TaskConfig
from perencode.kinds.models import SequenceModel
from perencode.kinds.tasks import make
from perencode.kinds.tasks.dual_frequency import DualFrequencyConfig
from perencode.training.session import Session

SCORE_TOL = {"fp32": 1e-6, "fp64": 1e-6}  # their accuracies are fp32 means
Z_TOL = {"fp32": 5.0, "fp64": 5.0}
DRAWS = 2000
SEED = 1  # every task compared here is made from this seed


class Log:
    """Stands in for their logger: keeps the lines their `test` writes."""

    def __init__(self):
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(str(message))

    def number(self, pattern: str) -> float:
        for line in self.lines:
            match = re.search(pattern + r"\s*:?\s*([-+0-9.eE]+|nan)", line)
            if match:
                return float(match.group(1))
        raise AssertionError(f"their test wrote no line matching {pattern!r}")


class Oracle:
    """A network for their `test`: logits that are one-hot at chosen predictions.

    `answers` maps an input row (as a tuple) to (output steps, predicted tokens); a row
    their code builds that is not among ours counts as a layout mismatch.
    """

    def __init__(self, K: int, answers: dict[tuple, tuple[list[int], list[int]]] | None = None,
                 answer: Callable[[Tensor], tuple[list[int], list[int]] | None] | None = None):
        self.K, self.answers, self.answer = K, answers, answer
        self.unknown = 0
        self.inputs: list[Tensor] = []

    def __call__(self, input: Tensor, time_mask=None) -> Tensor:
        self.inputs.append(input.clone())
        logits = torch.zeros(*input.shape, self.K)
        for b, row in enumerate(input):
            found = (self.answers.get(tuple(row.tolist())) if self.answers is not None
                     else self.answer(row) if self.answer is not None else None)
            if found is None:
                self.unknown += 1
                continue
            steps, tokens = found
            logits[b, steps, tokens] = 1.0
        return logits


def corrupt(targets: Tensor, K: int, mask: Tensor | None = None) -> Tensor:
    """Our targets [N, T] with adjacent swaps and substitutions at fixed places (the swaps
    tell Damerau-Levenshtein from plain Levenshtein), and in every fourth row the first four
    tokens t0 t1 t2 t3 predicted as t1 t3 t0 t2 (distance 3 unrestricted, 4 for the
    restricted "optimal string alignment" variant, when the four differ)."""
    pred = targets.clone()
    N, T = pred.shape
    for i in range(N):
        width = T if mask is None else int(mask[i].sum())
        if i % 4 == 3 and width >= 4:
            pred[i, :4] = targets[i, [1, 3, 0, 2]]
            continue
        for j in range(width):
            if (i + j) % 5 == 0 and j + 1 < width:
                pred[i, j], pred[i, j + 1] = targets[i, j + 1], targets[i, j]
            elif (3 * i + j) % 7 == 0:
                pred[i, j] = (targets[i, j] + 1) % K
    return pred


class OracleModel(torch.nn.Module):
    """A model for Session.evaluate whose logits at every step are the oracle's (the head
    passes them through); one parameter, for the session's optimizer."""

    def __init__(self, oracle: Oracle):
        super().__init__()
        self.oracle, self.head = oracle, torch.nn.Identity()
        self.anchor = torch.nn.Parameter(torch.zeros(()))

    def forward(self, inputs: Tensor) -> Tensor:
        return self.oracle(inputs)  # [B, T, K]


def _answers(batches, predictions, trim: bool = True) -> dict:
    """{input row: (output steps, predicted tokens)}; `trim`: variable-length rows cut to
    the 2l steps their test feeds (our model is fed the padded row)."""
    out = {}
    for batch, pred in zip(batches, predictions):
        T_out = batch.output_targets.shape[1]
        for b in range(len(batch)):
            row = batch.inputs[b]
            if batch.output_steps is None:
                steps = list(range(row.shape[0] - T_out, row.shape[0]))
                tokens = pred[b].tolist()
            else:
                keep = batch.output_mask[b]
                steps, tokens = batch.output_steps[b][keep].tolist(), pred[b][keep].tolist()
            if trim and batch.lengths is not None:  # their test feeds each length 2l steps
                row = row[:2 * int(batch.lengths[b])]
            out[tuple(row.tolist())] = (steps, tokens)
    return out


def _learner(module, model, K: int, attr: str = "rnn"):
    learner = module.Learner.__new__(module.Learner)
    learner.logger, learner.device = Log(), torch.device("cpu")
    learner.checkpoint = {"modules": {attr: {"init_args": {"vocab_size": K}}}}
    setattr(learner, attr, model)
    return learner


def _ours(task, predictions_of: Callable[[list], list]):
    """(held-out batches, the predictions chosen for them, our scores of those predictions
    through Session.evaluate)."""
    batches = list(task.held_out_batches(10**6))
    predictions = predictions_of(batches)
    oracle = Oracle(task.K, _answers(batches, predictions, trim=False))
    recipe = Recipe.model_validate({"task": task.cfg.model_dump(), "train": {"seed": SEED}})
    # A stand-in, not a SequenceModel: Session.evaluate needs only its call and its head.
    session = Session(recipe, torch.device("cpu"), cast(SequenceModel, OracleModel(oracle)))
    if not torch.equal(session.task.held_out, task.held_out):
        raise AssertionError("the session's task is not the task compared")
    scores = session.evaluate()
    if oracle.unknown:
        raise AssertionError(f"Session.evaluate fed {oracle.unknown} rows that are not the "
                             "task's held-out inputs")
    return batches, predictions, scores


def _session_scores(task, held_out: Tensor,
                    answer: Callable[[Tensor], tuple[list[int], list[int]] | None]) -> dict:
    """Session.evaluate's scores of an oracle answering `answer(input row)`, on the task's
    recipe with `held_out` as its held-out rows; "unknown": rows the oracle could not
    answer."""
    oracle = Oracle(task.K, answer=answer)
    recipe = Recipe.model_validate({"task": task.cfg.model_dump(), "train": {"seed": SEED}})
    session = Session(recipe, torch.device("cpu"), cast(SequenceModel, OracleModel(oracle)))
    session.task.held_out = held_out
    return session.evaluate() | {"unknown": oracle.unknown}


def _predicted(make_pred: Callable[[Tensor], Tensor], batches: list) -> list[Tensor]:
    """Predictions made from each batch's targets (exact, or corrupted)."""
    return [make_pred(b.output_targets) for b in batches]


def _z(a: Tensor, b: Tensor, bins: int) -> float:
    """Largest two-sample z of the bin frequencies of two integer samples."""
    a, b = a.flatten().long(), b.flatten().long()
    pa = torch.bincount(a, minlength=bins).double() / len(a)
    pb = torch.bincount(b, minlength=bins).double() / len(b)
    p = (pa * len(a) + pb * len(b)) / (len(a) + len(b))
    se = (p * (1 - p) * (1 / len(a) + 1 / len(b))).sqrt().clamp_min(1e-12)
    return float(((pa - pb).abs() / se).max())


def _their_draws(dataset, n: int, seed: int) -> Tensor:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return torch.stack([dataset[i] for i in range(n)])


def _held_in(rows: Tensor, held_out: Tensor) -> int:
    return int((rows[:, None, :] == held_out[None]).all(-1).any(-1).sum())


def _sampling_check(name: str, ours_rows: Tensor, theirs_rows: Tensor, bins: int, what: str,
                    theirs_what: str, stat: Callable[[Tensor], Tensor] = lambda r: r) -> Comparison:
    z = _z(stat(ours_rows), stat(theirs_rows), bins)
    return numeric(f"{name}: sampling", what, theirs_what, Z_TOL, {"fp32": z, "fp64": z},
                   unit="largest two-sample z")


def _dense_sampling_check(name: str, task, theirs) -> Comparison:
    """Training rows where most rows are held out (task.sample draws from the list of the
    rows left, weighted by each row's chance) against their rejection sampler given the same
    held-out rows: the frequency of every whole row, so a row drawn with the wrong weight,
    or a held-out row drawn at all, is seen."""
    K, L = task.K, task.L
    dense = task._rows_left is not None  # the path compared: the list of rows left
    theirs.held_out = task.held_out.clone()  # their __getitem__ rejects these rows
    gen = torch.Generator().manual_seed(5)
    ours_rows = task.sample(DRAWS, gen).sequences
    their_rows = _their_draws(theirs, DRAWS, 6)
    index = K ** torch.arange(L - 1, -1, -1)  # a row as one base-K number

    def row_index(rows: Tensor) -> Tensor:
        return (rows * index).sum(1)

    check = _sampling_check(
        name, ours_rows, their_rows, K ** L, f"frequency of each of "
        f"the {K ** L} rows in {DRAWS} training rows, {len(task.held_out)} held out "
        f"({task.held_out_share:.0%} of draws; ours from the list of rows left: {dense})",
        f"data.dataset.{type(theirs).__name__}.__getitem__ (rejection) with our held-out rows",
        stat=row_index)
    check.name = f"{name}: dense sampling"
    leaks = _held_in(ours_rows, task.held_out) + _held_in(their_rows, task.held_out)
    if not dense or leaks:
        check.verdict = "disagree"
        check.reason = ("the task did not take its dense path (rows left)" if not dense
                        else f"{leaks} held-out rows drawn")
    return check


def _scoring_checks(name: str, task, learner_of: Callable[[Oracle], Any],
                    their_held_out: Tensor | dict, K: int, dl_tester=None,
                    theirs_what: str = "", per_length: bool = False) -> list[Comparison]:
    """Targets (their test scores our targets as perfect) and scoring (the same corrupted
    predictions give the same numbers); `per_length`: their test logs one line per length
    (variable length)."""
    checks = []
    exact_batches, exact_pred, exact = _ours(task, lambda bs: [b.output_targets for b in bs])
    oracle = Oracle(K, _answers(exact_batches, exact_pred))
    learner = learner_of(oracle)
    with torch.no_grad():
        learner.test(their_held_out)
    # The worst of their token accuracies (one line, or one per length).
    theirs_acc = min(float(x) for x in re.findall(r"\(token\): ([0-9.eE+-]+)",
                                                  "\n".join(learner.logger.lines)))
    err = (abs(1.0 - theirs_acc) + abs(1.0 - exact["token_accuracy"])
           + (math.inf if oracle.unknown else 0.0))
    checks.append(numeric(
        f"{name}: targets", f"their test and our Session.evaluate score our targets on our "
        f"held-out set ({len(task.held_out)} rows): token accuracy must be 1 on both sides; "
        f"inputs their code builds must be ours ({oracle.unknown} unknown)", theirs_what,
        SCORE_TOL, {"fp32": err, "fp64": err}, unit="|1 - their accuracy| + |1 - ours|"))

    bad_batches, bad_pred, ours = _ours(task, lambda bs: [
        corrupt(b.output_targets, K, b.output_mask) for b in bs])
    oracle = Oracle(K, _answers(bad_batches, bad_pred))
    learner = learner_of(oracle)
    with torch.no_grad():
        learner.test(their_held_out)
    if per_length:
        errs = []
        for row in ours["by_length"]:
            n = row["length"]
            errs.append(abs(row["token_accuracy"] - learner.logger.number(
                rf"length={n} \(token\)")))
            errs.append(abs(row["sequence_accuracy"] - learner.logger.number(
                rf"length={n} \(sequence-wise full-match\)")))
        err = max(errs)
        compared = "token and sequence accuracy per length, same corrupted predictions"
        # Ragged: the whole set mixes lengths, so averaging per token and per sequence
        # differ. Their whole-set numbers follow from their per-length ones: token accuracy
        # weighted by the tokens of each length, sequence accuracy by its rows.
        rows = ours["by_length"]
        tokens = sum(r["n"] * r["length"] for r in rows)
        theirs_token = sum(learner.logger.number(rf"length={r['length']} \(token\)")
                           * r["n"] * r["length"] for r in rows) / tokens
        theirs_seq = sum(learner.logger.number(
            rf"length={r['length']} \(sequence-wise full-match\)") * r["n"] for r in rows
        ) / sum(r["n"] for r in rows)
        per_sequence = sum(r["token_accuracy"] * r["n"] for r in rows) / sum(r["n"] for r in rows)
        ragged = max(abs(ours["token_accuracy"] - theirs_token),
                     abs(ours["sequence_accuracy"] - theirs_seq))
        ragged += math.inf if oracle.unknown else 0.0
        ragged_check = numeric(
            f"{name}: ragged scoring", f"whole-set token accuracy {ours['token_accuracy']:.5f} "
            f"(per token; averaged per sequence it would be {per_sequence:.5f}) and sequence "
            f"accuracy over lengths {rows[0]['length']}..{rows[-1]['length']}, same corrupted "
            "predictions", f"{theirs_what}, their per-length numbers weighted by tokens / rows",
            SCORE_TOL, {"fp32": ragged, "fp64": ragged})
    else:
        err = max(abs(ours["token_accuracy"] - learner.logger.number(r"Test accuracy \(token\)")),
                  abs(ours["sequence_accuracy"] - learner.logger.number(
                      r"Test accuracy \(sequence-wise full-match\)")))
        compared = (f"token accuracy {ours['token_accuracy']:.4f} and sequence accuracy "
                    f"{ours['sequence_accuracy']:.4f} of the same corrupted predictions")
    err += math.inf if oracle.unknown else 0.0
    checks.append(numeric(f"{name}: scoring", compared, theirs_what, SCORE_TOL,
                          {"fp32": err, "fp64": err}))
    if per_length:
        checks.append(ragged_check)
    if dl_tester is not None:
        tester = dl_tester(oracle)
        with torch.no_grad():
            tester()
        theirs_dl = tester.logger.number(r"Damerau-Levenshtein distance b/w prediction and "
                                         r"target")
        err = abs(ours["dl_distance"] - theirs_dl) + (math.inf if oracle.unknown else 0.0)
        checks.append(numeric(
            f"{name}: Damerau-Levenshtein", f"mean distance {ours['dl_distance']:.4f} of the "
            "same corrupted predictions (with adjacent swaps)",
            dl_tester.__doc__ or "", SCORE_TOL, {"fp32": err, "fp64": err}))
    return checks


def _dl_tester(module, held_out: Tensor, K: int):
    def build(oracle: Oracle):
        tester = module.Tester.__new__(module.Tester)
        tester.logger, tester.device, tester.rnn = Log(), torch.device("cpu"), oracle
        tester.checkpoint = {"held_out_data": held_out,
                             "modules": {"rnn": {"init_args": {"vocab_size": K}}}}
        return tester
    return build


def check_fixed_length(authors: Authors) -> list[Comparison]:
    """reverse, sort and reverse + delayed addition: RandomSequence and their tests."""
    dataset = authors.module("data.dataset")
    checks = []
    specs = (("reverse", "train_palindrome.py", "test_palindrome_by-DamerauLevenshtein.py", 1),
             ("sort", "train_sort.py", "test_sort_by-DamerauLevenshtein.py", 1),
             ("reverse_add", "train_delayed-sum.py", None, 2))
    for name, script, dl_script, width in specs:
        K, L = 6, 4
        task = make(TaskConfig.of(name=name, vocab_size=K, length=L, held_out=64), seed=SEED)
        held = task.held_out
        with torch.random.fork_rng():
            torch.manual_seed(2)
            theirs = dataset.RandomSequence(K, width * L, num_held_out=64)
        # Held-out sets: as many distinct rows, of one shape; training draws exclude them.
        gen = torch.Generator().manual_seed(5)
        ours_train = task.sample(DRAWS, gen).sequences
        their_train = _their_draws(theirs, DRAWS, 6)
        shape = 0 if tuple(held.shape) == tuple(theirs.held_out.shape) else math.inf
        distinct = (len(held) - len(torch.unique(held, dim=0))
                    + len(theirs.held_out) - len(torch.unique(theirs.held_out, dim=0)))
        leaks = _held_in(ours_train, held) + _held_in(their_train, theirs.held_out)
        err = shape + distinct + leaks
        checks.append(numeric(
            f"{name}: held-out set", f"{len(held)} distinct rows [{held.shape[1]}] each; "
            f"none of {DRAWS} training rows is held out (K={K}, so a quarter of draws "
            f"would be)", "data.dataset.RandomSequence(held_out, __getitem__)",
            {"fp32": 0.0, "fp64": 0.0}, {"fp32": err, "fp64": err},
            unit="shape/duplicate/leak count"))
        checks.append(_sampling_check(
            name, ours_train, their_train, K, f"token frequencies of {DRAWS} training rows",
            "data.dataset.RandomSequence.__getitem__"))
        if name == "reverse":  # 20 of the 27 rows held out: the dense path
            dense = make(TaskConfig.of(name=name, vocab_size=3, length=3, held_out=20),
                         seed=SEED)
            checks.append(_dense_sampling_check(name, dense, dataset.RandomSequence(3, 3)))
        module = authors.script(script)
        tester = None
        if dl_script:
            tester = _dl_tester(authors.script(dl_script), held, K)
            tester.__doc__ = f"{dl_script[:-3]}.Tester"
        checks += _scoring_checks(
            name, task, functools.partial(_learner, module, K=K), held, K,
            tester, theirs_what=f"{script[:-3]}.Learner.test")
    return checks


def check_variable_length(authors: Authors) -> list[Comparison]:
    dataset = authors.module("data.dataset")
    K, L, low = 6, 8, 4
    task = make(TaskConfig.of(name="variable_length", vocab_size=K, length=L, min_length=low,
                              held_out=16), seed=SEED)
    with torch.random.fork_rng():
        torch.manual_seed(2)
        theirs = dataset.VariableLengthSequence(K, L, num_held_out=16, min_length=low)
        their_lengths = torch.tensor([len(theirs[i]) for i in range(DRAWS)])
    gen = torch.Generator().manual_seed(5)
    ours_rows = task.sample(DRAWS, gen).sequences
    ours_lengths = (ours_rows >= 0).sum(1)
    checks = [_sampling_check(
        "variable_length", ours_lengths, their_lengths, L + 1, f"input lengths of {DRAWS} "
        f"training rows ({low}..{L})", "data.dataset.VariableLengthSequence.__getitem__")]
    held = task.held_out
    lengths = (held >= 0).sum(1)
    by_length = {int(n): held[lengths == n][:, :int(n)] for n in torch.unique(lengths)}
    per = {n: len(v) for n, v in by_length.items()}
    theirs_per = {n: len(v) for n, v in theirs.held_out.items()}
    err = 0.0 if per == theirs_per else math.inf
    checks.append(numeric(
        "variable_length: held-out set", f"held-out rows per length {low}..{L} "
        f"({per[low]} each)", "data.dataset.VariableLengthSequence.held_out",
        {"fp32": 0.0, "fp64": 0.0}, {"fp32": err, "fp64": err}, unit="mismatch"))
    module = authors.script("train_palindrome_variable-length.py")
    checks += _scoring_checks(
        "variable_length", task, lambda oracle: _learner(module, oracle, K), by_length, K,
        theirs_what="train_palindrome_variable-length.Learner.test (per length, "
        "exactly l command tokens)", per_length=True)
    return checks


def check_predecessor(authors: Authors) -> list[Comparison]:
    dataset = authors.module("data.dataset")
    K, L = 12, 6
    task = make(TaskConfig.of(name="predecessor", vocab_size=K, length=L, held_out=64), seed=SEED)
    with torch.random.fork_rng():
        torch.manual_seed(2)
        theirs = dataset.NonRepeatingRandomSequence(K, L, num_held_out=64)
    their_rows = _their_draws(theirs, DRAWS, 6)
    gen = torch.Generator().manual_seed(5)
    ours_rows = task.sample(DRAWS, gen).sequences
    repeats = sum(int((r[:, None] == r[None]).sum() - len(r)) for rows in (ours_rows, their_rows)
                  for r in rows)
    checks = [_sampling_check(
        "predecessor", ours_rows, their_rows, K * L, f"token frequency at each position of "
        f"{DRAWS} training rows; {repeats} repeated tokens within a row (must be 0)",
        "data.dataset.NonRepeatingRandomSequence.__getitem__",
        stat=lambda r: r * L + torch.arange(L))]
    if repeats:
        checks[-1].verdict, checks[-1].reason = "disagree", f"{repeats} repeated tokens"

    def predecessor_of_query(row: Tensor) -> tuple[list[int], list[int]] | None:
        """The answer the task defines: the token before the queried one."""
        where = (row[:-1] == row[-1]).nonzero()
        if len(where) != 1 or int(where[0]) == 0:
            return None
        return [row.shape[0] - 1], [int(row[int(where[0]) - 1])]

    def corrupted(row: Tensor) -> tuple[list[int], list[int]] | None:
        """The predecessor, but one past it in about a third of the rows."""
        found = predecessor_of_query(row)
        if found is None or int(row.sum()) % 3:
            return found
        return found[0], [(found[1][0] + 1) % K]

    module = authors.script("train_predecessor_query.py")
    x = task.held_out[:, :L]
    twice: list[Tensor] = []  # the inputs of two calls of their test
    for label, answer in (("targets", predecessor_of_query), ("scoring", corrupted)):
        oracle = Oracle(K, answer=answer)
        learner = _learner(module, oracle, K)
        with torch.random.fork_rng():
            torch.manual_seed(3)
            with torch.no_grad():
                learner.test(x)
                if label == "targets":
                    learner.test(x)  # a second call: its queries are re-drawn (below)
                    twice = oracle.inputs
        theirs_acc = learner.logger.number(r"Test accuracy")
        # Ours on the very rows their test built (x, then the queried token): the query's
        # 0-based index joins x as our rows hold it, and Session.evaluate scores them.
        built = oracle.inputs[0]  # [N, L + 1]
        query = (built[:, :L] == built[:, L:]).long().argmax(1)  # [N]
        ours = _session_scores(task, torch.cat([built[:, :L], query[:, None]], 1), answer)
        unknown = math.inf if oracle.unknown or ours["unknown"] else 0.0
        if label == "targets":
            err = abs(1 - theirs_acc) + abs(1 - ours["accuracy"]) + unknown
            compared, unit = ("both score the token before the queried one as correct "
                              "(accuracy 1 on each side; ours through Session.evaluate on the "
                              "rows their test built)", "|1 - accuracy| summed")
        else:
            err = abs(ours["accuracy"] - theirs_acc) + unknown
            compared, unit = (f"accuracy {ours['accuracy']:.4f} of the same predictions (a "
                              "third one past the predecessor) on the rows their test built, "
                              "ours through Session.evaluate", "max |ours - theirs|")
        checks.append(numeric(
            f"predecessor: {label}", compared, "train_predecessor_query.Learner.test",
            SCORE_TOL, {"fp32": err, "fp64": err}, unit=unit))
    # Documented difference: their test re-draws the queries at every call; ours are fixed.
    first, second = (i[:, -1] for i in twice[:2])
    again = make(TaskConfig.of(name="predecessor", vocab_size=K, length=L, held_out=64), seed=SEED)
    theirs_redraw = bool((first != second).any())
    ours_fixed = bool(torch.equal(again.held_out, task.held_out))
    their_q = {int(((r[:-1] == r[-1]).nonzero())[0]) for r in twice[0]}
    ours_q = {int(q) for q in task.held_out[:, L]}
    same_range = their_q == ours_q == set(range(1, L))
    err = 0.0 if (theirs_redraw and ours_fixed and same_range) else math.inf
    checks.append(Comparison(
        "predecessor: test queries", f"queries (0-based index 1..{L - 1} on both sides: "
        f"{'yes' if same_range else 'no'}); theirs re-drawn by a second test call: "
        f"{theirs_redraw}; ours fixed by the seed: {ours_fixed}",
        "train_predecessor_query.Learner.test, called twice", {"fp32": 0.0, "fp64": 0.0},
        {"fp32": err, "fp64": err}, unit="mismatch",
        difference="predecessor query test set: their queries are re-drawn at every test, "
        "ours are fixed from the seed").settle())
    return checks


def _replication_value(authors: Authors, name: str) -> float | None:
    script = authors.repo.root / "replication.sh"
    if not script.is_file():
        return None
    match = re.search(rf"^{name}=([0-9.]+)", script.read_text(), re.MULTILINE)
    return float(match.group(1)) if match else None


def _rare_structure_check(ours_rows: Tensor, their_rows: Tensor, K: int, L: int
                          ) -> Comparison:
    """How RARE and FREQUENT tokens mix within rows, not only their overall share: the
    number of RARE tokens per row (Binomial(L, rarity) when each token is RARE on its own
    coin; a coin per row gives 0 or L), which token is drawn at each position, and the
    RARE/FREQUENT pattern of each pair of neighbouring positions."""
    def rare_count(rows: Tensor) -> Tensor:
        return (rows >= K // 2).sum(1)  # [N], 0..L

    def token_at(rows: Tensor) -> Tensor:
        return rows + K * torch.arange(L)  # [N, L], a bin per (position, token)

    def neighbours(rows: Tensor) -> Tensor:
        rare = (rows >= K // 2).long()
        return 4 * torch.arange(L - 1) + 2 * rare[:, :-1] + rare[:, 1:]  # [N, L - 1]

    stats = {"RARE tokens per row": (rare_count, L + 1),
             "token at each position": (token_at, K * L),
             "RARE/FREQUENT pattern of neighbours": (neighbours, 4 * (L - 1))}
    zs = {what: _z(f(ours_rows), f(their_rows), bins) for what, (f, bins) in stats.items()}
    z = max(zs.values())
    return numeric(
        "dual_frequency: rows' structure", f"{DRAWS} training rows: "
        + "; ".join(f"{what} (largest z {v:.1f})" for what, v in zs.items()),
        "data.dataset.FreqentVSRare.__getitem__", Z_TOL, {"fp32": z, "fp64": z},
        unit="largest two-sample z")


def paper_bands(L: int) -> list[tuple[int, int]]:
    """The Fig. 3 caption's quarters of the target positions, 1-based and inclusive (1-16,
    17-32, 33-48, 49-64 at L = 64), read off the positions alone."""
    return [(q * L // 4 + 1, (q + 1) * L // 4) for q in range(4)]


def _band_accuracy_check(by_band: list[dict], theirs_at: dict, L: int,
                         unknown: float) -> Comparison:
    """Our per-band accuracies against the mean of their per-position lines over each of
    the caption's quarters; the bands' spans are the caption's, not the ones ours reports
    (a band one position off reports itself consistently)."""
    errs, wrong = [], []
    quarters = paper_bands(L)
    for tr, dr in [(t, d) for t in ("frequent", "rare") for d in ("frequent", "rare")]:
        rows = [r for r in by_band if r["target"] == tr and r["disturbants"] == dr]
        spans = [(r["first"], r["last"]) for r in rows]
        if spans != quarters:
            wrong.append(f"{tr}/{dr}: bands {spans}, the caption's {quarters}")
        for row, (first, last) in zip(rows, quarters):
            span = range(first, last + 1)
            theirs = sum(theirs_at[(tr, dr, t)] for t in span) / len(span)
            errs.append(abs(row["accuracy"] - theirs))
    err = (max(errs) if errs else math.inf) + unknown + (math.inf if wrong else 0.0)
    return numeric(
        "dual_frequency: by band", f"target-token accuracy per condition and band (the "
        f"caption's quarters of L={L}: {', '.join(f'{a}-{b}' for a, b in quarters)}; 1-16 ... "
        "49-64 at L=64), same corrupted predictions", "train_palindrome_dual-freq.Learner."
        "test, its per-position accuracies averaged over each quarter", SCORE_TOL,
        {"fp32": err, "fp64": err}, reason="; ".join(wrong))


def _band_membership_check(task, module, K: int, L: int, held: Tensor) -> Comparison:
    """Band membership position by position: for each target position p, predictions right
    only on the rows whose target sits at p. Their test must then log accuracy 1 at exactly
    one position per condition (their 0-based t = p - 1), and ours must put all of its hits
    in the band of the caption's quarter holding t + 1."""
    quarters = paper_bands(L)
    wrong = []
    cells = task.cells  # [N, 3]: target rare, disturbants rare, position (1-based)
    for p in range(1, L + 1):
        at_p = cells[:, 2] == p

        def only_at_p(batches: list, at_p: Tensor = at_p) -> list[Tensor]:
            return [torch.where(at_p[:, None], b.output_targets, (b.output_targets + 1) % K)
                    for b in batches]

        batches, preds, ours = _ours(task, only_at_p)
        oracle = Oracle(K, _answers(batches, preds))
        learner = _learner(module, oracle, K)
        with torch.no_grad():
            learner.test(held.contiguous())
        if oracle.unknown:
            wrong.append(f"p={p}: {oracle.unknown} rows their test built are not ours")
        hit_lines = []  # (target, disturbants, 0-based t) of their lines with a hit
        for line in learner.logger.lines:
            m = re.search(r"(\w+) tokens input at t=(\d+) surrounded by (\w+) token "
                          r"\(token\)\s*:?\s*([-+0-9.eE]+)", line)
            if m and float(m.group(4)) > 0:
                hit_lines.append((m.group(1), m.group(3), int(m.group(2))))
        theirs_t = {(tr, dr): t for tr, dr, t in hit_lines}
        for tr, dr in [(t, d) for t in ("frequent", "rare") for d in ("frequent", "rare")]:
            ts = [t for a, b, t in hit_lines if (a, b) == (tr, dr)]
            if ts != [p - 1]:
                wrong.append(f"p={p} {tr}/{dr}: their lines with hits at t={ts} (0-based)")
                continue
            quarter = next(q for q in quarters if q[0] <= theirs_t[(tr, dr)] + 1 <= q[1])
            hit_bands = [(r["first"], r["last"]) for r in ours["by_band"]
                         if r["target"] == tr and r["disturbants"] == dr and r["accuracy"] > 0]
            if hit_bands != [quarter]:
                wrong.append(f"p={p} {tr}/{dr}: ours in bands {hit_bands}, their line t={p - 1} "
                             f"in the caption's {quarter[0]}-{quarter[1]}")
    check = Comparison(
        "dual_frequency: band membership", f"for each target position 1..{L}, predictions "
        "right only there: the one position their test logs as hit (0-based t) and the band "
        "ours scores it in, against the caption's quarters ("
        + ", ".join(f"{a}-{b}" for a, b in quarters) + ")",
        "train_palindrome_dual-freq.Learner.test, its per-position lines",
        {"fp32": 0.0, "fp64": 0.0}, {"fp32": float(len(wrong)), "fp64": float(len(wrong))},
        unit="positions placed differently")
    if wrong:
        check.verdict, check.reason = "disagree", "; ".join(wrong[:4]) + (
            f" and {len(wrong) - 4} more" if len(wrong) > 4 else "")
    return check


def check_dual_frequency(authors: Authors) -> list[Comparison]:
    dataset = authors.module("data.dataset")
    K, L, per = 8, 8, 2
    cfg = TaskConfig.of(name="dual_frequency", vocab_size=K, length=L, held_out_per_cell=per)
    assert isinstance(cfg, DualFrequencyConfig)
    task = make(cfg, seed=SEED)
    rarity = _replication_value(authors, "rarity")
    with torch.random.fork_rng():
        torch.manual_seed(2)
        theirs = dataset.FreqentVSRare(K, L, num_held_out=4 * L * per,
                                       **({} if rarity is None else {"rarity": rarity}))
    their_rows = _their_draws(theirs, DRAWS, 6)
    gen = torch.Generator().manual_seed(5)
    ours_rows = task.sample(DRAWS, gen).sequences
    checks = [_sampling_check(
        "dual_frequency", ours_rows, their_rows, K, f"token frequencies of {DRAWS} training "
        f"rows (ours: rarity {cfg.rarity}; theirs: {theirs.rarity}, replication.sh)",
        "data.dataset.FreqentVSRare.__getitem__")]
    checks.append(_rare_structure_check(ours_rows, their_rows, K, L))
    # K = 4, L = 2: the 8 structured rows are half of the chance of a draw (dense).
    dense_cfg = TaskConfig.of(name="dual_frequency", vocab_size=4, length=2, held_out_per_cell=1)
    checks.append(_dense_sampling_check(
        "dual_frequency", make(dense_cfg, seed=SEED),
        dataset.FreqentVSRare(4, 2, **({} if rarity is None else {"rarity": rarity}))))

    # The structured test set: ours [4 L per, L] in (target, disturbants, position, copy)
    # order; theirs [2, 2, per, L(position), L].
    ours5 = task.held_out.view(2, 2, L, per, L).transpose(2, 3)
    violations = 0
    for held in (ours5, theirs.held_out):
        if held.shape != (2, 2, per, L, L):
            violations += 1
            continue
        diag = torch.eye(L, dtype=torch.bool)
        for tr in range(2):
            for dr in range(2):
                cell = held[tr, dr]  # [per, L, L]
                violations += int(((cell[:, diag] >= K // 2) != bool(tr)).sum())
                violations += int(((cell[:, ~diag] >= K // 2) != bool(dr)).sum())
    checks.append(numeric(
        "dual_frequency: test set", f"[2, 2, {per}, {L}, {L}] cells: the target at position "
        f"t of the target type, the {L - 1} others of the disturbant type, on both sides",
        "data.dataset.FreqentVSRare(held_out)", {"fp32": 0.0, "fp64": 0.0},
        {"fp32": float(violations), "fp64": float(violations)}, unit="tokens out of place"))

    # Documented difference: their mixed conditions are spliced from the pure ones.
    diag = torch.eye(L, dtype=torch.bool)

    def spliced(held: Tensor) -> float:
        fr, rf = held[0, 1], held[1, 0]
        ff, rr = held[0, 0], held[1, 1]
        same = torch.cat([(fr[:, diag] == ff[:, diag]).flatten(), (fr[:, ~diag] == rr[:, ~diag])
                          .flatten(), (rf[:, diag] == rr[:, diag]).flatten(),
                          (rf[:, ~diag] == ff[:, ~diag]).flatten()])
        return float(same.double().mean())

    theirs_s, ours_s = spliced(theirs.held_out), spliced(ours5)
    err = 0.0 if theirs_s == 1.0 and ours_s < 0.5 else math.inf
    checks.append(Comparison(
        "dual_frequency: mixed cells", f"tokens of the mixed conditions equal to the pure "
        f"conditions' at the same place: theirs {theirs_s:.2f} (spliced), ours {ours_s:.2f} "
        f"(drawn independently, chance {2 / K:.2f})", "data.dataset.FreqentVSRare(held_out)",
        {"fp32": 0.0, "fp64": 0.0}, {"fp32": err, "fp64": err}, unit="mismatch",
        difference="dual-frequency mixed conditions: spliced from the pure conditions' "
        "tokens in their code, drawn independently in ours").settle())

    held_out = _replication_value(authors, "num_held_out")
    length = _replication_value(authors, "seq_length") or 64
    ours_default = DualFrequencyConfig.model_fields["held_out_per_cell"].default
    their_per = None if held_out is None else held_out / (4 * length)
    their_per = int(their_per) if their_per is not None and their_per.is_integer() else their_per
    err = 0.0 if their_per == 4 and ours_default == 16 else math.inf
    checks.append(Comparison(
        "dual_frequency: test-set size", f"sequences per cell: replication.sh "
        f"num_held_out={held_out and int(held_out)} at L={int(length)} gives {their_per}; "
        f"ours {ours_default} (Fig. 3 caption; task.held_out_per_cell = 4 gives theirs)",
        "replication.sh (read, not run)", {"fp32": 0.0, "fp64": 0.0},
        {"fp32": err, "fp64": err}, unit="mismatch",
        difference="dual-frequency test set: 4 per cell in replication.sh, 16 (the "
        "caption's 4,096) in ours").settle())

    # Scoring on the target token: their per-(condition, position) accuracies.
    module = authors.script("train_palindrome_dual-freq.py")
    names = ("frequent", "rare")
    for label, make_pred in (("targets", lambda t: t), ("scoring", lambda t: corrupt(t, K))):
        batches, preds, ours = _ours(task, functools.partial(_predicted, make_pred))
        oracle = Oracle(K, _answers(batches, preds))
        learner = _learner(module, oracle, K)
        with torch.no_grad():
            learner.test(ours5.contiguous())
        unknown = math.inf if oracle.unknown else 0.0
        theirs_at = {}  # (target, disturbants, 1-based position): their accuracy
        errs = []
        for row in ours["by_condition"]:
            key = (row["target"], row["disturbants"], row["position"])
            theirs_at[key] = learner.logger.number(
                rf"{row['target']} tokens input at t={row['position'] - 1} surrounded by "
                rf"{row['disturbants']} token \(token\)")
            errs.append(abs((1.0 if label == "targets" else row["accuracy"]) - theirs_at[key]))
        checks.append(numeric(
            f"dual_frequency: {label}", f"target-token accuracy per condition "
            f"({'/'.join(names)} x {'/'.join(names)}) and position 1..{L}"
            + (": ours are perfect to their test" if label == "targets"
               else ", same corrupted predictions"),
            "train_palindrome_dual-freq.Learner.test", SCORE_TOL,
            {"fp32": max(errs) + unknown, "fp64": max(errs) + unknown}))
        if label == "scoring":
            checks.append(_band_accuracy_check(ours["by_band"], theirs_at, L, unknown))
    checks.append(_band_membership_check(task, module, K, L, ours5))
    return checks
