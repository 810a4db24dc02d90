"""The open tagged union of a recipe's kind sections: `[task]`, `[model]` and `[encoding]`
each name a registered kind in a tag field (`task.name`, `model.arch`, `encoding.kind`), and
are validated by the config class that kind's registration (perencode.config.registry) names.

`Section` is the strict base of every recipe table; `KindConfig` the base of a kind
section; `KindNames` marks a tag field for the schema. The sections themselves are
perencode.config.recipe.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, TypeVar, cast, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

from perencode.config import registry

_K = TypeVar("_K", bound="KindConfig")


def _number_text(value: Any) -> bool:
    """A string Pydantic would read as a number ("16", "1e-3"); another word it refuses
    itself."""
    if not isinstance(value, str):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


def _numeric(annotation: Any) -> bool:
    """Whether a field holds numbers only (int, float, optional, or a list or tuple of
    them): a quoted "16" there is a mistake Pydantic would read as 16 (issue 57)."""
    if annotation in (int, float):
        return True
    args = get_args(annotation)
    return bool(args) and all(a in (type(None), Ellipsis) or _numeric(a) for a in args)


class Section(BaseModel):
    # Every number of a recipe is a physical quantity (a rate, a decay, a size): inf and nan
    # are refused before anything is written, never trained on.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data: Any) -> Any:
        """`true` where a number is meant is a mistake, not 1 (Pydantic would take it)."""
        if isinstance(data, dict):
            for name, value in data.items():
                field = cls.model_fields.get(name)
                values = value if isinstance(value, (list, tuple)) else [value]
                if field is not None and any(isinstance(v, bool) for v in values) and \
                        bool not in (field.annotation, *get_args(field.annotation)):
                    raise ValueError(f"field '{name}': expected a number, got a boolean "
                                     f"({json.dumps(value)})")
                if field is not None and any(_number_text(v) for v in values) and \
                        _numeric(field.annotation):
                    raise ValueError(f"field '{name}': expected a number, got a string "
                                     f"({json.dumps(value)}); write it without quotes")
        return data


class KindConfig(Section):
    """Base of a section that names a registered kind in its tag field (`task.name`,
    `model.arch`, `encoding.kind`). The section is a union tagged by that field: each kind's
    registration (perencode.config.registry) names the config class that holds its own options, a
    subclass of the section's base beside the kind's code (e.g. the dual-frequency task's
    `rarity`), and `Recipe` validates a table with the class its tag names. The union is
    open: a study's `register_*` call adds a member, which a union fixed when `Recipe` is
    defined could not take; perencode.config.schema writes it as a discriminated `oneOf`."""

    KIND: ClassVar[str]  # "task", "model" or "encoding"
    TAG: ClassVar[str]   # the field that names the kind: kinds.TAGS[KIND], set below

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        """A section's tag is its kind's in perencode.config.registry.TAGS (the one record of the
        tag fields); a section that lacks that field is a programming error, caught here."""
        super().__pydantic_init_subclass__(**kwargs)
        kind = getattr(cls, "KIND", None)
        if kind is not None:
            cls.TAG = registry.TAGS[kind]
            if cls.TAG not in cls.model_fields:
                raise TypeError(f"{cls.__name__}: a [{kind}] section needs the field "
                                f"{cls.TAG!r} that names its kind")

    @field_validator("*")
    @classmethod
    def _registered(cls, value: Any, info: ValidationInfo) -> Any:
        """The tag names a registered kind, unless the validation reads results (context
        `any_kind`: a run made with a kind the reader has not imported is still a result,
        under its raw name)."""
        if info.field_name == cls.TAG and value not in registry.registry(cls.KIND) and \
                not (info.context or {}).get("any_kind"):
            raise ValueError(f"Input should be {registry.choices(cls.KIND)}; "
                             f"{registry.PLUGIN_HINT}")
        return value

    @classmethod
    def named(cls, table: dict) -> Any:
        """The kind a table names: its tag, or the tag's default."""
        return table.get(cls.TAG, cls.model_fields[cls.TAG].default)

    @classmethod
    def foreign(cls, table: dict, chosen: type[KindConfig]) -> dict[str, list[str]]:
        """The keys of `table` that the class `chosen` lacks and other kinds have, each
        with those kinds' names (none for a kind no registration holds: it keeps all)."""
        owners = cls.options() if chosen is not _OPEN.get(cls) else {}
        return {k: owners[k] for k in table if k not in chosen.model_fields and k in owners}

    @classmethod
    def default(cls: type[_K]) -> _K:
        """The section a recipe gets when it leaves the table out (the tag's default)."""
        return cls.class_for(cls.model_fields[cls.TAG].default)()

    @classmethod
    def class_for(cls: type[_K], name: Any, any_kind: bool = False) -> type[_K]:
        """The config class of the kind named `name`; with `any_kind`, a name no
        registration holds (a result made by a study the reader has not imported) gets a
        class that keeps whatever options the table has."""
        kind = registry.registry(cls.KIND).get(name)
        if kind is not None:
            # A registration's config is a subclass of the section's base (perencode.config.registry
            # holds it as a plain type: the registries import no recipe code).
            return cast("type[_K]", kind.config or cls)
        if any_kind and isinstance(name, str):
            return _open_class(cls)
        raise ValueError(f"field '{cls.TAG}': Input should be {registry.choices(cls.KIND)} "
                         f"(got {name!r}{registry.guess(cls.KIND, name)}); {registry.PLUGIN_HINT}")

    @classmethod
    def of(cls: type[_K], **fields: Any) -> _K:
        """The section of the kind `fields` names, validated by its class (as in a recipe):
        `TaskConfig.of(name="dual_frequency", rarity=0.25)`."""
        return cls.dispatch(fields, {})

    @classmethod
    def options(cls) -> dict[str, list[str]]:
        """Each option a kind adds to the base, with the names of the kinds that have it."""
        out: dict[str, list[str]] = {}
        for name, kind in registry.registry(cls.KIND).items():
            for option in (kind.config or cls).model_fields:
                if option not in cls.model_fields:
                    out.setdefault(option, []).append(name)
        return out

    @classmethod
    def renamed(cls, data: dict) -> None:
        """Keys of earlier versions that now have another home: a ValueError naming it."""

    @classmethod
    def foreign_in(cls, table: dict) -> dict[str, list[str]]:
        """`foreign` for the class the table names; none when it names no registered kind
        (validation names that)."""
        try:
            return cls.foreign(table, cls.class_for(cls.named(table)))
        except ValueError:
            return {}

    @classmethod
    def dispatch(cls, data: Any, context: dict) -> Any:
        """Validate the table `data` with the class its tag names; an option of another kind
        is refused with a line naming its owners (a stored recipe that has some is migrated
        when it is read: perencode.config.recipe.migrate_stored)."""
        if isinstance(data, KindConfig):
            if type(data) is cls.class_for(getattr(data, cls.TAG), True):
                return data
            data = data.model_dump()
        if not isinstance(data, dict):
            return cls.model_validate(data)  # "must be a table"
        cls.renamed(data)
        name = cls.named(data)
        chosen = cls.class_for(name, bool(context.get("any_kind")))
        foreign = cls.foreign(data, chosen)
        if foreign:
            key, owners = next(iter(foreign.items()))
            raise ValueError(f"field '{key}': not an option of {registry.FIELDS[cls.KIND]} = "
                             f"{name!r} (only of {', '.join(map(repr, owners))})")
        return chosen.model_validate(data, context=context)


_OPEN: dict[type, type[KindConfig]] = {}


def _open_class(base: type[_K]) -> type[_K]:
    """`base` taking any extra option: the section of a kind no registration holds."""
    if base not in _OPEN:
        _OPEN[base] = type(f"Unregistered{base.__name__}", (base,),
                           {"model_config": ConfigDict(extra="allow"), "__module__": __name__})
    return cast("type[_K]", _OPEN[base])


class KindNames:
    """`json_schema_extra` of a field that names a registered kind: the JSON schema lists
    the names registered when it is generated, and `schema_rows` their summaries."""

    def __init__(self, kind: str):
        self.kind = kind

    def __call__(self, schema: dict) -> None:
        schema["enum"] = registry.names(self.kind)
        schema["description"] = self.describe(schema.get("description", ""))

    def describe(self, description: str) -> str:
        """The field's description followed by each registered kind's summary."""
        return description + ": " + "; ".join(
            f"{k.name} = {k.summary or k.label}" for k in registry.registry(self.kind).values()
        ) + "."
