"""Render configs as YAML: the defaults file and ``telescope config show``.

Both group fields by section in the order of the reference documentation. The
defaults file carries each field's description as a comment; ``config show``
carries the layer that set each value.
"""

from __future__ import annotations

from typing import Any

import yaml

from telescope.config.schema import SECTIONS, TelescopeConfig


def schema_defaults() -> dict[str, Any]:
    """Every field's default, as plain YAML-ready values."""
    out: dict[str, Any] = {}
    for name, info in TelescopeConfig.model_fields.items():
        out[name] = info.get_default(call_default_factory=True)
    return out


def _ordered_sections() -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    for name in TelescopeConfig.model_fields:
        sections.setdefault(SECTIONS.get(name, "other"), []).append(name)
    return sections


def _field_yaml(name: str, value: Any) -> list[str]:
    text = yaml.safe_dump({name: value}, sort_keys=False, default_flow_style=False, width=100)
    return text.rstrip("\n").splitlines()


def render_defaults() -> str:
    """The text of ``configs/defaults/default_train.yaml``."""
    values = schema_defaults()
    lines = [
        "# Telescope default configuration: every parameter with its default.",
        "# Generated from the schema (telescope/config/schema.py) by",
        "#   telescope config defaults --write configs/defaults/default_train.yaml",
        "# A run config only needs the fields it changes.",
    ]
    for section, names in _ordered_sections().items():
        lines += ["", f"# ---- {section}"]
        for name in names:
            description = TelescopeConfig.model_fields[name].description or ""
            lines.append(f"# {description}")
            lines += _field_yaml(name, values[name])
    return "\n".join(lines) + "\n"


def render_resolved(config: TelescopeConfig, provenance: dict[str, str]) -> str:
    """A resolved config as YAML, each top-level value followed by the layer that set it."""
    values = config.model_dump(mode="json")
    lines: list[str] = []
    width = 48
    for section, names in _ordered_sections().items():
        lines += [f"# ---- {section}"]
        for name in names:
            field_lines = _field_yaml(name, values[name])
            origin = provenance.get(name, "default")
            first = field_lines[0]
            lines.append(f"{first:<{width}} # {origin}")
            lines += field_lines[1:]
        lines.append("")
    return "\n".join(lines)
