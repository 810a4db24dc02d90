"""A run's identity: the recipe, code and data that made it, recorded when the run is created
(RUN_DIR/identity.json) and checked by every command that reads the run.

    {"format": "perencode-identity", "version": 1, "created": "...",
     "fingerprint": "3f2a9c1b04de",        # of recipe, code and data (below)
     "recipe": {...},                       # the resolved recipe's identity (recipe.identity)
     "code": {"task": {...}, "model": {...}, "encoding": {...}},   # one record per kind used
     "data": {"field": "data", "path": "/abs/lmdata", "manifest_sha256": "..."},  # LM only
     "accepted": [{"time": ..., "command": "eval", "changes": [...]}]}

The rules (README.md, "A run is tied to what made it"):

- Recipe: RUN_DIR/recipe.toml must still hold the recorded recipe; a hand edit is refused,
  naming the field that differs from what trained.
- Code: each kind (task, model, encoding) records where it came from: perencode itself (the
  package's version and git commit, for information) or a plugin (its module, file, and
  the installed distribution and version where there is one), and a hash of its source:
  the module that registered a built-in kind; every .py file of a plugin's top-level
  package, or the plugin's one file. The hash is of the code's syntax tree, without
  docstrings: comments, docstrings and layout are no change, a new commit that leaves the
  kind's module alone is none either. Another origin or another hash is refused, naming the
  kind and what changed, unless the command is given --accept-code; the change is
  then recorded (here, by the commands that write in the run, and in eval.json).
- Data: a task that reads prepared data (TaskKind.data) records its absolute folder and the
  SHA-256 of its manifest; `eval`, a resumed `train` and `stability` refuse another.

The fingerprint hashes the recipe (less the data folder's path), the code hashes and the
data's manifest hash: two runs with one fingerprint ran the same experiment, on any
machine. A run made before this record existed has none: it is read with one note, and
shown as "unverified".
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from perencode import __version__, kinds, plugins
from perencode.console import console
from perencode.environment import git_commit, now
from perencode.errors import UserError
from perencode.io import atomic_write_json
from perencode.recipe import Recipe, differences, migrate_stored, validate

RECORD = "identity.json"
FORMAT = "perencode-identity"
VERSION = 1
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
def _file_code(path: str, stamp: float) -> bytes:
    """A source file's code: its syntax tree without docstrings (no positions), or its bytes
    when it does not parse. `stamp` (its modification time) renews the cache."""
    data = Path(path).read_bytes()
    try:
        return ast.dump(_without_docstrings(ast.parse(data))).encode()
    except (SyntaxError, ValueError):
        return data


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
    if name not in kinds.registry(section):
        return None
    plugin = plugins.origin(section, name)
    if plugin is None:
        module = kinds.MODULES.get((section, name), "perencode")
        file = getattr(sys.modules.get(module), "__file__", None)
        files = [Path(file)] if file else []
        return {"name": name, "origin": "perencode", "module": module,
                "source_sha256": source_hash(files) if files else None,
                "version": __version__, "commit": _commit()}
    files, root = _module_files(plugin.module, plugin.file)
    return {"name": name, "origin": "plugin", "module": plugin.module, "file": plugin.file,
            "package": plugin.package, "version": plugin.version,
            "source_sha256": source_hash(files, root) if files else None}


def _describe(record: dict) -> str:
    if record.get("origin") == "perencode":
        return f"perencode ({record.get('module')})"
    where = (f"{record.get('package')} {record.get('version')}" if record.get("package")
             else record.get("file"))
    return f"plugin {record.get('module')}" + (f" ({where})" if where else "")


def code_changes(recorded: dict, recipe: Recipe) -> list[str]:
    """How the code loaded now differs from `recorded` (identity.json's "code"), one phrase
    per kind; a kind no registration holds now is not compared (nothing of it runs)."""
    changes = []
    for section, field in kinds.FIELDS.items():
        then = recorded.get(section)
        name = getattr(getattr(recipe, section), kinds.TAGS[section])
        now = code_record(section, name)
        if not isinstance(then, dict) or now is None:
            continue
        what = f"{field} = {name!r}"
        if (then.get("origin"), then.get("module")) != (now["origin"], now["module"]):
            changes.append(f"{what} was {_describe(then)} when the run was made, now "
                           f"{_describe(now)}")
        elif then.get("source_sha256") != now["source_sha256"]:
            versions = ""
            if then.get("version") != now["version"]:
                versions = f", version {then.get('version')} then, {now['version']} now"
            changes.append(f"{what}: the code of {_describe(now)} changed since the run was "
                           f"made (source {str(then.get('source_sha256'))[:12]} then, "
                           f"{str(now['source_sha256'])[:12]} now{versions})")
    return changes


# --------------------------------------------------------------------------------------
# Data and recipe
# --------------------------------------------------------------------------------------

def data_record(recipe: Recipe) -> dict[str, Any] | None:
    """The prepared data the run's task reads (TaskKind.data), or None."""
    task = kinds.registry("task").get(recipe.task.name)
    if task is None or task.data is None:
        return None
    return task.data(recipe.task)


def _data_change(recorded: dict, recipe: Recipe) -> str | None:
    now = data_record(recipe)
    if now is None:
        return None
    if now["path"] != recorded.get("path"):
        return f"its data is {recorded.get('path')}, the recipe now names {now['path']}"
    if now["manifest_sha256"] is None:
        return (f"its data folder {now['path']} has no manifest.json now (moved or deleted); "
                "the run can only use the data it was made with")
    if now["manifest_sha256"] != recorded.get("manifest_sha256"):
        return (f"its data {now['path']} changed since the run was made (manifest.json "
                f"{str(recorded.get('manifest_sha256'))[:12]} then, "
                f"{now['manifest_sha256'][:12]} now: rebuilt by `perencode lm-prepare`?); "
                "train a new run on it, or rebuild the data as it was")
    return None


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


def fingerprint(recipe_identity: dict, code: dict, data: dict | None) -> str:
    """12 hex digits of the SHA-256 of the recipe (less the data folder's path), the code's
    source hashes and the data's manifest hash."""
    recipe_part = json.loads(json.dumps(recipe_identity))
    if data is not None:
        recipe_part.get("task", {}).pop(data.get("field"), None)
    whole = {"recipe": recipe_part,
             "code": {k: v.get("source_sha256") for k, v in code.items() if v},
             "data": data.get("manifest_sha256") if data else None}
    return hashlib.sha256(json.dumps(whole, sort_keys=True).encode()).hexdigest()[:12]


# --------------------------------------------------------------------------------------
# The record
# --------------------------------------------------------------------------------------

def record(run_dir: str | Path, recipe: Recipe) -> dict:
    """Write RUN_DIR/identity.json for a run being created; the record."""
    code = {section: code_record(section, getattr(getattr(recipe, section), tag))
            for section, tag in kinds.TAGS.items()}
    data = data_record(recipe)
    entry = {"format": FORMAT, "version": VERSION, "created": now(),
             "fingerprint": fingerprint(recipe.identity(), code, data),
             "recipe": recipe.identity(), "code": code, **({"data": data} if data else {}),
             "accepted": []}
    atomic_write_json(Path(run_dir) / RECORD, entry)
    return entry


def read(run_dir: str | Path) -> dict | None:
    """RUN_DIR/identity.json, or None where the run has none (made before it existed)."""
    path = Path(run_dir) / RECORD
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not readable JSON ({exc}); the run's identity is lost: "
                        "restore the file from a copy of the run") from None
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        raise UserError(f"{path}: not a perencode run identity")
    return entry


def short(run_dir: str | Path) -> str:
    """The run's fingerprint, or "unverified" for a run without the record."""
    entry = read(run_dir)
    return entry["fingerprint"] if entry else UNVERIFIED


def check(run_dir: str | Path, recipe: Recipe, command: str, *, data: bool = True,
          accept_code_change: bool = False, write: bool = True,
          note_missing: bool = True) -> list[str]:
    """Refuse (UserError, one line) a run whose recipe.toml was edited, whose data (`data`)
    changed, or whose code differs from the code loaded now, unless `accept_code_change`.
    Returns the code changes accepted (empty when none); `write` records them in
    identity.json (a command holding the run's lock). A run without the record is read
    with one note (`note_missing`)."""
    run_dir = Path(run_dir)
    entry = read(run_dir)
    if entry is None:
        if note_missing:
            console.print(f"[yellow]note:[/] {run_dir}: {MISSING}", highlight=False,
                          soft_wrap=True)
        return []
    problem = _recipe_change(entry.get("recipe", {}), recipe, run_dir)
    if problem is None and data and isinstance(entry.get("data"), dict):
        problem = _data_change(entry["data"], recipe)
        problem = f"{run_dir}: {problem}" if problem else None
    if problem is not None:
        raise UserError(problem)
    changes = code_changes(entry.get("code", {}), recipe)
    if changes and not accept_code_change:
        raise UserError(f"{run_dir}: {'; '.join(changes)}; `perencode {command} {ACCEPT}` "
                        "uses the code loaded now and records that it did")
    if changes and write:
        entry.setdefault("accepted", []).append(
            {"time": now(), "command": command, "changes": changes})
        atomic_write_json(run_dir / RECORD, entry)
    return changes


def describe(run_dir: str | Path) -> list[str]:
    """Lines for `perencode show RUN_DIR`: the fingerprint, each kind's origin, the data."""
    entry = read(run_dir)
    if entry is None:
        return [f"fingerprint: {UNVERIFIED} ({MISSING})"]
    lines = [f"fingerprint: {entry['fingerprint']} (recipe, code and data, {RECORD})"]
    for section, field in kinds.FIELDS.items():
        found = entry.get("code", {}).get(section)
        if isinstance(found, dict):
            extra = (f", perencode {found.get('version')} commit "
                     f"{str(found.get('commit'))[:10]}" if found.get("origin") == "perencode"
                     else "")
            lines.append(f"{field} = {found.get('name')!r}: {_describe(found)}, source "
                         f"{str(found.get('source_sha256'))[:12]}{extra}")
    if isinstance(entry.get("data"), dict):
        lines.append(f"data: {entry['data'].get('path')} (manifest.json "
                     f"{str(entry['data'].get('manifest_sha256'))[:12]})")
    for accepted in entry.get("accepted", []):
        lines.append(f"accepted by {accepted.get('command')} at {accepted.get('time')}: "
                     f"{'; '.join(accepted.get('changes', []))}")
    return lines
