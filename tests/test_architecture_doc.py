"""docs/architecture.md true to the code: every module of a floor is named in its floor's row,
and the table of commands names every command of the CLI with files that exist (issue 57:
a newcomer who reads the page finds every file where it says)."""

from __future__ import annotations

import re

import typer.main
from conftest import ROOT

from perencode.cli import app

PACKAGE = ROOT / "perencode"
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row of `text` (header and rule rows left out)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not set(line) <= set("|-: "):
            rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def ticked(cell: str) -> set[str]:
    """The words and paths a cell writes `like this` (a trailing / left off)."""
    return {word.rstrip("/") for word in re.findall(r"`([\w/.-]+)`", cell)}


def unnamed_modules(text: str) -> list[str]:
    """Modules and packages of a floor's folder (or of the root) that the floor table's row
    for it does not name."""
    missing = []
    for row in table_rows(text):
        if len(row) != 4 or not (row[1].startswith("`") or row[1] == "root"):
            continue
        folder = row[1].strip("`").rstrip("/")
        here = PACKAGE if folder == "root" else PACKAGE / folder
        named = ticked(row[2])
        for path in sorted(here.iterdir()):
            name = path.stem if path.suffix == ".py" else path.name
            is_module = path.suffix == ".py" and name != "__init__" or \
                folder != "root" and (path / "__init__.py").is_file()  # the root's: floors
            if is_module and name not in named and path.name not in named:
                missing.append(f"{folder}/{path.name}")
    return missing


def command_table(text: str) -> dict[str, set[str]]:
    """command -> the files its row of the table of commands names."""
    found = {}
    for row in table_rows(text):
        if len(row) == 2 and row[0].startswith("`") and row[0] != "command":
            for command in re.findall(r"`([\w -]+)`", row[0]):
                found[command] = {p for p in ticked(row[1]) if p.endswith(".py") or
                                  (PACKAGE / p).is_dir()}
    return found


def cli_commands() -> set[str]:
    def walk(command, path: list[str]) -> set[str]:
        subs = getattr(command, "commands", None)
        if not subs:
            return {" ".join(path)}
        return set().union(*(walk(sub, [*path, name]) for name, sub in subs.items()))
    return walk(typer.main.get_command(app), [])


def test_every_module_of_a_floor_is_named_in_its_row():
    assert unnamed_modules(DOC) == []


def test_a_module_missing_from_its_row_is_caught():
    planted = DOC.replace("`loop`: `train`", "the loop: `train`")
    assert planted != DOC and unnamed_modules(planted) == ["training/loop.py"]
    planted = DOC.replace("`api.py` (the plugin API", "the plugin API (")
    assert planted != DOC and unnamed_modules(planted) == ["root/api.py"]


def test_the_table_of_commands_names_every_command_and_files_that_exist():
    table = command_table(DOC)
    assert set(table) == cli_commands() and len(table) == 21
    for command, paths in table.items():
        assert paths, command
        for path in paths:
            assert (PACKAGE / path).exists(), (command, path)
    assert table["train"] == {"commands/train.py", "training/loop.py"}
    assert table["tensorboard"] == {"training/tensorboard.py"}
