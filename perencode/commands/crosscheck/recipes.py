"""The package's defaults and the paper's grids (recipes/paper/*.toml) against the authors'
command lines: their `replication.sh` (read, never run: its variable assignments and
`python code/...` lines are expanded here) over their scripts' argparse defaults and the
literals of their training code (read with `ast`).

Each grid is compared cell by cell with the invocation of the script that trains its task
and model; every setting both sides have is compared, and a value that differs is a
disagreement naming the field and both values, unless it is one of the documented
departures (REPRODUCE.md, "Discrepancies" and "Bugs in the authors' replication.sh"),
which are named instead. Variables that replication.sh leaves for the user to fill (seed,
vocabulary size, architecture, the encoding's use) are compared with what its comment
allows.
"""

from __future__ import annotations

import ast
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perencode.commands.crosscheck.authors import Authors, NotRun
from perencode.commands.crosscheck.models import script_literals, script_tree
from perencode.commands.crosscheck.report import AGREE, DISAGREE, NOT_RUN, Comparison
from perencode.config.grid import load_grid, paper_folder
from perencode.config.recipe import Recipe

# The script that trains each (task, architecture); "s4d" selects the SSM scripts.
SCRIPTS = {"reverse": ("train_palindrome.py", "train_palindrome_ssm.py"),
           "dual_frequency": ("train_palindrome_dual-freq.py",
                              "train_palindrome_dual-freq_ssm.py"),
           "sort": ("train_sort.py", None), "reverse_add": ("train_delayed-sum.py", None),
           "predecessor": ("train_predecessor_query.py", None),
           "variable_length": ("train_palindrome_variable-length.py", None)}
# Our encoding kinds under their --time_encoding_form names.
FORMS = {"sinusoidal": "sinusoidal", "learnable": "learnable", "random": "random",
         "duplicate": "dummy"}

# Documented departures: (our field, their value, our value) -> the named difference.
DEPARTURES = {
    ("train.batch_size", 2, 512): "replication.sh's batch_size=2 of the stability run stays "
    "in force for the runs after it (REPRODUCE.md, bugs in replication.sh); the paper: 512",
    ("task.held_out_per_cell", 4, 16): "dual-frequency test set: 4 per cell in "
    "replication.sh, 16 (the Fig. 3 caption) in ours",
}


BLANK = "<{}>"  # a variable replication.sh leaves blank, by name
UNKNOWN = "(not an option of the script)"
# Lines of replication.sh that pass an option their script lacks, documented as bugs.
BROKEN = {("train_predecessor_query.py", "--learnable_padding_token"): "replication.sh "
          "passes --learnable_padding_token, which train_predecessor_query.py has commented "
          "out (its line would fail argparse; REPRODUCE.md, bugs in replication.sh)"}


# Task options whose defaults have a value in replication.sh, compared by check_defaults.
TASK_DEFAULTS = {"dual_frequency": ("task.rarity", "task.held_out_per_cell")}


@dataclass
class Invocation:
    """One `python code/SCRIPT ...` line of replication.sh, expanded."""

    script: str
    line: int
    args: dict[str, Any]  # argparse dest -> value (defaults filled in)
    blanks: dict[str, str] = field(default_factory=dict)  # dest -> the comment of an unset var
    others: dict[str, list[str]] = field(default_factory=dict)  # dest -> values its comment allows
    choices: dict[str, list] = field(default_factory=dict)  # dest -> the argparse choices


def _strip_comment(text: str) -> tuple[str, str]:
    """(code, comment) of one shell line: `#` at the start or after a blank, outside quotes
    and backticks."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "\"'`":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1] in " \t"):
            return text[:i], text[i + 1:].strip()
    return text, ""


def _expand(text: str, env: dict[str, str]) -> str:
    """$var, ${var} and the `[ test ] && echo A || echo B` backticks replication.sh uses."""
    def var(match: re.Match) -> str:
        return env.get(match.group(1) or match.group(2), "")

    def expand(text: str) -> str:
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", var, text)

    def backtick(match: re.Match) -> str:
        test = re.fullmatch(r"\s*\[\s*(.*?)\s*\]\s*&&\s*echo\s+(.*?)(?:\s*\|\|\s*echo\s+(.*?))?\s*",
                            match.group(1))
        if test is None:
            raise ValueError(f"replication.sh: cannot read `{match.group(1)}`")
        cond, yes, no = (" ".join(shlex.split(expand(g or ""))) for g in test.groups())
        words = shlex.split(cond)
        negate = words[:1] == ["!"]
        words = words[1:] if negate else words
        if words[:1] == ["-z"]:
            truth = (words[1] if len(words) > 1 else "") == ""
        elif len(words) == 3 and words[1] == "=":
            truth = words[0] == words[2]
        else:
            raise ValueError(f"replication.sh: cannot read `[ {cond} ]`")
        return yes if truth != negate else no

    return expand(re.sub(r"`([^`]*)`", backtick, text))


def argparse_spec(path: Path) -> list[dict[str, Any]]:
    """Each `parser.add_argument(...)` of a script: name, dest, default, type, action."""
    spec = []
    for node in ast.walk(script_tree(path)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument" and node.args):
            continue
        name = ast.literal_eval(node.args[0])
        kw: dict[str, Any] = {}
        for k in node.keywords:
            if k.arg == "type" and isinstance(k.value, ast.Name):
                kw["type"] = {"int": int, "float": float, "str": str}.get(k.value.id, str)
            elif k.arg in ("default", "action", "choices"):
                try:
                    kw[k.arg] = ast.literal_eval(k.value)
                except ValueError:
                    kw[k.arg] = None
        dest = name.lstrip("-")
        default = kw.get("default", False if kw.get("action") == "store_true" else None)
        spec.append({"name": name, "dest": dest, "default": default,
                     "type": kw.get("type", str), "flag": kw.get("action") == "store_true",
                     "choices": kw.get("choices")})
    return spec


def _parse(tokens: list[str], spec: list[dict[str, Any]], script: str,
           comments: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(argparse dest -> value, dest -> comment of the blank variable that gave it)."""
    options = {s["name"]: s for s in spec if s["name"].startswith("-")}
    positional = [s for s in spec if not s["name"].startswith("-")]
    args = {s["dest"]: s["default"] for s in spec}
    blanks: dict[str, str] = {}
    it, seen = iter(tokens), 0

    def value(s: dict[str, Any], token: str) -> Any:
        blank = re.fullmatch(BLANK.format(r"(\w+)"), token)
        if blank:
            blanks[s["dest"]] = comments.get(blank.group(1), "")
            return None
        return s["type"](token)

    for token in it:
        if token.startswith("--"):
            if token not in options:  # argparse would stop the script here
                blanks[token] = UNKNOWN
                continue
            s = options[token]
            args[s["dest"]] = True if s["flag"] else value(s, next(it))
        else:
            if seen < len(positional):
                args[positional[seen]["dest"]] = value(positional[seen], token)
            seen += 1
    return args, blanks


def replication(authors: Authors) -> list[Invocation]:
    """Every `python code/train_*.py` line of replication.sh, as argparse would see it."""
    path = authors.repo.root / "replication.sh"
    if not path.is_file():
        raise NotRun(f"no replication.sh in {authors.repo.root}")
    env: dict[str, str] = {}
    comments: dict[str, str] = {}
    out = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        start, text = i + 1, ""
        while True:
            code, _ = _strip_comment(lines[i])
            raw = lines[i]
            i += 1
            if code.rstrip().endswith("\\") and i < len(lines):
                text += code.rstrip()[:-1] + " "
                continue
            text += code if text else raw
            break
        code, comment = _strip_comment(text)
        code = code.strip()
        assign = re.fullmatch(r"(\w+)=(.*)", code)
        if assign:
            name, value = assign.groups()
            # A variable left for the user to fill stands as a marker: its comment says
            # what it may be.
            value = _expand(value.strip(), env)
            env[name] = value if value or not comment else BLANK.format(name)
            comments[name] = comment
            continue
        command = re.match(r"python\s+code/(train_\S+\.py)\s+(.*)", code)
        if command:
            script = command.group(1)
            spec = argparse_spec(authors.repo.code / script)
            tokens = shlex.split(_expand(command.group(2), env))
            args, blanks = _parse(tokens, spec, script, comments)
            # `--option $var` where var's comment names other values ("Alternatively,
            # "learnable" or "random""): those are allowed too.
            others = {dest: re.findall(r'"([^"]+)"', comments.get(var, ""))
                      for dest, var in re.findall(r"--(\w+)\s+\$\{?(\w+)\}?", command.group(2))}
            out.append(Invocation(script, start, args, blanks,
                                  {k: v for k, v in others.items() if v},
                                  {x["dest"]: x["choices"] for x in spec if x["choices"]}))
    return out


def _script(recipe: Recipe) -> str | None:
    names = SCRIPTS.get(recipe.task.name)
    if names is None:
        return None
    return names[1] if recipe.model.arch == "s4d" else names[0]


def expected(recipe: Recipe) -> dict[str, tuple[str, Any]]:
    """Our settings under their argparse names: dest -> (our field, our value)."""
    t, m, e, o, tr = recipe.task, recipe.model, recipe.encoding, recipe.optim, recipe.train
    out: dict[str, tuple[str, Any]] = {
        "vocab_size": ("task.vocab_size", t.vocab_size),
        "hidden_size": ("model.hidden_size", m.hidden_size),
        "embed_size": ("model.embed_size", getattr(m, "embed_size", None)),
        "num_iterations": ("train.iterations", tr.iterations),
        "batch_size": ("train.batch_size", tr.batch_size),
        "learning_rate": ("optim.lr", o.lr),
        "warmup_iters": ("optim.warmup", o.warmup),
        "seed": ("train.seed", tr.seed),
        "time_encoding": ("encoding.mode", None if e.kind == "none" else e.mode),
    }
    if m.arch != "s4d":
        out["rnn_name"] = ("model.arch", m.arch.upper())
    if e.kind != "none":
        out["time_encoding_form"] = ("encoding.kind", FORMS.get(e.kind, e.kind))
    cfg: Any = t
    if t.name == "variable_length":
        out["min_length"] = ("task.min_length", cfg.min_length)
        out["max_length"] = ("task.length", t.length)
    else:
        out["seq_length"] = ("task.length", t.length)
    if t.name == "dual_frequency":
        out["rarity"] = ("task.rarity", cfg.rarity)
        # Their --num_held_out counts the whole structured set: 4 conditions x L x per cell.
        out["num_held_out"] = ("task.held_out_per_cell", cfg.held_out_per_cell)
    elif hasattr(cfg, "held_out"):
        out["num_held_out"] = ("task.held_out", cfg.held_out)
    if t.name != "predecessor":  # its line has --learnable_padding_token commented out
        out["learnable_padding_token"] = ("(learnable command token)", True)
    return out


def _blank_allows(comment: str, dest: str, value: Any, recipe: Recipe) -> bool:
    """Whether a value left to the user is one the variable's comment allows."""
    if dest == "seed":
        return str(value) in re.findall(r"\d+", comment)
    if dest == "vocab_size":
        ranges = re.findall(r"(\d+)-(\d+)(?:\s*\((\w+)\))?", comment)
        arch = recipe.model.arch.upper()
        fitting = [(int(a), int(b)) for a, b, who in ranges if not who or who == arch]
        return any(a <= value <= b for a, b in fitting) if fitting else True
    if dest in ("rnn_name", "time_encoding"):
        return value is None or f'"{value}"' in comment
    return True


def _their_value(inv: Invocation, dest: str, recipe: Recipe) -> Any:
    value = inv.args.get(dest)
    if dest == "num_held_out" and recipe.task.name == "dual_frequency" and value:
        return value // (4 * recipe.task.length)
    return value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(float(a) - float(b)) <= 1e-12 * max(
            1.0, abs(float(a)))
    return a == b


def compare_recipe(recipe: Recipe, inv: Invocation, constants: dict[str, tuple[Any, Any]],
                   axes: tuple[str, ...] = (), only: tuple[str, ...] | None = None
                   ) -> tuple[list[str], list[str], int]:
    """(disagreements, named differences, settings compared) of one recipe against one
    invocation, and the script's constants {our field: (ours, theirs)}. A grid axis (in
    `axes`) may take a value the option's argparse choices allow, named as a difference."""
    wrong, named, compared = [], [], 0
    for option in [k for k, v in inv.blanks.items() if v == UNKNOWN]:
        if (inv.script, option) in BROKEN:
            named.append(BROKEN[inv.script, option])
        else:
            wrong.append(f"replication.sh line {inv.line}: {inv.script} has no option {option}")
    for dest, (name, ours) in expected(recipe).items():
        if dest not in inv.args or (only is not None and name not in only):
            continue
        if dest in inv.blanks:
            compared += 1
            if not _blank_allows(inv.blanks[dest], dest, ours, recipe):
                wrong.append(f"{name}: ours {ours}, replication.sh allows "
                             f"\"{inv.blanks[dest]}\"")
            continue
        theirs = _their_value(inv, dest, recipe)
        compared += 1
        if _same(ours, theirs) or str(ours) in inv.others.get(dest, []):
            continue
        departure = DEPARTURES.get((name, theirs, ours))
        if departure:
            named.append(departure)
        elif name in axes and ours in inv.choices.get(dest, []):
            named.append(f"{name} is a grid axis: the values other than {theirs} go through "
                         f"--{dest}, which {inv.script}'s argparse allows "
                         f"({', '.join(map(str, inv.choices[dest]))}) and replication.sh's "
                         f"line {inv.line} does not pass")
        else:
            wrong.append(f"{name}: ours {ours}, theirs {theirs} ({inv.script} via "
                         f"replication.sh line {inv.line})")
    for name, (ours, theirs) in constants.items():
        compared += 1
        if not _same(ours, theirs):
            wrong.append(f"{name}: ours {ours}, theirs {theirs} ({inv.script})")
    return wrong, named, compared


def script_constants(authors: Authors, script: str, recipe: Recipe) -> dict[str, tuple]:
    """Settings their script fixes in code: Adam's, the clip and the scheduler's form."""
    path = authors.repo.code / script
    optim = script_literals(path, "optim_config")
    sched = script_literals(path, "scheduler_config")
    o = recipe.optim
    out = {"optim.betas": (tuple(o.betas), tuple(optim.get("betas", (0.9, 0.999)))),
           "optim.eps": (o.eps, optim.get("eps", 1e-8)),
           "optim.weight_decay": (o.weight_decay, optim.get("weight_decay", 0.0)),
           "optim.schedule": (o.schedule, "timm" if sched.get("warmup_prefix") and
                              sched.get("lr_min") == 0.0 else f"timm {sched}")}
    out["optim.clip_norm"] = (o.clip_norm, _clip(path))
    return out


def _clip(path: Path) -> float:
    """The max norm of the `clip_grad_norm_(params, NORM)` call their Learner makes, in the
    script or in the script whose Learner it extends (0: none)."""
    text = path.read_text()
    for node in ast.walk(script_tree(path)):
        if (isinstance(node, ast.Call) and len(node.args) > 1 and "clip_grad_norm_" in (
                getattr(node.func, "id", ""), getattr(node.func, "attr", ""))):
            return float(ast.literal_eval(node.args[1]))
    bases = re.findall(r"^from (train_\w+) import Learner", text, re.MULTILINE)
    bases += re.findall(r"import_module\('(train_[\w-]+)'\)", text)
    for base in bases:
        if (path.parent / f"{base}.py").is_file():
            found = _clip(path.parent / f"{base}.py")
            if found:
                return found
    return 0.0


def _invocation(runs: list[Invocation], script: str) -> Invocation | None:
    found = [r for r in runs if r.script == script]
    return found[0] if found else None


def check_defaults(authors: Authors, runs: list[Invocation]) -> Comparison:
    """The package's defaults (Recipe()) against replication.sh's Fig. 2 line."""
    recipe = Recipe()
    script = _script(recipe)
    assert script is not None  # the default task is the reverse task
    inv = _invocation(runs, script)
    if inv is None:
        return Comparison("recipes: defaults", "package defaults", "replication.sh",
                          verdict=DISAGREE, reason=f"replication.sh runs no {script}")
    wrong, named, n = compare_recipe(recipe, inv, script_constants(authors, script, recipe))
    # A task's own options: its defaults against the line that trains it.
    for task, fields in TASK_DEFAULTS.items():
        other = Recipe.model_validate({"task": {"name": task}})
        line = _invocation(runs, _script(other) or "")
        if line is not None:
            w, d, m = compare_recipe(other, line, {}, only=fields)
            wrong, named, n = wrong + w, named + d, n + m
    return _check("recipes: defaults", f"the package's defaults (Recipe(), and the "
                  f"{', '.join(TASK_DEFAULTS)} task's own) against the {script} line of "
                  f"replication.sh (line {inv.line}) and its task's line: {n} settings", inv,
                  wrong, named)


def _check(name: str, compared: str, inv: Invocation, wrong: list[str], named: list[str]
           ) -> Comparison:
    check = Comparison(name, compared, f"replication.sh line {inv.line} ({inv.script}), its "
                       "argparse defaults and literals", unit="settings that differ",
                       error={"fp32": float(len(wrong)), "fp64": float(len(wrong))},
                       tolerance={"fp32": 0.0, "fp64": 0.0})
    if wrong:
        check.verdict = DISAGREE
        check.reason = "; ".join(sorted(set(wrong)))
    if named:
        check.difference = "; ".join(sorted(set(named)))
    return check


def check_grid(authors: Authors, runs: list[Invocation], path: Path) -> Comparison:
    grid = load_grid(path)
    wrong: list[str] = []
    named: list[str] = []
    compared, inv = 0, None
    for cell in grid.cells:
        script = _script(cell.recipe)
        if script is None:
            return Comparison(f"recipes: {grid.name}", f"{len(grid.cells)} cells",
                              "replication.sh", {"fp32": 0.0, "fp64": 0.0},
                              {"fp32": 0.0, "fp64": 0.0}, "settings that differ", AGREE,
                              difference=(
                                  "language model training: replication.sh has no line for "
                                  "it; the recipes follow the paper (§3.3), not train_lm.py's "
                                  "defaults"))
        inv = _invocation(runs, script)
        if inv is None:
            wrong.append(f"replication.sh runs no {script}")
            continue
        w, d, n = compare_recipe(cell.recipe, inv, script_constants(authors, script, cell.recipe),
                                 tuple(cell.coords))
        wrong += [f"{cell.name}: {x}" if x.startswith(("train.seed", "task.vocab_size"))
                  else x for x in w]
        named += d
        compared += n
    assert inv is not None  # a grid has cells
    return _check(f"recipes: {grid.name}", f"{len(grid.cells)} cells x their settings "
                  f"({compared} comparisons) against replication.sh", inv, wrong, named)


def check_recipes(authors: Authors, folder: Path | None = None) -> list[Comparison]:
    runs = replication(authors)
    checks = [check_defaults(authors, runs)]
    folder = folder if folder is not None else paper_folder()
    if folder is None:
        return checks + [Comparison("recipes: paper grids", "recipes/paper/*.toml",
                                    "replication.sh", verdict=NOT_RUN,
                                    reason="recipes/paper/ not found (run from the checkout): "
                                    "only the package's defaults were compared")]
    checks += [check_grid(authors, runs, path) for path in sorted(folder.glob("*.toml"))]
    return checks
