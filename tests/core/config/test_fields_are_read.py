"""Every config field is read by some code, outside the config package that declares and validates it.

A field nothing reads is a promise the run does not keep. The check is static: a
field counts as read when its name appears, outside ``telescope/config/``, as an
attribute access (``config.seed``) or as an exact string (``"seed"``, for
``getattr``/dict access) in the source of an installed Telescope package. Fields
that a later issue of this wave makes work are listed in :data:`PENDING` with that
issue; the test fails when such a field becomes read (move it out of the list)
or when any other field is read by nothing. Upstream fields kept at the one value
the code honours (``FIXED_UPSTREAM``) are read by validation, which refuses any other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from telescope.config.composition import composed_schema
from telescope.config.errors import ConfigError
from telescope.config.loader import load_config
from telescope.schema.cross_field import FIXED_UPSTREAM

ROOT = Path(__file__).resolve().parents[3]
SOURCES = [ROOT / f"telescope-{name}" / "src" for name in ("core", "envs", "sandbox", "ui-sync", "megatron")]

#: Fields read by nothing yet, and the issue that makes each work.
PENDING: dict[str, str] = {}

#: Pending fields whose name other code also uses for something else, so the static scan
#: cannot tell when they become read.
SHADOWED: set[str] = set()


def names_read() -> set[str]:
    read: set[str] = set()
    for root in SOURCES:
        for path in root.rglob("*.py"):
            if "config" in path.relative_to(root).parts[1:2]:
                continue  # telescope/config/: declarations and validation are not uses
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Attribute):
                    read.add(node.attr)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    read.add(node.value)
    return read


def test_every_field_is_read_by_some_code() -> None:
    fields = set(composed_schema().model.model_fields)
    read = names_read()
    unread = sorted(name for name in fields if name not in read and name not in FIXED_UPSTREAM)
    assert sorted(set(unread) - set(PENDING)) == [], "fields read by no code: make them work or remove them"


def test_upstream_fields_kept_at_one_value_refuse_any_other() -> None:
    """A field kept only so that upstream configs validate is read by validation: any other value is refused."""
    for name, (value, why) in FIXED_UPSTREAM.items():
        assert isinstance(value, bool)
        with pytest.raises(ConfigError) as info:
            load_config(None, {"environments": [{"name": "countdown"}], name: not value}, check_plugins=False)
        [problem] = info.value.problems
        assert problem.startswith(f"{name}={not value!r} is not supported: {why}; set it to {value!r}")
        assert load_config(None, {"environments": [{"name": "countdown"}], name: value}, check_plugins=False)


def test_pending_fields_are_still_pending() -> None:
    read = names_read()
    done = sorted(name for name in PENDING if name in read and name not in SHADOWED)
    assert done == [], f"{done} are read now: take them out of PENDING"


def test_megatron_fields_belong_to_the_megatron_package() -> None:
    """The core declares no megatron_* field: telescope-megatron owns them (issue 13)."""
    from telescope.schema.config import TelescopeConfig

    assert [name for name in TelescopeConfig.model_fields if name.startswith("megatron_")] == []
