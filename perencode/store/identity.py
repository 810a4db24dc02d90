"""A run's identity: the recipe, code and data that made it, recorded when the run is created
(RUN_DIR/identity.json) and checked by every command that reads the run.

    {"format": "perencode-identity", "version": 2, "created": "...",
     "fingerprint": "3f2a9c1b04de",        # of recipe, code and data (below)
     "recipe": {...},                       # the resolved recipe's identity (recipe.identity)
     "code": {"task": {...}, "model": {...}, "encoding": {...}},   # one record per kind used
     "modules": {"perencode.training.session": "...", ...},  # the perencode code of its path
     "data": {"field": "data", "path": "/abs/lmdata", "manifest_sha256": "...",
              "content_sha256": "..."},    # LM only
     "accepted": [{"time": ..., "command": "eval", "changes": [...]}]}

The rules (README.md, "A run is tied to what made it"):

- Recipe: RUN_DIR/recipe.toml must still hold the recorded recipe; a hand edit is refused,
  naming the field that differs from what trained.
- Code: the run's package code is every perencode module of its training and scoring path
  (ROOTS, `perencode.training.loop`, `perencode.commands.evaluate` and `.stability`, and
  every perencode module they or its plugin kinds import, directly or not:
  `modules_record`), each with a hash of its
  source. Each kind (task, model, encoding) also records where it came from: perencode
  itself (the package's version and git commit, for information) or a plugin (its module,
  file, and the installed distribution and version where there is one, and a hash of every
  .py file of its top-level package, or of its one file). A hash is of the code's syntax
  tree, without docstrings: comments, docstrings and layout are no change, a new commit
  that leaves those modules alone is none either. `eval`, a resumed `train` and `stability`
  refuse another origin or another hash, naming the kind or the modules that changed,
  unless given --accept-code; the change is then recorded (here, and in eval.json).
  `figures`, `verify` and `report` read recorded numbers: they compare the runs' code with
  each other, not with the code loaded now, and mark a cell whose runs' code differs
  (`code_digest`). A record of version 1 has no `modules`: only its kinds' modules are
  compared.
- Data: a task that reads prepared data (TaskKind.data) records its absolute folder and a
  hash of its content (for the language model: the tokenizer model and the token files, as
  their manifest lists them, and the sizes they were prepared with; not the manifest's
  times and logs, so a byte-identical rebuild is the same data); `eval`, a resumed `train`
  and `stability` refuse another folder, and other content unless given --accept-data.

The fingerprint hashes the recipe (less the data folder's path), the code hashes and the
data's content hash: two runs with one fingerprint ran the same experiment with the same
code, on any machine. A run made before this record existed has none: it is read with one
note, and shown as "unverified".
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from perencode import __version__
from perencode.common.console import console
from perencode.common.errors import UserError
from perencode.common.files import atomic_write_json
from perencode.config import plugins, registry
from perencode.config.recipe import Recipe, differences, migrate_stored, validate
from perencode.store.environment import git_commit
from perencode.store.records import IdentityRecord, now, read_identity

RECORD = "identity.json"  # perencode.store.records.IdentityRecord
UNVERIFIED = "unverified"
ACCEPT = "--accept-code"
MISSING = (f"no {RECORD} (made before perencode recorded a run's recipe, code and data): "
           "they are not checked")


# --------------------------------------------------------------------------------------
# Code
# --------------------------------------------------------------------------------------

DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if not isinstance(node, DOCUMENTED) or not node.body:
            continue
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                and isinstance(first.value.value, str):
            node.body = node.body[1:] or [ast.Pass()]
    return tree


@functools.cache
def _tree(path: str, stamp: float) -> ast.Module | None:
    """A source file's syntax tree, parsed once (for its code and its imports), or None
    when it does not parse. `stamp` (its modification time) renews the cache."""
    try:
        return ast.parse(Path(path).read_bytes())
    except (SyntaxError, ValueError):
        return None


@functools.cache
def _file_code(path: str, stamp: float) -> bytes:
    """A source file's code: its syntax tree without docstrings (no positions), or its bytes
    when it does not parse. Cached: the shared tree loses its docstrings once."""
    tree = _tree(path, stamp)
    if tree is None:
        return Path(path).read_bytes()
    return ast.dump(_without_docstrings(tree)).encode()


def source_hash(files: list[Path], root: Path | None = None) -> str:
    """SHA-256 of the code of `files` (named relative to `root`), in name order."""
    digest = hashlib.sha256()
    for path in sorted(files):
        name = str(path.relative_to(root)) if root else path.name
        digest.update(name.encode() + b"\0" + _file_code(str(path), path.stat().st_mtime) + b"\0")
    return digest.hexdigest()


def _module_files(module: str, file: str | None) -> tuple[list[Path], Path | None]:
    """The files whose code a plugin module's kinds depend on: every .py file of its
    top-level package, or its one file."""
    top = sys.modules.get(module.partition(".")[0])
    top_file = getattr(top, "__file__", None) if top is not None else None
    if top_file and Path(top_file).name == "__init__.py":
        root = Path(top_file).resolve().parent
        return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts), root
    return ([Path(file)] if file and Path(file).is_file() else []), None


@functools.lru_cache(maxsize=1)
def _commit() -> str | None:
    return git_commit()


def code_record(section: str, name: str) -> dict[str, Any] | None:
    """Where the code of a registered kind comes from now, with its source hash; None for
    a name no registration holds."""
    if name not in registry.registry(section):
        return None
    plugin = plugins.origin(section, name)
    if plugin is None:
        module = registry.MODULES.get((section, name), "perencode")
        file = getattr(sys.modules.get(module), "__file__", None)
        files = [Path(file)] if file else []
        return {"name": name, "origin": "perencode", "module": module,
                "source_sha256": source_hash(files) if files else None,
                "version": __version__, "commit": _commit()}
    files, root = _module_files(plugin.module, plugin.file)
    return {"name": name, "origin": "plugin", "module": plugin.module, "file": plugin.file,
            "package": plugin.package, "version": plugin.version,
            "source_sha256": source_hash(files, root) if files else None}


# The training and scoring path: the modules a run's numbers come from (its training loop,
# its final and later evaluations, its gradient stability). Their import closure within
# perencode, with the perencode modules a plugin kind of the run imports, is the run's
# package code (`modules`): an edit to any of them (models/base.py, session.py, the task
# base class, ...) is a change of the run's code, as an edit to a kind's own module is.
PACKAGE = Path(__file__).resolve().parents[1]
ROOTS = ("perencode.training.loop", "perencode.commands.evaluate", "perencode.commands.stability")
# On the path but no source of its numbers: planning's estimates and the memory check only
# let a run start or refuse it, so an edit to the GPU table or the memory model is no change
# of a run's code (what planning imports is reached through the loop anyway).
ESTIMATES_ONLY = frozenset({"perencode.training.planning"})


def _package_file(module: str) -> Path | None:
    """The source file of a perencode module (a package's __init__.py), or None."""
    base = PACKAGE.joinpath(*module.split(".")[1:])
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


@functools.cache
def _imports(path: str, stamp: float, module: str | None) -> frozenset[str]:
    """The perencode modules a source file imports (anywhere in it, and the packages above
    them, whose __init__ runs first); `module` names the file, for its relative imports."""
    tree = _tree(path, stamp)
    if tree is None:
        return frozenset()
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level and module:
                here = module.split(".") if path.endswith("__init__.py") else \
                    module.split(".")[:-1]
                here = here[:len(here) - node.level + 1]
                target = ".".join([*here, *([target] if target else [])])
            # `from perencode import runs` imports the module perencode.store.runs
            targets = [target, *(f"{target}.{alias.name}" for alias in node.names)]
        for target in targets:
            parts = target.split(".")
            if parts[0] == "perencode":
                found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return frozenset(found)


# (PACKAGE, roots) -> the closure found and the modification time of each of its files
_CLOSURES: dict[tuple[Path, tuple[str, ...]], tuple[dict[str, Path], dict[Path, float]]] = {}


def _stamp(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _closure(roots: tuple[str, ...]) -> dict[str, Path]:
    """perencode module -> source file: `roots` and every perencode module they import,
    directly or not. Found once per process and package folder, and found again when a file
    of it was edited or removed since (an edit is what makes a module import another)."""
    cached = _CLOSURES.get((PACKAGE, roots))
    if cached is not None and all(_stamp(path) == stamp for path, stamp in cached[1].items()):
        return dict(cached[0])
    found: dict[str, Path] = {}
    stamps: dict[Path, float] = {}
    todo = list(roots)
    while todo:
        module = todo.pop()
        path = None if module in found or module in ESTIMATES_ONLY else _package_file(module)
        if path is None:
            continue
        found[module] = path
        stamps[path] = path.stat().st_mtime
        todo.extend(_imports(str(path), stamps[path], module))
    _CLOSURES[(PACKAGE, roots)] = (dict(found), stamps)
    return found


@functools.cache
def _code_sha256(path: str, stamp: float) -> str:
    return hashlib.sha256(_file_code(path, stamp)).hexdigest()


def modules_record(recipe: Recipe) -> dict[str, str]:
    """perencode module -> the SHA-256 of its code (syntax tree, as `source_hash`), for
    every module of the run's training and scoring path (ROOTS' import closure, with the
    perencode modules its plugin kinds import)."""
    roots = set(ROOTS)
    for section, tag in registry.TAGS.items():
        plugin = plugins.origin(section, getattr(getattr(recipe, section), tag))
        if plugin is not None:
            files, root = _module_files(plugin.module, plugin.file)
            for path in files:
                roots |= _imports(str(path), path.stat().st_mtime, None)
    return {module: _code_sha256(str(path), path.stat().st_mtime)
            for module, path in sorted(_closure(tuple(sorted(roots))).items())}


def plugin_files(recipe: Recipe) -> dict[str, str]:
    """Source file -> the plugin module it belongs to, for the recipe's plugin kinds (to
    name the plugin when its code raises)."""
    found = {}
    for section, tag in registry.TAGS.items():
        plugin = plugins.origin(section, getattr(getattr(recipe, section), tag))
        if plugin is not None:
            files, _ = _module_files(plugin.module, plugin.file)
            found.update({str(path.resolve()): plugin.module for path in files})
    return found


def _describe(record: dict) -> str:
    if record.get("origin") == "perencode":
        return f"perencode ({record.get('module')})"
    where = (f"{record.get('package')} {record.get('version')}" if record.get("package")
             else record.get("file"))
    return f"plugin {record.get('module')}" + (f" ({where})" if where else "")


def _modules_change(then: dict, now: dict[str, str], entry: IdentityRecord) -> str | None:
    """One phrase naming the perencode modules of the run's path whose code differs."""
    changed = sorted(m for m in set(then) | set(now) if then.get(m) != now.get(m))
    if not changed:
        return None
    made = next((c for c in entry.code.values()
                 if isinstance(c, dict) and c.get("origin") == "perencode"), {})
    versions = ""
    if made.get("version") != __version__ or made.get("commit") != _commit():
        versions = (f"; perencode {made.get('version')} commit {str(made.get('commit'))[:10]}"
                    f" then, {__version__} commit {str(_commit())[:10]} now")
    shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6
                                      else "")
    return (f"the code of perencode module{'s' if len(changed) > 1 else ''} {shown} changed "
            f"since the run was made{versions}")


def code_changes(entry: IdentityRecord, recipe: Recipe) -> list[str]:
    """How the code loaded now differs from what identity.json `entry` recorded, one
    phrase per kind and one naming the perencode modules of the run's path that changed
    (`modules_record`; a record made before it lists none, and only its kinds' modules are
    compared); a kind no registration holds now is not compared (nothing of it runs)."""
    recorded = entry.code
    then_modules = entry.modules
    changes = []
    for section, field in registry.FIELDS.items():
        then = recorded.get(section)
        name = getattr(getattr(recipe, section), registry.TAGS[section])
        now = code_record(section, name)
        if not isinstance(then, dict) or now is None:
            continue
        what = f"{field} = {name!r}"
        if (then.get("origin"), then.get("module")) != (now["origin"], now["module"]):
            changes.append(f"{what} was {_describe(then)} when the run was made, now "
                           f"{_describe(now)}")
        elif then.get("source_sha256") != now["source_sha256"] and not (
                isinstance(then_modules, dict) and now["origin"] == "perencode"):
            # (a package kind's module is among `modules`: named there)
            versions = ""
            if then.get("version") != now["version"]:
                versions = f", version {then.get('version')} then, {now['version']} now"
            changes.append(f"{what}: the code of {_describe(now)} changed since the run was "
                           f"made (source {str(then.get('source_sha256'))[:12]} then, "
                           f"{str(now['source_sha256'])[:12]} now{versions})")
    if isinstance(then_modules, dict):
        change = _modules_change(then_modules, modules_record(recipe), entry)
        if change:
            changes.append(change)
    return changes


def code_digest(entry: IdentityRecord | None) -> str:
    """12 hex digits naming the code a run's numbers came from: the code it was made with
    and the code changes accepted since (`accepted`); "unverified" without a record."""
    if entry is None:
        return UNVERIFIED
    whole = {"code": {k: v.get("source_sha256") for k, v in entry.code.items()
                      if isinstance(v, dict)},
             "modules": entry.modules,
             "accepted": [a.get("changes") for a in entry.accepted
                          if a.get("kind", "code") == "code"]}
    return hashlib.sha256(json.dumps(whole, sort_keys=True).encode()).hexdigest()[:12]


# --------------------------------------------------------------------------------------
# Data and recipe
# --------------------------------------------------------------------------------------

def data_record(recipe: Recipe) -> dict[str, Any] | None:
    """The prepared data the run's task reads (TaskKind.data), or None."""
    task = registry.registry("task").get(recipe.task.name)
    if task is None or task.data is None:
        return None
    return task.data(recipe.task)


ACCEPT_DATA = "--accept-data"


def _data_hash(record: dict) -> tuple[str, str | None]:
    """What names a data record's content: ("content", the hash of what training reads)
    where it has one, else ("manifest.json", its whole manifest's hash: a record made before
    content hashes, or a task whose data names no content)."""
    if record.get("content_sha256"):
        return "content", record["content_sha256"]
    return "manifest.json", record.get("manifest_sha256")


def _data_change(recorded: dict, recipe: Recipe) -> tuple[str | None, bool]:
    """How the data the recipe names now differs from `recorded`, and whether the
    difference is one of content only (`--accept-data` may accept it)."""
    now = data_record(recipe)
    if now is None:
        return None, False
    if now["path"] != recorded.get("path"):
        return f"its data is {recorded.get('path')}, the recipe now names {now['path']}", False
    if now["manifest_sha256"] is None:
        return (f"its data folder {now['path']} has no manifest.json now (moved or deleted); "
                "the run can only use the data it was made with"), False
    what, then = _data_hash(recorded)
    current = now.get("content_sha256") if what == "content" else now["manifest_sha256"]
    if current != then:
        return (f"its data {now['path']} changed since the run was made ({what} "
                f"{str(then)[:12]} then, {str(current)[:12]} now: rebuilt from other text "
                "by `perencode lm-prepare`?); train a new run on it, or rebuild the data as it "
                "was"), True
    return None, False


def _recipe_change(recorded: dict, recipe: Recipe, run_dir: Path) -> str | None:
    try:
        then = validate(migrate_stored(recorded), str(run_dir / RECORD), any_kind=True).identity()
    except UserError:
        then = recorded
    diff = differences(then, recipe.identity(), names=("when the run was made", "now"))
    if not diff:
        return None
    return (f"{run_dir / 'recipe.toml'} was edited after the run was made ({diff[0]}"
            f"{'; ...' if len(diff) > 1 else ''}); restore it, or train the edited recipe "
            "into a new run directory")


def fingerprint(recipe_identity: dict, code: dict, data: dict | None,
                modules: dict | None = None) -> str:
    """12 hex digits of the SHA-256 of the recipe (less the data folder's path), the code's
    source hashes (its kinds', and its path's perencode `modules`) and the data's content
    hash."""
    recipe_part = json.loads(json.dumps(recipe_identity))
    if data is not None:
        recipe_part.get("task", {}).pop(data.get("field"), None)
    whole = {"recipe": recipe_part,
             "code": {k: v.get("source_sha256") for k, v in code.items() if v},
             "data": _data_hash(data)[1] if data else None,
             **({"modules": modules} if modules is not None else {})}
    return hashlib.sha256(json.dumps(whole, sort_keys=True).encode()).hexdigest()[:12]


# --------------------------------------------------------------------------------------
# The record
# --------------------------------------------------------------------------------------

def record(run_dir: str | Path, recipe: Recipe) -> IdentityRecord:
    """Write RUN_DIR/identity.json for a run being created; the record."""
    code = {section: code_record(section, getattr(getattr(recipe, section), tag))
            for section, tag in registry.TAGS.items()}
    data = data_record(recipe)
    modules = modules_record(recipe)
    entry = IdentityRecord(created=now(),
                           fingerprint=fingerprint(recipe.identity(), code, data, modules),
                           recipe=recipe.identity(), code=code, modules=modules,
                           data=data or None)
    atomic_write_json(Path(run_dir) / RECORD, entry.as_dict())
    return entry


def read(run_dir: str | Path) -> IdentityRecord | None:
    """RUN_DIR/identity.json (as the current record: perencode.store.records.migrate_identity), or
    None where the run has none (made before it existed)."""
    path = Path(run_dir) / RECORD
    if not path.is_file():
        return None
    return read_identity(path)


def short(run_dir: str | Path) -> str:
    """The run's fingerprint, or "unverified" for a run without the record."""
    entry = read(run_dir)
    return entry.fingerprint if entry else UNVERIFIED


def check(run_dir: str | Path, recipe: Recipe, command: str, *, data: bool = True,
          accept_code_change: bool = False, write: bool = True,
          note_missing: bool = True, accept_data_change: bool = False,
          code: bool = True) -> list[str]:
    """Refuse (UserError, one line) a run whose recipe.toml was edited, whose data (`data`)
    changed (unless `accept_data_change`, for a change of content), or whose code (`code`)
    differs from the code loaded now (unless `accept_code_change`). Returns the changes accepted
    (empty when none); `write` records them in identity.json (a command holding the run's
    lock). A run without the record is read with one note (`note_missing`)."""
    run_dir = Path(run_dir)
    entry = read(run_dir)
    if entry is None:
        if note_missing:
            console.print(f"[yellow]note:[/] {run_dir}: {MISSING}", highlight=False,
                          soft_wrap=True)
        return []
    problem = _recipe_change(entry.recipe, recipe, run_dir)
    if problem is not None:
        raise UserError(problem)
    accepted: list[tuple[str, list[str]]] = []
    if data and entry.data is not None:
        change, acceptable = _data_change(entry.data, recipe)
        if change is not None and not (acceptable and accept_data_change):
            raise UserError(f"{run_dir}: {change}" + (
                f"; `perencode {command} {ACCEPT_DATA}` uses the data there now and records "
                "that it did" if acceptable else ""))
        if change is not None:
            accepted.append(("data", [change.partition("; ")[0]]))
    changes = code_changes(entry, recipe) if code else []
    if changes and not accept_code_change:
        raise UserError(f"{run_dir}: {'; '.join(changes)}; `perencode {command} {ACCEPT}` "
                        "uses the code loaded now and records that it did")
    if changes:
        accepted.append(("code", changes))
    if accepted and write:
        for kind, what in accepted:
            entry.accepted.append(
                {"time": now(), "command": command, "kind": kind, "changes": what})
        atomic_write_json(run_dir / RECORD, entry.as_dict())
    return [change for _, what in accepted for change in what]


def describe(run_dir: str | Path) -> list[str]:
    """Lines for `perencode show RUN_DIR`: the fingerprint, each kind's origin, the data."""
    entry = read(run_dir)
    if entry is None:
        return [f"fingerprint: {UNVERIFIED} ({MISSING})"]
    lines = [f"fingerprint: {entry.fingerprint} (recipe, code and data, {RECORD})"]
    for section, field in registry.FIELDS.items():
        found = entry.code.get(section)
        if isinstance(found, dict):
            extra = (f", perencode {found.get('version')} commit "
                     f"{str(found.get('commit'))[:10]}" if found.get("origin") == "perencode"
                     else "")
            lines.append(f"{field} = {found.get('name')!r}: {_describe(found)}, source "
                         f"{str(found.get('source_sha256'))[:12]}{extra}")
    if entry.data is not None:
        what, digest = _data_hash(entry.data)
        lines.append(f"data: {entry.data.get('path')} ({what} {str(digest)[:12]})")
    for accepted in entry.accepted:
        lines.append(f"accepted by {accepted.get('command')} at {accepted.get('time')}: "
                     f"{'; '.join(accepted.get('changes', []))}")
    return lines
