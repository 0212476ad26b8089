"""The scenario section: the family, scenario.increments, and one section a registered family with a `section`
(gtep/protocol/families/base.py), whose model is built from the family's Options: the Options dataclass is the one
schema of a family's options (each field's constraints and description are its dataclasses.field metadata), so a
new family touches nothing here."""
from __future__ import annotations

import dataclasses
import os
import typing
from typing import TYPE_CHECKING, Any, Optional

from pydantic import Field, create_model, field_validator, model_validator
from pydantic_core import PydanticCustomError

from gtep.config.base import _Strict
from gtep.plugins import PLUGINS_ENV, deferred
from gtep.protocol.families import FAMILIES, ScenarioFamily
from gtep.protocol.scenarios import parse_increments

# the metadata keys of an Options field that pydantic's Field takes; the others mark files (gtep.data.option_files)
FIELD_KEYS = ("description", "ge", "gt", "le", "lt", "min_length")
OPTION_PROBLEM = "option_problem"  # a family's option_problems: ctx["field"] is the config field at fault


def _file_check(name: str, reader: str, unless: Any) -> Any:
    def check(cls: type, value: Any) -> Any:
        from gtep.data.option_files import OPTION_FILES

        if value is None or value == unless:
            return value
        return OPTION_FILES.get(reader).check(value)

    return field_validator(name)(classmethod(check))


def _problems(family: ScenarioFamily) -> Any:
    def problems(self: _Strict) -> _Strict:
        found = family.option_problems(self.model_dump(mode="json"))
        if found:
            raise PydanticCustomError(OPTION_PROBLEM, found[0].message, {"field": found[0].field})
        return self

    return model_validator(mode="after")(problems)


def section_model(family: ScenarioFamily) -> type[_Strict]:
    """scenario.<section>: the family's Options fields (those the config fills from files left out), with their
    metadata's constraints and descriptions, the file fields' checks and the family's option_problems."""
    options = family.Options
    hints = typing.get_type_hints(options)
    fields: dict[str, Any] = {}
    validators: dict[str, Any] = {"option_problems": _problems(family)}
    for f in dataclasses.fields(options):
        if "filled_from" in f.metadata:
            continue
        hint = hints[f.name]
        args = typing.get_args(hint)
        if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
            hint = typing.List[args[0]]  # type: ignore[valid-type]  # a YAML list (an Options tuple: hashable)
        constraints = {k: v for k, v in f.metadata.items() if k in FIELD_KEYS}
        if f.default is not dataclasses.MISSING:
            fields[f.name] = (hint, Field(f.default, **constraints))
        elif f.default_factory is not dataclasses.MISSING:
            fields[f.name] = (hint, Field(default_factory=f.default_factory, **constraints))
        else:
            fields[f.name] = (hint, Field(..., **constraints))
        if "file" in f.metadata:
            validators[f"file_{f.name}"] = _file_check(f.name, f.metadata["file"], f.metadata.get("unless"))
    assert family.section is not None
    return create_model(f"{family.section.title()}Spec", __base__=_Strict, __module__=__name__,
                        __doc__=options.__doc__, __validators__=validators, **fields)


def _sectioned() -> dict[str, ScenarioFamily]:
    """Section key -> its family, for every registered family with a section."""
    out: dict[str, ScenarioFamily] = {}
    for name in FAMILIES:
        family = FAMILIES.get(name)
        if family.section is not None:
            out[family.section] = family
    return out


# Plugins' families register before their sections are built: the modules of GTEP_PLUGINS (imported by
# gtep.algorithms) and the gtep.families entry points (read at FAMILIES' first lookup, in _sectioned). A plugin that
# cannot be loaded is kept and raised by the first registry lookup after (gtep.plugins.deferred): inside a command,
# where it is a one-line error, rather than while gtep.config is imported.
with deferred():
    if os.environ.get(PLUGINS_ENV):
        import gtep.algorithms  # noqa: F401
    SECTIONS: dict[str, type[_Strict]] = {key: section_model(family) for key, family in _sectioned().items()}
# each section model a name of this module (FscilSpec, ...), so pickle finds it (Ray sends configs to workers)
globals().update({model.__name__: model for model in SECTIONS.values()})


def _flow(value: Any) -> str:
    """A value as YAML's flow style writes it (the examples of the messages)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_flow, value)) + "]"
    return str(value)


def _example(family: ScenarioFamily, section: str) -> str:
    model = SECTIONS[section]
    shown = {k: v for k, v in family.example_options().items() if k in model.model_fields}
    return f"{section}: {{" + ", ".join(f"{k}: {_flow(v)}" for k, v in shown.items()) + "}"


class ScenarioBase(_Strict):
    """What every scenario has; ScenarioSpec adds one optional field a registered family's section."""

    # gtep/protocol/families/: class_incremental (the paper's; needs increments), or a family with a section
    # (fscil, iirc, fluid, cfsl: needs its section, named as the family)
    family: str = "class_incremental"
    increments: str | list[int] | None = Field(
        None, description="classes per task: '10x10', 'C50xT1+C10xT5' or a list (class_incremental)")

    @field_validator("increments")
    @classmethod
    def _parse(cls, value: str | list[int] | None) -> str | list[int] | None:
        if value is not None:
            parse_increments(value)
        return value

    @model_validator(mode="after")
    def _family_and_its_section(self) -> "ScenarioBase":
        if self.family not in FAMILIES:
            raise ValueError(f"family {self.family!r} is unknown; choose from {FAMILIES.names()}")
        family = FAMILIES.get(self.family)
        for key, owner in _sectioned().items():
            if key != family.section and getattr(self, key, None) is not None:
                raise ValueError(f"the {key} section needs family: {owner.name}; remove it or set the family")
        if family.section is None:
            needed = {f.name for f in dataclasses.fields(family.Options)
                      if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
                      } if dataclasses.is_dataclass(family.Options) else set()
            if "increments" in needed and self.increments is None:
                raise ValueError(f"a {family.name} scenario needs increments, e.g. increments: 10x10")
            return self
        if self.section() is None:
            raise ValueError(f"family {family.name} needs its section, e.g. {_example(family, family.section)}")
        if self.increments is not None:
            raise ValueError(f"a {family.name} scenario takes its options from the {family.section} section; "
                             "remove increments")
        return self

    def section(self) -> _Strict | None:
        """The family's section (None: the family has none)."""
        key = FAMILIES.get(self.family).section
        return None if key is None else getattr(self, key, None)

    @property
    def family_options(self) -> dict[str, Any]:
        """The family's options as the generator takes them (plain values, paths as strings), the files they name
        read into the options that hold their content (workers and the pre-flight checks need no file)."""
        from gtep.data.option_files import OPTION_FILES

        family = FAMILIES.get(self.family)
        section = self.section()
        if section is None:
            return {"increments": self.increments}
        options = section.model_dump(mode="json")
        fields = dataclasses.fields(family.Options)
        for f in fields:
            if "file" not in f.metadata:
                continue
            value = options.get(f.name)
            if value is None or value == f.metadata.get("unless"):
                continue
            into = next(g.name for g in fields if g.metadata.get("filled_from") == f.name)
            options[into] = OPTION_FILES.get(f.metadata["file"]).read(value)
        return options

    @property
    def increment_list(self) -> list[int]:
        return FAMILIES.get(self.family).increments(self.family_options)

    def describe(self) -> str:
        """The scenario in one phrase, for terminals and run names: '10x10', 'fscil 20+4x5-way 5-shot'."""
        return FAMILIES.get(self.family).summary(self.family_options)


if TYPE_CHECKING:
    ScenarioSpec = ScenarioBase
else:
    ScenarioSpec = create_model(
        "ScenarioSpec", __base__=ScenarioBase, __module__=__name__, __doc__=ScenarioBase.__doc__,
        **{key: (Optional[model], None) for key, model in SECTIONS.items()})
