"""The authors' repository on the user's disk: recognising it, reading its commit, importing
its modules for the length of a crosscheck and no longer.

Their code is the user's own download (github.com/tkc-morita/position-encoded_rnn, MIT):
nothing of it is copied into this package. Its modules have generic top-level names
(`model`, `data`, `utils`), so they are imported with the folder first on `sys.path`, and
every module loaded from there is removed from `sys.modules` afterwards (a module of the
same name that was loaded before is put back).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perencode.common.errors import UserError

# The commit this crosscheck was written against (2024, the paper's code).
KNOWN_COMMIT = "3e98213"
URL = "https://github.com/tkc-morita/position-encoded_rnn"
# What a folder must hold to be taken for the authors' repository.
REQUIRED = ("code/model/rnn.py", "code/model/s4.py", "code/model/ssm.py",
            "code/model/time_encoding.py", "code/model/jacobian_analysis.py",
            "code/data/dataset.py", "code/utils/training_template.py",
            "code/train_palindrome.py", "code/train_palindrome_dual-freq.py",
            "code/train_sort.py", "code/train_delayed-sum.py",
            "code/train_predecessor_query.py", "code/train_palindrome_variable-length.py",
            "code/train_palindrome_ssm.py", "code/test_palindrome_by-DamerauLevenshtein.py",
            "code/test_sort_by-DamerauLevenshtein.py")
# The top-level names their modules take in sys.modules.
_THEIR_PACKAGES = ("model", "data", "utils")
TIMM_VERSION = "0.9.12"
TIMM_INSTALL = f"pip install timm=={TIMM_VERSION} --no-deps"
# What a "not run" names: the one-liner (timm's own dependencies are not needed, and its
# torchvision would not load beside a pinned torch), or the extra.
INSTALL_HINT = f"{TIMM_INSTALL} (or pip install 'perencode[crosscheck]')"


class NotRun(Exception):
    """A check that cannot run here (a missing optional package); the message says why."""


@dataclass(frozen=True)
class Repository:
    root: Path
    commit: str | None  # full or abbreviated hash; None: no readable .git
    note: str  # one line on the commit (empty when it is the known one)

    @property
    def code(self) -> Path:
        return self.root / "code"


def _read_commit(git: Path) -> str | None:
    """HEAD's commit from a .git folder (a detached HEAD, a loose or a packed ref)."""
    if git.is_file():  # a worktree or submodule: "gitdir: PATH"
        text = git.read_text(errors="replace").strip()
        if not text.startswith("gitdir:"):
            return None
        git = (git.parent / text.split(":", 1)[1].strip()).resolve()
    head = git / "HEAD"
    if not head.is_file():
        return None
    ref = head.read_text(errors="replace").strip()
    if not ref.startswith("ref:"):
        return ref or None
    name = ref.split(":", 1)[1].strip()
    loose = git / name
    if loose.is_file():
        return loose.read_text(errors="replace").strip() or None
    packed = git / "packed-refs"
    if packed.is_file():
        for line in packed.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1] == name:
                return parts[0]
    return None


def locate(path: str | Path) -> Repository:
    """The authors' repository at `path`, or a UserError naming what is missing."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise UserError(f"{root}: no such folder (clone {URL} and give its path)")
    if root.name == "code" and (root / "model" / "rnn.py").is_file():
        root = root.parent  # the user named the repository's code/ folder
    missing = [name for name in REQUIRED if not (root / name).is_file()]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more"
                                           if len(missing) > 3 else "")
        raise UserError(f"{root}: not the authors' repository ({URL}): missing {shown}")
    git = root / ".git"
    commit = _read_commit(git) if git.exists() else None
    if commit is None:
        note = (f"the commit could not be read (no readable .git in {root}); the folder was "
                f"identified by its files; this crosscheck was written against {KNOWN_COMMIT}")
    elif commit.startswith(KNOWN_COMMIT):
        note = ""
    else:
        note = (f"warning: {root} is at commit {commit[:12]}, this crosscheck was written "
                f"against {KNOWN_COMMIT}; a disagreement may come from their later changes")
    return Repository(root, commit, note)


def _timm_folder() -> Path | None:
    """Where timm is installed, found without importing it (None: not installed)."""
    loaded = sys.modules.get("timm")
    if loaded is not None and getattr(loaded, "__path__", None):
        return Path(list(loaded.__path__)[0])
    try:
        spec = importlib.util.find_spec("timm")
    except (ImportError, ValueError):  # a finder that refuses it: not installed for us
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def timm_version() -> str | None:
    """The installed timm's version, read without importing timm (None: not installed)."""
    base = _timm_folder()
    if base is None:
        return None
    version = base / "version.py"
    match = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", version.read_text()
                      if version.is_file() else "")
    return match.group(1) if match else "unknown"


def _drop_timm() -> None:
    """Forget every timm module (real or stand-in) loaded inside the block."""
    for name in [n for n in sys.modules if n == "timm" or n.startswith("timm.")]:
        del sys.modules[name]


def _stub_timm() -> bool:
    """Make `from timm.scheduler import CosineLRScheduler` work without timm's package
    __init__, which imports its image models and with them torchvision. The scheduler's
    own modules need only torch and numpy: they are loaded as they are, from the installed
    timm. Returns whether stubs were put in sys.modules; a timm that is missing, partial or
    broken raises NotRun naming what to install, and leaves no timm module behind (a
    half-built stub would make every later import of their scripts fail)."""
    if "timm" in sys.modules:
        return False
    try:
        importlib.import_module("timm.scheduler")
        return False  # a full timm imports: nothing to stub (unloaded with the rest)
    except Exception:  # torchvision that does not load, or a broken install: try the files
        _drop_timm()
    base = _timm_folder()
    if base is None:
        raise NotRun(f"needs timm {TIMM_VERSION} (the authors' scheduler): {INSTALL_HINT}")
    try:
        for name, folder in (("timm", base), ("timm.scheduler", base / "scheduler")):
            stub: Any = types.ModuleType(name)  # a package of the files in `folder`
            stub.__path__ = [str(folder)]
            sys.modules[name] = stub
        cosine = importlib.import_module("timm.scheduler.cosine_lr")
        scheduler: Any = sys.modules["timm.scheduler"]
        scheduler.CosineLRScheduler = cosine.CosineLRScheduler
    except Exception as exc:
        _drop_timm()
        raise NotRun(f"timm at {base} cannot load its scheduler ({type(exc).__name__}: "
                     f"{str(exc)[:80]}); reinstall: {INSTALL_HINT}") from None
    return True


class Authors:
    """The authors' modules, imported from their code/ folder while a crosscheck runs."""

    def __init__(self, repo: Repository):
        self.repo = repo

    def module(self, name: str) -> types.ModuleType:
        """One of their modules by its import name: `model.rnn`, `data.dataset`, ..."""
        return importlib.import_module(name)

    def script(self, filename: str) -> types.ModuleType:
        """One of their scripts (`train_palindrome_dual-freq.py`), loaded as a module
        without running its `__main__` block. Scripts import timm's scheduler through
        their Learner."""
        reason = _timm_ready()
        if reason:
            _placeholder_timm(reason)
        name = "_authors_" + re.sub(r"\W", "_", filename[:-3])
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, self.repo.code / filename)
        assert spec is not None and spec.loader is not None, filename  # a .py file
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    def cosine_scheduler(self):
        """timm's CosineLRScheduler, the class their Learner constructs."""
        reason = _timm_ready()
        if reason:
            raise NotRun(reason)
        return sys.modules["timm.scheduler"].CosineLRScheduler


def _timm_ready() -> str:
    """Whether timm's real CosineLRScheduler is importable (loading it if need be): "" when
    it is, else why not."""
    loaded = sys.modules.get("timm.scheduler")
    if loaded is not None:
        if getattr(loaded, "PLACEHOLDER", False):
            return str(loaded.PLACEHOLDER)
        if hasattr(loaded, "CosineLRScheduler"):
            return ""
        _drop_timm()  # a timm.scheduler without the class: not theirs
    try:
        _stub_timm()
    except NotRun as exc:
        _drop_timm()
        return str(exc)
    if hasattr(sys.modules.get("timm.scheduler"), "CosineLRScheduler"):
        return ""
    _drop_timm()
    return f"timm's scheduler has no CosineLRScheduler; reinstall: {INSTALL_HINT}"


def _placeholder_timm(reason: str) -> None:
    """Without timm, their scripts still import (their Learner module imports the scheduler
    at the top): a stand-in whose scheduler cannot be constructed. The checks that need
    the scheduler then report "not run" with `reason`; the others use their scripts' test
    methods."""

    class MissingScheduler:
        def __init__(self, *args, **kwargs):
            raise NotRun(reason)

    for name in ("timm", "timm.scheduler"):
        stub: Any = types.ModuleType(name)
        stub.__path__, stub.PLACEHOLDER = [], reason
        sys.modules[name] = stub
    scheduler: Any = sys.modules["timm.scheduler"]
    scheduler.CosineLRScheduler = MissingScheduler


def _their_modules(code: Path) -> list[str]:
    """The names in sys.modules of their modules: their packages, timm (real or stand-in),
    and any module whose file lies in their code/ folder (symbolic links followed)."""
    root = os.path.join(os.path.realpath(code), "")
    # a module's folder -> inside code/ (a few hundred folders hold the thousands of modules
    # torch imports: each is resolved once)
    folders: dict[str, bool] = {}
    found = []

    def inside(file: str) -> bool:
        folder = os.path.dirname(file)
        if folder not in folders:
            folders[folder] = os.path.join(os.path.realpath(folder), "").startswith(root)
        if os.path.islink(file):
            return os.path.realpath(file).startswith(root)
        return folders[folder]

    for name, module in list(sys.modules.items()):
        top = name.split(".")[0]
        file = getattr(module, "__file__", None) or ""
        if top in _THEIR_PACKAGES or top == "timm" or name.startswith("_authors_") \
                or (isinstance(file, str) and file and inside(file)):
            found.append(name)
    return found


@contextmanager
def authors_code(repo: Repository) -> Iterator[Authors]:
    """Their code/ folder first on sys.path, and their modules importable, inside the block;
    afterwards sys.path and sys.modules are as they were."""
    code = str(repo.code)
    saved = {n: sys.modules[n] for n in _their_modules(repo.code)}
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, code)
    try:
        yield Authors(repo)
    finally:
        if code in sys.path:
            sys.path.remove(code)
        for name in _their_modules(repo.code):
            del sys.modules[name]
        sys.modules.update(saved)
