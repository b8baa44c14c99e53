"""The sections of the core's fields: each is a class that declares its fields.

The defaults file (``telescope config defaults``), ``telescope config show`` and the
reference documentation group the fields by section. A core field's section is the
:class:`SectionFields` class that declares it (``section``); the config composes the
classes in the reference order (:class:`~telescope.schema.config.TelescopeConfig`), so
a field is named once, where it is declared. A plugin's fields go under its settings
model's ``section`` (:mod:`telescope.config.composition`).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel


class SectionFields(BaseModel):
    """The fields of one section of the core's config (a base of ``TelescopeConfig``)."""

    section: ClassVar[str] = "other"


def fields_by_section(config_class: type[BaseModel]) -> dict[str, str]:
    """``{field: section}`` for the fields declared by :class:`SectionFields` classes that name their ``section``.

    In ``config_class.model_fields`` order: the reference order of the sections.
    """
    declared: dict[str, str] = {}
    for base in config_class.__mro__:
        if issubclass(base, SectionFields) and "section" in vars(base) and base is not SectionFields:
            for name in base.__annotations__:
                if name in base.model_fields:
                    declared.setdefault(name, base.section)
    return {name: declared[name] for name in config_class.model_fields if name in declared}
