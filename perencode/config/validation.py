"""A TOML table validated by a Pydantic model, any mistake as one line naming the file, the
field and what is allowed: recipes (perencode.config.recipe), a grid's tables
(perencode.config.grid) and the paper's claims (perencode.analysis.verdicts) share it."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError
from rapidfuzz import process

from perencode.common.errors import UserError


def _model_at(model: type[BaseModel], path: list[str], data: Any = None) -> type[BaseModel] | None:
    """The Pydantic model of the table at `path` inside `model` (None if not a table); a
    kind section's is the class its tag names in `data`, the validated input."""
    found: Any = model
    for part in path:
        field = found.model_fields.get(part)
        found = field.annotation if field is not None else None
        if not (isinstance(found, type) and issubclass(found, BaseModel)):
            return None
        data = data.get(part) if isinstance(data, dict) else None
        # a kind's section (perencode.config.sections.KindConfig) picks its class by its tag
        section: Any = found
        if hasattr(section, "class_for") and isinstance(data, dict):
            try:
                found = section.class_for(section.named(data), any_kind=True)
            except ValueError:
                pass
    return found


def format_validation_error(exc: ValidationError, source: str, model: type[BaseModel],
                            table: str = "", top: str = "the top level",
                            data: Any = None) -> str:
    """One line for any of our Pydantic models (recipes, grid tables, claims): the file,
    the field and what is allowed, with "did you mean" for an unknown key.

    `model` is the validated class; `table` names it inside its file (e.g. "slurm" for a
    grid's [slurm] table) when it is not the whole file; `top` is how an unknown key's place
    is named when it is not in a table (e.g. "the claim"); `data`, the validated input,
    tells which class a kind section was validated with.
    """
    errors = exc.errors()
    # A misspelt key is both unknown and (its right spelling) missing: name the unknown one.
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = [str(p) for p in err["loc"]]
    where = ".".join(loc)
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if msg.startswith("field '"):  # a model validator naming the field it is about
        field, _, msg = msg[len("field '"):].partition("': ")
        where = ".".join([*loc, field])
    if err["type"] == "extra_forbidden":
        owner = _model_at(model, loc[:-1], data)
        allowed = list(owner.model_fields) if owner is not None else []
        guess = process.extractOne(loc[-1], allowed) if allowed else None
        hint = f"; did you mean '{guess[0]}'?" if guess and guess[1] >= 70 else ""
        inside = ".".join([table, *loc[:-1]] if table else loc[:-1])
        name = f"[{inside}]" if inside else top
        msg = f"unknown key '{loc[-1]}' in {name} (allowed: {', '.join(allowed)}){hint}"
    elif err["type"] in ("model_attributes_type", "dict_type", "model_type"):
        msg = f"must be a table, got {err.get('input')!r}"
    elif "input" in err and err["type"] != "missing" and not isinstance(err["input"], dict):
        msg = f"{msg} (got {err['input']!r})"
    if table:
        where = f"[{table}] {where}".rstrip()
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: {where or 'recipe'}: {msg}{more}"


def validate_table(model: type[BaseModel], data: Any, source: str, table: str = "",
                   top: str = "the top level", context: dict | None = None) -> Any:
    """`model.model_validate(data, context=context)`, any mistake as a one-line UserError."""
    if not isinstance(data, dict):
        name = f"[{table}]" if table else "it"
        raise UserError(f"{source}: {name} must be a table, got {data!r}")
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise UserError(format_validation_error(exc, source, model, table, top, data)) from None
