"""A core field's section is the class that declares it: no field name is listed twice."""

from __future__ import annotations

from typing import ClassVar

from telescope.schema.config import SECTIONS, TelescopeConfig
from telescope.schema.sections import SectionFields, fields_by_section


def test_every_core_field_has_the_section_of_the_class_that_declares_it() -> None:
    assert list(SECTIONS) == list(TelescopeConfig.model_fields)  # each one, in the reference order
    assert SECTIONS["seed"] == "general" and SECTIONS["learning_rate"] == "trainer"
    assert SECTIONS["ray_address"] == "ray cluster" and SECTIONS["compaction"] == "compaction"
    order = list(dict.fromkeys(SECTIONS.values()))
    assert order[:3] == ["general", "model", "environments"] and order[-1] == "weight broadcasting"


def test_a_new_section_class_needs_no_second_list_of_its_names() -> None:
    class FirstFields(SectionFields):
        section: ClassVar[str] = "first"
        alpha: int = 1
        beta: int = 2

    class SecondFields(SectionFields):
        section: ClassVar[str] = "second"
        gamma: int = 3

    class Composed(SecondFields, FirstFields):
        delta: int = 4  # declared on the composed class itself: no section

    assert fields_by_section(Composed) == {"alpha": "first", "beta": "first", "gamma": "second"}
