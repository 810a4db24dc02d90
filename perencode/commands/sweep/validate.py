"""A sweep's cells validated as its workers will validate them: in a new process started
as the workers are (the same interpreter and import path), handed the same plugins
(PERENCODE_PLUGINS), from the TOML their run directories get. What passes here passes in
the workers: a kind the sweep's own process knows but its workers would not (a plugin not
handed on, a module they cannot import) is refused before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from perencode.common.console import console
from perencode.common.errors import UserError
from perencode.common.processes import perencode_command
from perencode.config import plugins
from perencode.config.recipe import tomllib, validate

# The worker side: reads {source: recipe TOML} on stdin. A console script has its own folder
# first on sys.path, not the working directory that `python -c` puts there.
_WORKER = ("import sys\n"
           "if {drop}: del sys.path[0]\n"
           "from perencode.commands.sweep.validate import validate_sources\n"
           "sys.exit(validate_sources(sys.stdin.read()))\n")


def validate_sources(text: str) -> int:
    """Validate each recipe of a JSON {source: TOML text} as `perencode train` validates
    its recipe.toml, with the plugins PERENCODE_PLUGINS names; print the first mistake and
    return 2, else 0."""
    try:
        plugins.load_installed()
        for source, toml in json.loads(text).items():
            validate(tomllib.loads(toml), source)
    except UserError as exc:
        console.print(str(exc), highlight=False, soft_wrap=True)
        return 2
    return 0


def validate_in_worker(named: dict[str, Any], handed: list[str]) -> None:
    """Validate recipes (source -> Recipe) in a worker-like process given `handed`; a
    UserError with the worker's line if one fails. Only recipes that use a plugin's kind
    need it: the package's own kinds validate the same in any process."""
    named = {source: r for source, r in named.items() if plugins.used_by(r)}
    if not named:
        return
    drop = len(perencode_command()) == 1
    env = {k: v for k, v in os.environ.items() if k != plugins.VARIABLE}
    env.update(plugins.environment(handed))
    done = subprocess.run([sys.executable, "-c", _WORKER.format(drop=drop)],
                          input=json.dumps({s: r.to_toml() for s, r in named.items()}),
                          capture_output=True, text=True, env=env)
    if done.returncode != 0:
        last = (done.stdout.strip() or done.stderr.strip() or "failed").splitlines()[-1]
        passed = f"{plugins.VARIABLE}={os.pathsep.join(handed)}" if handed else \
            f"no {plugins.VARIABLE}"
        raise UserError(f"in a worker process ({passed}): {last}")
