"""Plugins: tasks, models and encodings (perencode.config.registry) from outside the package, in
every perencode process (docs/extending.md).

Three routes bring kinds in:

- an installed package declaring an entry point in the group `perencode.kinds`: loaded by
  every process when a registry is first used (`kinds.registry`), unless
  PERENCODE_DISABLE_PLUGIN_AUTOLOAD is set (`kinds.autoload`);
- a loose module or file: `perencode --plugin FILE_OR_MODULE` (repeatable) or the variable
  PERENCODE_PLUGINS (paths or module names separated by os.pathsep), or `load(...)` in a
  script;
- a `register_*` call in the running process (a notebook, a test).

Every kind remembers where it came from (`origin`). A sweep hands its workers and SLURM jobs
the plugins of this process (`handed_on`: PERENCODE_PLUGINS with absolute paths) and checks
its cells in a process started as its workers are (perencode.commands.sweep.validate). A run records
the plugins its kinds came from (`entries`) in RUN_DIR/plugins.json, which only the store
writes and reads (perencode.store.runs): a later command that lacks one says which and how
to load it, and never executes a file because a run names it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import io
import os
import sys
from collections.abc import Mapping
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from perencode.common.errors import UserError
from perencode.config import registry as kinds

GROUP = "perencode.kinds"
VARIABLE = "PERENCODE_PLUGINS"


@dataclass(frozen=True)
class Plugin:
    """Where kinds came from: a module (its file), and the installed package and entry point
    it was loaded through, where it was."""

    module: str
    file: str | None = None
    package: str | None = None
    version: str | None = None
    entry_point: str | None = None

    @property
    def spec(self) -> str:
        """What `--plugin` takes to load it again: its file, unless it is part of a package
        (a dotted name, a package's __init__.py), which is imported by its module name so
        that its relative imports work."""
        packaged = "." in self.module or (self.file or "").endswith("__init__.py")
        return self.module if packaged or not self.file else self.file

    def describe(self) -> str:
        """'my_pe (/home/me/my_pe.py)', 'perencode_minrnn (perencode-minrnn 0.1.0)'."""
        where = f"{self.package} {self.version}" if self.package else self.file
        return f"{self.module} ({where})" if where else self.module

    def how_to_load(self) -> str:
        """One phrase telling a user how to bring it into a command."""
        if self.entry_point:
            return (f"install the package {self.package} {self.version} (its "
                    f"{GROUP} entry point '{self.entry_point}' loads it by itself)")
        return f"pass it: perencode --plugin {self.spec} COMMAND ... (or {VARIABLE}={self.spec})"


# Loose plugins loaded in this process, by spec, in loading order. Where each kind came
# from is kinds.ORIGINS (a Plugin while one loads: kinds.LOADING).
_LOADED: dict[str, Plugin] = {}


def _stamp(folder: str) -> int | None:
    try:
        return os.stat(folder or ".").st_mtime_ns
    except OSError:
        return None


@functools.lru_cache(maxsize=4)
def _packages(path: tuple[tuple[str, int | None], ...]) -> Mapping[str, list[str]]:
    """Top-level package -> the installed distributions that provide it, read once for
    `path` (sys.path, each folder with its modification time: an install into one of them
    is read again). Reading every distribution's metadata takes a tenth of a second, and a
    run's identity asks for each kind it names."""
    return metadata.packages_distributions()


def _distribution(module: str) -> tuple[str | None, str | None]:
    """(package, version) of the installed distribution providing `module`'s top-level
    package, or (None, None) (a loose file, a checkout on sys.path)."""
    top = module.partition(".")[0]
    for name in _packages(tuple((entry, _stamp(entry)) for entry in sys.path)).get(top, []):
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None, None


def _file_of(module: ModuleType | None) -> str | None:
    path = getattr(module, "__file__", None)
    return str(Path(path).resolve()) if path else None


def origin(registry: str, name: str) -> Plugin | None:
    """The plugin a registered kind came from; None for the package's own. A kind that a
    module registered in this process (a notebook, a test) is described by that module."""
    found = kinds.ORIGINS.get((registry, name))
    if found is None or isinstance(found, Plugin):
        return found
    module, file = found
    package, version = _distribution(module) if module != "__main__" else (None, None)
    return Plugin(module, str(Path(file).resolve()) if file else None, package, version)


class _EndedAtImport(Exception):
    """A plugin's import tried to end the process (sys.exit, argparse reading perencode's
    command line)."""


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, _EndedAtImport):
        return str(exc)
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}".rstrip(": ")


def _importing(plugin: Plugin, run) -> Any:
    """Run a plugin's import (or its entry point's function). What it prints is held back
    and shown once it has succeeded; a sys.exit() in it, or an argument parser reading
    perencode's command line, becomes _EndedAtImport, so that the command stops with one
    line naming the plugin instead of ending quietly (exit 0) or blaming perencode's usage."""
    kinds.LOADING.append(plugin)
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            result = run()
    except SystemExit as exc:
        said = [line.strip() for line in (err.getvalue() + out.getvalue()).splitlines()
                if line.strip()]
        if any(line.startswith("usage:") for line in said):
            complaint = said[-1].partition("error: ")[2] or said[-1]
            if len(complaint) > 80:
                complaint = complaint[:77] + "..."
            raise _EndedAtImport(f"it parses the command line when imported (argparse: "
                                 f"{complaint}); a plugin only defines and registers "
                                 "kinds") from None
        raise _EndedAtImport(f"it called sys.exit({exc.code!r}) when imported; a plugin only "
                             "defines and registers kinds") from None
    finally:
        kinds.LOADING.pop()
    sys.stdout.write(out.getvalue())
    sys.stderr.write(err.getvalue())
    return result


def _replace(old: Plugin, new: Plugin) -> None:
    """Once loaded, a plugin is known better (its file): its kinds' origins say so."""
    for key, found in list(kinds.ORIGINS.items()):
        if found == old:
            kinds.ORIGINS[key] = new


def load_entry_points() -> list[Plugin]:
    """Import every installed `perencode.kinds` entry point (an entry point naming a
    function calls it after the import); a failing one is a UserError naming it. None
    where PERENCODE_DISABLE_PLUGIN_AUTOLOAD is set."""
    loaded: list[Plugin] = []
    seen = set()
    if not kinds.autoload():
        return loaded
    for ep in metadata.entry_points(group=GROUP):
        if ep.name in seen:  # a package on sys.path twice (an editable install) lists it twice
            continue
        seen.add(ep.name)
        dist = getattr(ep, "dist", None)
        plugin = Plugin(ep.module, None, dist.name if dist else None,
                        dist.version if dist else None, ep.name)
        try:
            target = _importing(plugin, ep.load)
            if callable(target) and not isinstance(target, ModuleType):
                _importing(plugin, target)
        except Exception as exc:  # noqa: BLE001 - any failure of foreign code is one line
            raise UserError(f"plugin '{ep.name}' ({GROUP} entry point {ep.value} of "
                            f"{plugin.package or 'an installed package'}): cannot be loaded: "
                            f"{_one_line(exc)}") from None
        found = Plugin(plugin.module, _file_of(sys.modules.get(plugin.module)),
                       plugin.package, plugin.version, plugin.entry_point)
        _replace(plugin, found)
        loaded.append(found)
    return loaded


def load_installed() -> None:
    """What every process loads when a registry is first used (kinds.registry): the
    installed plugins, then those PERENCODE_PLUGINS names."""
    load_entry_points()
    from_environment()


def _is_file(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or "/" in spec or Path(spec).is_file()


def _module_name(path: Path) -> str:
    """The file's stem, unless another module holds that name (then stem_<hash>)."""
    taken = sys.modules.get(path.stem)
    if taken is None or _file_of(taken) == str(path):
        return path.stem
    return f"{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"


def load(spec: str) -> Plugin:
    """Import a loose plugin: a Python file (a path) or an importable module name. Loading
    it again does nothing. A missing one, or one whose import fails, is a UserError."""
    spec = spec.strip()
    if not spec:
        raise UserError(f"--plugin / {VARIABLE}: an empty plugin name")
    kinds.registry("task")  # the package's own kinds and installed plugins first
    if _is_file(spec):
        path = Path(spec).expanduser().resolve()
        key = str(path)
        if key in _LOADED:
            return _LOADED[key]
        if not path.is_file():
            raise UserError(f"plugin {spec}: no such file")
        name = _module_name(path)
        plugin = Plugin(name, key)
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:  # a suffix Python cannot import
            raise UserError(f"plugin {spec}: not a Python source file (.py)")
        loader = module_spec.loader
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        try:
            _importing(plugin, lambda: loader.exec_module(module))
        except Exception as exc:  # noqa: BLE001
            del sys.modules[name]
            raise UserError(f"plugin {spec}: importing it failed: {_one_line(exc)}") from None
    else:
        key = spec
        if key in _LOADED:
            return _LOADED[key]
        plugin = Plugin(spec, None, *_distribution(spec))
        try:
            module = _importing(plugin, lambda: importlib.import_module(spec))
        except ModuleNotFoundError as exc:
            if exc.name and spec.startswith(exc.name):
                raise UserError(f"plugin {spec}: no module of that name is importable (a "
                                f"file: give its path, e.g. ./{spec}.py)") from None
            raise UserError(f"plugin {spec}: importing it failed: {_one_line(exc)}") from None
        except Exception as exc:  # noqa: BLE001
            raise UserError(f"plugin {spec}: importing it failed: {_one_line(exc)}") from None
        found = Plugin(spec, _file_of(module), plugin.package, plugin.version)
        _replace(plugin, found)
        plugin = found
    _LOADED[key] = plugin
    return plugin


def from_environment() -> list[Plugin]:
    """Load the plugins PERENCODE_PLUGINS names (os.pathsep-separated)."""
    value = os.environ.get(VARIABLE, "")
    return [load(spec) for spec in value.split(os.pathsep) if spec.strip()]


def activate(specs: list[str]) -> None:
    """The CLI's start: load the plugins (installed ones, PERENCODE_PLUGINS, then `specs`)
    now, so that a failing one stops the command before it begins."""
    kinds.registry("task")
    for spec in specs:
        load(spec)


def loaded() -> list[Plugin]:
    """The loose plugins this process loaded, in order."""
    return list(_LOADED.values())


def records() -> list[dict]:
    """Every plugin whose kinds this process holds, as JSON-ready dicts (env.json)."""
    live = [origin(section, name) for section, name in kinds.ORIGINS
            if name in kinds.REGISTRIES[section]]
    found = {p: None for p in [*live, *_LOADED.values()] if p is not None}
    return [asdict(p) for p in found]


def used_by(recipe) -> dict[Plugin, list[str]]:
    """The plugins a recipe's kinds come from, each with the fields it provides
    ("encoding.kind = 'lin_ramp'")."""
    out: dict[Plugin, list[str]] = {}
    for section, tag in kinds.TAGS.items():
        name = getattr(getattr(recipe, section), tag)
        plugin = origin(section, name)
        if plugin is not None:
            out.setdefault(plugin, []).append(f"{section}.{tag} = {name!r}")
    return out


def entries(recipe) -> list[dict[str, Any]]:
    """The plugins a recipe's kinds come from (none: the package's own), each with the
    fields it provides and their kinds' labels ({"encoding": {"lin_ramp": "Linear ramp"}}):
    what perencode.store.runs records in RUN_DIR/plugins.json (records.PluginsRecord), for
    a later process that lacks the plugin (the labels name its kinds in figures)."""
    found = []
    for plugin, fields in used_by(recipe).items():
        labels: dict[str, dict[str, str]] = {}
        for section, tag in kinds.TAGS.items():
            name = getattr(getattr(recipe, section), tag)
            if origin(section, name) == plugin:
                labels.setdefault(section, {})[name] = kinds.registry(section)[name].label
        found.append({**asdict(plugin), "provides": fields, "labels": labels})
    return found


def handed_on(recipes=()) -> list[str]:
    """What a sweep's workers get in PERENCODE_PLUGINS: every loose plugin of this process
    (absolute paths, module names), and the module of each kind the recipes use that was
    registered in this process. Installed plugins load in the workers by themselves."""
    specs = list(_LOADED)  # as they were given: absolute paths, module names
    for recipe in recipes:
        for plugin, fields in used_by(recipe).items():
            if plugin.entry_point or plugin.spec in specs:
                continue
            if plugin.module == "__main__" or not plugin.file:
                raise UserError(f"{fields[0]} is registered by {plugin.module} itself, which "
                                "a worker cannot import; move the registration into a file "
                                "and pass it with perencode --plugin FILE")
            specs.append(plugin.spec)
    return specs


def environment(specs: list[str]) -> dict[str, str]:
    """The variables a worker needs to see `specs` (empty: none)."""
    return {VARIABLE: os.pathsep.join(specs)} if specs else {}
