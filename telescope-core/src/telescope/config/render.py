"""Render configs as YAML: the defaults file and ``telescope config show``.

Both follow what is installed: the composed schema (the core's fields and every
installed plugin's), grouped by section in the order of the reference
documentation. The defaults file carries each field's description as a comment
and, for a plugin's field, the distribution that declares it; ``config show``
carries the layer that set each value.
"""

from __future__ import annotations

from typing import Any

import yaml

from telescope.config.composition import ComposedSchema, composed_schema
from telescope.schema.config import TelescopeConfig


def schema_defaults(schema: ComposedSchema | None = None) -> dict[str, Any]:
    """Every field's default, as plain YAML-ready values."""
    model = (schema or composed_schema()).model
    return {name: info.get_default(call_default_factory=True) for name, info in model.model_fields.items()}


def _field_yaml(name: str, value: Any) -> list[str]:
    text = yaml.safe_dump({name: value}, sort_keys=False, default_flow_style=False, width=100)
    return text.rstrip("\n").splitlines()


def render_defaults(schema: ComposedSchema | None = None) -> str:
    """The text of ``configs/defaults/default_train.yaml`` for what is installed."""
    schema = schema or composed_schema()
    values = schema_defaults(schema)
    lines = [
        "# Telescope default configuration: every parameter with its default.",
        "# Generated from the core's schema (telescope/schema/config.py) and the settings every",
        "# installed plugin declares, by",
        "#   telescope config defaults --write configs/defaults/default_train.yaml",
        "# A run config only needs the fields it changes.",
    ]
    for section, names in schema.sections().items():
        lines += ["", f"# ---- {section}"]
        for name in names:
            description = schema.model.model_fields[name].description or ""
            owner = schema.owner_label(name)
            lines.append(f"# {description}" + ("" if owner == "telescope-core" else f" [{owner}]"))
            lines += _field_yaml(name, values[name])
    return "\n".join(lines) + "\n"


def render_resolved(config: TelescopeConfig, provenance: dict[str, str], schema: ComposedSchema | None = None) -> str:
    """A resolved config as YAML, each top-level value followed by the layer that set it."""
    schema = schema or composed_schema()
    values = config.model_dump(mode="json")
    lines: list[str] = []
    width = 48
    for section, names in schema.sections().items():
        lines += [f"# ---- {section}"]
        for name in names:
            field_lines = _field_yaml(name, values[name])
            origin = provenance.get(name, "default")
            first = field_lines[0]
            lines.append(f"{first:<{width}} # {origin}")
            lines += field_lines[1:]
        lines.append("")
    return "\n".join(lines)
