"""The recipe's schema: a row per field for the docs and `perencode recipe-schema`, and the
JSON Schema, in which each kind section is a `oneOf` discriminated by its tag (the open
union of perencode.config.sections, closed over the kinds registered when it is generated)."""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Field, create_model

from perencode.config import registry
from perencode.config.recipe import (
    KIND_SECTIONS,
    SECTIONS,
    OptimConfig,
    Recipe,
    TrainConfig,
    kind_base,
    section_class,
)
from perencode.config.sections import KindConfig, KindNames, Section


def _type_text(ann: Any) -> str:
    """A field type as a recipe writer reads it: `int | 'all' | unset`, `[float, float]`."""
    origin, args = get_origin(ann), get_args(ann)
    if ann is type(None):
        return "unset"
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, UnionType):
        return " | ".join(_type_text(a) for a in args)
    if origin in (tuple, list):
        inner = ", ".join(_type_text(a) for a in args if a is not Ellipsis)
        return f"[{inner}{', ...' if origin is list or Ellipsis in args else ''}]"
    return getattr(ann, "__name__", None) or str(ann).replace("typing.", "")


def _type_name(field) -> str:
    return _type_text(field.annotation)


def _default_text(value: Any) -> str:
    """A default as it is written in a recipe (TOML has no None: unset)."""
    if value is None:
        return "unset"
    return repr(list(value)) if isinstance(value, tuple) else repr(value)


def model_rows(model: type[BaseModel]) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every field of a pydantic model (a claim)."""
    return [(name, _type_name(field), "required" if field.is_required() else
             _default_text(field.default), field.description or "")
            for name, field in model.model_fields.items()]


def schema_rows() -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every recipe field, for docs and the CLI: a
    kind section's own fields, then each option a registered kind adds, named with the
    kinds that have it."""
    rows = []
    for section in SECTIONS:
        model = section_class(section)
        for name, field in model.model_fields.items():
            type_name, description = _type_name(field), field.description or ""
            names = field.json_schema_extra
            if isinstance(names, KindNames):  # whatever registered them
                type_name = " | ".join(repr(n) for n in registry.names(names.kind))
                description = names.describe(description)
            rows.append((f"{section}.{name}", type_name, _default_text(field.default),
                         description))
        if issubclass(model, KindConfig):
            for name, owners in model.options().items():
                field = model.class_for(owners[0]).model_fields[name]
                where = f"{registry.FIELDS[model.KIND]} = {', '.join(owners)} only"
                rows.append((f"{section}.{name}", _type_name(field), _default_text(field.default),
                             f"({where}) {field.description or ''}".rstrip()))
    return rows


def json_schema() -> dict[str, Any]:
    """The recipe's JSON Schema: each kind section a `oneOf` discriminated by its tag, one
    member per registered kind, with that kind's own fields."""
    sections: dict[str, Any] = {}
    for section in KIND_SECTIONS:
        base = kind_base(section)
        members: list[Any] = []
        tag = base.model_fields[base.TAG]
        for name in registry.registry(base.KIND):
            only: Any = (Literal[name], Field(name, description=tag.description))
            members.append(create_model(
                f"{name.title().replace('_', '')}{base.__name__}", __base__=base.class_for(name),
                **{base.TAG: only}))
        union = Union[tuple(members)] if len(members) > 1 else members[0]  # noqa: UP007
        sections[section] = (Annotated[union, Field(discriminator=base.TAG)],
                             Field(default_factory=base.default))
    tagged = create_model("Recipe", __base__=Section, description=(str, Recipe.model_fields[
        "description"]), **sections, optim=(OptimConfig, Field(default_factory=OptimConfig)),
        train=(TrainConfig, Field(default_factory=TrainConfig)))
    return tagged.model_json_schema()
