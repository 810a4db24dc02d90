"""Positional encodings, whole-model forward logits and a short Adam trajectory, ours against
the authors' modules on the same weights.

Our weights are drawn by perencode, mapped onto the authors' parameter names
(`their_state_dict`) and loaded into their `model.RNN` / `model.SSM` with strict names, so
a parameter left unmapped fails the check instead of passing unnoticed.
"""

from __future__ import annotations

import ast
import functools
import math
from pathlib import Path

import torch
from torch import Tensor, nn

from perencode.commands.crosscheck.authors import Authors
from perencode.commands.crosscheck.report import DISAGREE, Comparison, numeric
from perencode.config.recipe import EncodingConfig, Recipe
from perencode.kinds import encoding
from perencode.kinds.models import SequenceModel, build_model
from perencode.kinds.models.rnn import RecurrentModel
from perencode.kinds.models.s4d import S4DModel
from perencode.kinds.shapes import Shapes
from perencode.training.session import Session

# Small shapes: every comparison is of the same operations, which the sizes do not change.
K, L, E, H, BATCH = 12, 8, 16, 16, 4
D_STATE = 64  # the authors' S4D fixes its state size at 64
FORMS = {"none": None, "sinusoidal": "sinusoidal", "random": "random",
         "learnable": "learnable", "duplicate": "dummy"}
DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


def script_tree(path: Path) -> ast.Module:
    """The syntax tree of one of their scripts, parsed once per process and version of the
    file (a crosscheck reads the same scripts' settings for every grid and group); read it,
    never change it."""
    stat = path.stat()
    return _parsed(str(path), stat.st_mtime_ns, stat.st_size)


@functools.cache
def _parsed(path: str, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(Path(path).read_text())


def script_literals(path: Path, variable: str) -> dict:
    """The literal keyword arguments of `variable = dict(...)` in one of their scripts,
    read with `ast` (nothing of the script runs); non-literal ones (`args.x`) are left out."""
    for node in ast.walk(script_tree(path)):
        if (isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == variable for t in node.targets)
                and isinstance(node.value, ast.Call)):
            out = {}
            for kw in node.value.keywords:
                try:
                    out[kw.arg] = ast.literal_eval(kw.value)
                except ValueError:
                    continue
            return out
    raise ValueError(f"{path.name}: no `{variable} = dict(...)` found")


def ours(arch: str, form: str, num_embeddings: int = K + 1) -> SequenceModel:
    cfg = EncodingConfig(kind=form, mode="concat")
    shapes = Shapes(num_embeddings=num_embeddings, num_classes=K, steps=2 * L, outputs=L)
    if arch == "s4d":
        return S4DModel(shapes, E, H, D_STATE, cfg)
    return RecurrentModel(arch, shapes, E, H, cfg)


def from_recipe(arch: str, form: str, mode: str, embed: int, hidden: int) -> SequenceModel:
    """Our model as `perencode train` builds it: from a recipe's [model] and [encoding]
    tables (build_model), sized by the reverse task's shapes."""
    recipe = Recipe.model_validate({
        "task": {"name": "reverse", "vocab_size": K, "length": L, "held_out": 4},
        "model": {"arch": arch, "hidden_size": hidden, "embed_size": embed,
                  **({"d_state": D_STATE} if arch == "s4d" else {})},
        "encoding": {"kind": form, "mode": mode}})
    shapes = Shapes(num_embeddings=K + 1, num_classes=K, steps=2 * L, outputs=L)
    return build_model(recipe, shapes)


def theirs(authors: Authors, arch: str, form: str, mode: str = "concat", embed: int = E,
           hidden: int = H) -> nn.Module:
    kwargs = dict(embed_size=embed, time_encoding=None if form == "none" else mode,
                  time_encoding_form=FORMS[form] or "sinusoidal", max_length=2 * L,
                  learnable_padding_token=True)
    if arch == "s4d":
        return authors.module("model.ssm").SSM(K, hidden, **kwargs)
    return authors.module("model.rnn").RNN(K, hidden, arch.upper(), **kwargs)


def their_name(name: str) -> str:
    """Our parameter's name in the authors' model."""
    if name == "encoding.table":
        return "time_encoder.embeddings"
    if name.startswith("head."):
        return "to_logits." + name[len("head."):]
    if name.startswith("s4d.out_proj."):
        return "ssm.0.output_linear.0." + name[len("s4d.out_proj."):]
    if name == "s4d.D":
        return "ssm.0.D"
    if name.startswith("s4d."):
        return "ssm.0.kernel." + name[len("s4d."):]
    return name


def their_state_dict(model: nn.Module, target: nn.Module) -> dict[str, Tensor]:
    """Our parameters under the authors' names. Their sinusoidal frequencies are their own
    buffer (ours is recomputed, not stored) and are kept."""
    out = {}
    for name, value in model.state_dict().items():
        if name.startswith("s4d.out_proj.") and value.dim() == 2:
            # Their 1x1 Conv1d(H, 2H) is our Linear(H, 2H) with a kernel dimension.
            value = value[..., None]
        out[their_name(name)] = value
    own = target.state_dict()
    for name in own:
        if name.endswith("time_encoder.frequencies"):
            out[name] = own[name]
    return out


def trained(model: nn.Module, optimizer: torch.optim.Optimizer, rename=lambda n: n) -> set[str]:
    """The names (`rename`d) of the model's parameters that `optimizer` updates: in its
    parameter groups and requiring a gradient (named_parameters, not state_dict, which
    cannot tell a parameter from a buffer)."""
    stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return {rename(n) for n, p in model.named_parameters() if id(p) in stepped
            and p.requires_grad}


def pair(authors: Authors, arch: str, form: str, seed: int = 0
         ) -> tuple[SequenceModel, nn.Module]:
    """(ours, theirs) with the same weights (ours drawn from `seed`)."""
    torch.manual_seed(seed)
    mine = ours(arch, form)
    other = theirs(authors, arch, form)
    other.load_state_dict(their_state_dict(mine, other), strict=True)
    return mine.eval(), other.eval()


def _tokens(seed: int, rows: int = BATCH) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, K, (rows, L), generator=gen)
    return torch.cat([x, torch.full_like(x, K)], dim=1)  # [B, 2L]: inputs, command tokens


def check_encodings(authors: Authors) -> list[Comparison]:
    te = authors.module("model.time_encoding")
    T, D = 128, 512  # the paper's 2L and E
    errors = {}
    for name, dtype in DTYPES.items():
        mine = encoding.sinusoidal(T, D).to(dtype)
        other = te.SinusoidalPositionEncoder(D).to(dtype)(torch.zeros(1, T, D, dtype=dtype))[0]
        errors[name] = float((mine - other).abs().max())
    # Both encoders are computed from fp32 frequencies (ours rounded to fp32 at the end,
    # theirs an fp32 buffer): at t = 127 the angles carry fp32 rounding, ~1e-5, / sqrt(256).
    checks = [numeric(
        "encoding: sinusoidal", f"table [{T}, {D}] ([sin | cos] / sqrt(E/2), base 10,000)",
        "model.time_encoding.SinusoidalPositionEncoder", {"fp32": 2e-6, "fp64": 2e-6}, errors)]
    for form, cls in (("random", te.RandomPositionalEncoder),
                      ("learnable", te.LearnablePositionEncoder)):
        torch.manual_seed(7)
        table = encoding.PositionalEncoding(EncodingConfig(kind=form), D, T).table
        assert table is not None  # random and learnable encodings are tables
        mine = table.detach()
        torch.manual_seed(7)
        other = cls(D, T).embeddings.detach()
        shape = 0.0 if mine.shape == other.shape else math.inf
        norm = float((mine.norm(dim=-1) - other.norm(dim=-1)).abs().max())
        same = float((mine - other).abs().max()) if not shape else math.inf
        err = max(shape, norm, same)
        checks.append(numeric(
            f"encoding: {form}", f"table [{T}, {D}]: shape, row norms and values from one "
            "seed (both draw torch.randn(T, E) first)",
            f"model.time_encoding.{cls.__name__}", {"fp32": 0.0, "fp64": 0.0},
            {"fp32": err, "fp64": err}))
    return checks


# Embedding and hidden sizes that differ (E != H): a model that swaps them builds the other
# shapes, and the strict load into theirs fails.
E_APART, H_APART = 8, 12
# (architecture, encoding, mode) built from a recipe with E != H: every architecture, and
# `add` for every encoding that allows it (duplicate is concat only).
APART = ([(a, "sinusoidal", "concat") for a in ("gru", "lstm", "s4d")]
         + [("gru", f, "add") for f in ("sinusoidal", "random", "learnable")]
         + [("lstm", "learnable", "add"), ("s4d", "sinusoidal", "add")])


def pair_apart(authors: Authors, arch: str, form: str, mode: str, seed: int
               ) -> tuple[SequenceModel, nn.Module]:
    """(ours built from a recipe with E != H and `mode`, theirs) with the same weights."""
    torch.manual_seed(seed)
    mine = from_recipe(arch, form, mode, E_APART, H_APART)
    other = theirs(authors, arch, form, mode, E_APART, H_APART)
    other.load_state_dict(their_state_dict(mine, other), strict=True)
    return mine.eval(), other.eval()


def check_forward(authors: Authors) -> list[Comparison]:
    cases = [(a, f, "concat") for a in ("gru", "lstm", "s4d") for f in ("none", "sinusoidal")]
    cases += [("gru", "random", "concat"), ("gru", "learnable", "concat"),
              ("gru", "duplicate", "concat")]
    tokens = _tokens(1)
    checks: list[Comparison] = []
    for arch, form, mode in cases + [(a, f, m) for a, f, m in APART]:
        apart = len(checks) >= len(cases)
        name = f"forward: {arch} {form}" + (" add" * (mode == "add") + " E!=H" if apart else "")
        theirs_run = f"model.{'ssm.SSM' if arch == 's4d' else 'rnn.RNN'}.forward"
        sizes = (f"E={E_APART} != H={H_APART}, built from a recipe (build_model), mode "
                 f"{mode}" if apart else f"E=H={E}")
        compared = f"logits [{BATCH}, {2 * L}, {K}] on the same weights (K={K}, L={L}, {sizes})"
        try:
            if apart:
                mine, other = pair_apart(authors, arch, form, mode, seed=len(checks))
            else:
                mine, other = pair(authors, arch, form, seed=len(checks))
        except RuntimeError as exc:  # our shapes are not theirs: strict loading fails
            first = str(exc).split("\n\t")[1:2] or [str(exc)]
            checks.append(Comparison(name, compared, theirs_run, verdict=DISAGREE,
                                     reason=f"our weights do not fit their model: {first[0]}"))
            continue
        errors = {}
        for precision, dtype in DTYPES.items():
            mine, other = mine.to(dtype), other.to(dtype)
            with torch.no_grad():
                a = mine.head(mine(tokens))
                b = other(tokens)
            errors[precision] = float((a - b).abs().max())
        # fp64: the sinusoidal tables are fp32-computed on both sides (check above).
        fp64 = 1e-7 if form == "sinusoidal" else 1e-10
        checks.append(numeric(name, compared, theirs_run, {"fp32": 1e-5, "fp64": fp64},
                              errors))
    return checks


def their_learner(authors: Authors, arch: str, model: nn.Module, iterations: int,
                  warmup: int, lr: float, script: str | None = None):
    """Their training step's Learner (`script`, default train_palindrome[_ssm].py) around
    `model`, with the optimizer and scheduler their script configures; their __init__
    (logging, folders, checkpoints) is bypassed."""
    script = script or ("train_palindrome_ssm.py" if arch == "s4d" else "train_palindrome.py")
    module = authors.script(script)
    optim_config = script_literals(authors.repo.code / script, "optim_config") | {"lr": lr}
    scheduler_config = script_literals(authors.repo.code / script, "scheduler_config") | {
        "t_initial": iterations, "warmup_t": warmup}
    learner = module.Learner.__new__(module.Learner)
    attr = "ssm" if arch == "s4d" else "rnn"
    setattr(learner, attr, model)
    learner.device = torch.device("cpu")
    learner.checkpoint = {"modules": {attr: {"init_args": {"vocab_size": K}}}}
    learner.optimizer = torch.optim.Adam(learner.get_parameters(), **optim_config)
    learner.scheduler = authors.cosine_scheduler()(learner.optimizer, **scheduler_config)
    return learner, optim_config, scheduler_config


# (architecture, encoding): every encoding kind on the GRU (the learnable table and the
# duplicate embedding train and pass gradients), the S4D without and with one.
TRAJECTORIES = ([("gru", form) for form in FORMS] + [("lstm", "learnable"), ("s4d", "none"),
                                                     ("s4d", "learnable")])


def check_trajectory(authors: Authors, steps: int = 6,
                     cases: list[tuple[str, str]] | None = None) -> list[Comparison]:
    """`steps` Adam steps with clipping and the warm-up + cosine schedule, from the same
    weights on the same batches: ours through perencode.training.session.Session.step, theirs
    through their Learner.train_per_iteration; and the same set of trained parameters."""
    iterations, warmup = steps, 2
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, K, (8, L), generator=gen) for _ in range(steps)]
    checks = []
    for arch, form in cases or TRAJECTORIES:
        errors, settings, wrong = {}, "", ""
        # The package's defaults (the code's) but for the warm-up and the length.
        recipe = Recipe.model_validate({
            "task": {"name": "reverse", "vocab_size": K, "length": L, "held_out": 4},
            "model": {"arch": arch, "hidden_size": H, "embed_size": E,
                      **({"d_state": D_STATE} if arch == "s4d" else {})},
            "encoding": {"kind": form}, "optim": {"warmup": warmup},
            "train": {"iterations": iterations, "batch_size": 8, "seed": 0}})
        optim = recipe.optim
        names = 0
        for name, dtype in DTYPES.items():
            mine, other = pair(authors, arch, form, seed=11)
            mine, other = mine.to(dtype).train(), other.to(dtype).train()
            learner, oc, sc = their_learner(authors, arch, other, iterations, warmup, optim.lr)
            settings = f"their Adam {oc}, scheduler {sc}"
            session = Session(recipe, torch.device("cpu"), mine)
            ours_set = trained(mine, session.optimizer, their_name)
            theirs_set = trained(other, learner.optimizer)
            names = len(theirs_set)
            if ours_set != theirs_set:
                wrong = (f"trained parameters differ: ours only {sorted(ours_set - theirs_set)}"
                         f", theirs only {sorted(theirs_set - ours_set)}")
            for k, rows in enumerate(batches, start=1):
                session.step(session.task.build(rows))
                learner.train_per_iteration(rows, {}, k)
            mapped = their_state_dict(mine, other)
            errors[name] = max(float((mapped[n] - v).abs().max())
                               for n, v in other.state_dict().items())
            if wrong:
                errors[name] = math.inf
        # fp32 allows for different summation orders; fp64 would show a changed Adam
        # constant (eps 1e-9 -> 1e-8 moves parameters by ~1e-9). The sinusoidal tables
        # differ by fp32 rounding (the forward check), which the steps carry.
        fp64 = 1e-7 if form == "sinusoidal" else 1e-11
        checks.append(numeric(
            f"Adam trajectory: {arch} {form}", f"parameters after {steps} steps (warm-up "
            f"{warmup}, cosine over {iterations}, clip {optim.clip_norm}), and the {names} "
            f"trained parameters by name (named_parameters in each optimizer); {settings}",
            f"{'train_palindrome_ssm' if arch == 's4d' else 'train_palindrome'}.Learner"
            ".train_per_iteration, torch Adam, timm CosineLRScheduler",
            {"fp32": 1e-5, "fp64": fp64}, errors, reason=wrong))
    return checks
