"""Load a run config from three layers: schema defaults, a YAML file, CLI overrides.

Later layers override earlier ones, key by key (a list or dict given on the CLI
replaces the file's value whole). The loader remembers which layer set each field
(``file.yaml:LINE``, ``cli``, ``default``, or ``derived: why``) for
``telescope config show``.

CLI overrides: ``--learning_rate 5e-7``, ``--learning-rate=5e-7``; a bare
``--use_tis`` means true; values are YAML, so lists and dicts are written
``--wandb_tags '[a, b]'`` or ``--environments '[{name: countdown}]'`` (JSON is YAML);
a string field takes the text as given. ``--config FILE`` may replace the positional
config path.

Every failure raises :class:`ConfigError` carrying one message per problem: unknown
keys (with the file, line and the closest valid names), wrong types and values out
of range (field, value, what is allowed), a missing or unreadable file, invalid
YAML (file, line and column), unknown plugin names.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from telescope.config.errors import ConfigError
from telescope.config.eval_form import eval_layer, eval_problems
from telescope.config.sources import parse_overrides, read_yaml_file, schema_field_kind
from telescope.config.spelling import closest, dotted_hint, number_text_hint
from telescope.config.yaml_reader import SourceMap, quote_hint
from telescope.schema.config import TelescopeConfig, cross_field_problems
from telescope.schema.cross_field import Purpose
from telescope.schema.entries import CheckpointEntry, EnvironmentEntry, EvalEntry


@dataclass
class LoadedConfig:
    """A validated config and where each of its values came from."""

    config: TelescopeConfig
    provenance: dict[str, str] = field(default_factory=dict)
    path: Path | None = None


# -------------------------------------------------------------------- validation


def _entry_model(loc: tuple[Any, ...], schema: type[BaseModel]) -> type[BaseModel]:
    if loc and loc[0] == "environments":
        return EnvironmentEntry
    if loc and loc[0] == "evals":
        return EvalEntry
    if loc and loc[0] == "checkpoints":
        return CheckpointEntry
    return schema


_FIELD_NAME = re.compile(r"[a-z][a-z0-9_]*")
_LEADING_PATH = re.compile(r"([a-z][a-z0-9_]*)((?:\[\d+\]|\.[A-Za-z_][A-Za-z0-9_]*)*):")
_LOCATED = re.compile(r"\((?:[^()]*:\d+|cli)(?:, [^()]*)?\)$")


def _path_of(text: str) -> tuple[str | int, ...]:
    """``environments[0].kwargs`` -> ("environments", 0, "kwargs")."""
    parts: list[str | int] = []
    for name, index in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]", text):
        parts.append(int(index) if index else name)
    return tuple(parts)


def locate(
    problem: str, provenance: dict[str, str], fields: Sequence[str] = (), source: SourceMap | None = None
) -> str:
    """``problem`` followed by the file and line (or ``cli``) of the fields it is about.

    The fields are ``fields`` when the rule named them; else the path the message
    starts with (``environments[0].kwargs: ...``, located to its own line when the
    file set it); else the config field names the message mentions, in order. At
    most three places are given; a message that already ends with a place is kept.
    """
    if _LOCATED.search(problem):
        return problem
    leading = _LEADING_PATH.match(problem)
    places: list[str] = []
    if fields:
        names = list(fields)
    elif leading and leading.group(1) in provenance:
        names = [leading.group(1)]
        origin = provenance[leading.group(1)]
        nested = source.where(_path_of(leading.group(0)[:-1])) if source is not None and origin != "cli" else None
        if nested:
            places.append(nested)
    else:
        names = [n for n in dict.fromkeys(_FIELD_NAME.findall(problem)) if n in provenance]
    places += [provenance[n] for n in names if provenance.get(n, "default") != "default"]
    places = list(dict.fromkeys(p for p in places if not p.startswith("derived")))[: 1 if places and leading else 3]
    return f"{problem} ({', '.join(places)})" if places else problem


def _loc_text(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _translate(
    exc: ValidationError, provenance: dict[str, str], schema: type[BaseModel], source: SourceMap | None = None
) -> list[str]:
    """One message per validation error, located at ``file:line`` when the file set it.

    ``source`` (from :func:`read_yaml_file`) gives the line of nested paths
    (``environments[0].kwargs.seed``) and the text of values YAML read as a
    non-string; values from the command line are located as ``cli``.
    """
    problems: list[str] = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        # pydantic appends the member of a union it tried (e.g. 'int'); drop those
        loc = tuple(p for p in loc if not (isinstance(p, str) and p in {"int", "bool", "str", "float"}))
        path = _loc_text(loc)
        origin = provenance.get(str(loc[0]), "") if loc else ""
        if source is not None and loc and origin not in ("cli", "", "default"):
            origin = source.where(loc) or origin
        where = f" ({origin})" if origin and origin != "default" else ""
        kind = err["type"]
        if kind == "extra_forbidden":
            model = _entry_model(loc, schema)
            valid = list(model.model_fields)
            scope = "" if model is schema else f" of {loc[0]} entries"
            key = str(loc[-1])
            advice = dotted_hint(key, valid, cli=origin == "cli") or closest(key, valid)
            see = f"see `telescope config show` for the valid keys{scope}"
            problems.append(f"unknown key {path!r}{where}{advice} ({see})")
        elif kind == "value_error" and not loc:
            message = err["msg"].removeprefix("Value error, ")
            problems.extend(line for line in message.splitlines() if line.strip())
        elif kind == "value_error":
            problems.append(f"{path}{where}: {err['msg'].removeprefix('Value error, ')}")
        elif kind == "missing":
            problems.append(f"{path}: required{where}")
        else:
            value = err.get("input")
            shown = repr(value) if not isinstance(value, (dict, list)) or len(repr(value)) < 80 else "..."
            hint = quote_hint(loc, value, source if origin != "cli" else None) if kind == "string_type" else None
            if kind in ("int_parsing", "float_parsing") and loc and isinstance(loc[-1], str):
                hint = number_text_hint(loc[-1], value, cli=origin == "cli")
            problems.append(f"{path}{where}: {hint}" if hint else f"{path} = {shown}{where}: {err['msg']}")
    # one union failure produces an error per member; keep the messages unique
    return list(dict.fromkeys(problems))


def load_config(
    path: str | Path | None,
    overrides: Sequence[str] | dict[str, Any] = (),
    *,
    check_plugins: bool = True,
    layer: bool = False,
    purpose: Purpose = "run",
    checkpoint_argument: bool = False,
) -> LoadedConfig:
    """Load, merge and validate a config. Raises :class:`ConfigError` on any problem.

    ``layer``: check the file as a defaults layer (every key known, typed, in range and
    consistent) rather than as a run, which also needs at least one environment.

    ``purpose="eval"``: the config of a standalone eval (``telescope eval``; see
    :mod:`telescope.config.eval_form`): the eval defaults under a dedicated eval config,
    evals and a checkpoint source required (``checkpoint_argument``: the command line
    names the checkpoint) instead of an environment, and a training run's rules not asked.

    The schema is composed from the installed plugins first, so that plugin fields
    are known to the YAML, the command line (``--my_plugin_field``) and validation alike.
    """
    from telescope.config.composition import composed_schema
    from telescope.plugins.facade import get_plugins

    plugins = get_plugins()
    schema = composed_schema(plugins)
    if isinstance(overrides, dict):
        cli_path, cli_values = None, dict(overrides)
    else:
        cli_path, cli_values = parse_overrides(overrides, schema_field_kind(schema.model))
    if path is None and cli_path is not None:
        path = cli_path
    elif path is not None and cli_path is not None:
        raise ConfigError([f"two config files given: {path} and --config {cli_path}; pass one"])

    provenance: dict[str, str] = {}
    data: dict[str, Any] = {}
    yaml_source: SourceMap | None = None
    source = str(path) if path is not None else "command line"
    config_path = Path(path) if path is not None else None
    if config_path is not None:
        data, yaml_source = read_yaml_file(config_path)
        for key in data:
            provenance[str(key)] = f"{config_path}:{yaml_source.lines.get((str(key),), 1)}"
    for key, value in cli_values.items():
        data[key] = value
        provenance[key] = "cli"
    if purpose == "eval":
        data = {**eval_layer(data), **data}  # provenance: "default" (the eval's), as for any default

    try:
        config = schema.model.model_validate(data, context={"defer_cross_field_rules": True})
    except ValidationError as exc:
        raise ConfigError(_translate(exc, provenance, schema.model, yaml_source), source) from None

    derived: dict[str, tuple[Any, str]] = {}  # {field: (value, reason)}: see config.rules.Derived
    lanes_off = not config.enable_individual_sample_lanes
    if lanes_off and config.free_lane_after_generation is False and "free_lane_after_generation" not in data:
        derived["free_lane_after_generation"] = (False, "off because enable_individual_sample_lanes is off")

    rules = cross_field_problems(config, layer=layer, purpose=purpose)
    if purpose == "eval":
        rules += eval_problems(config, layer=layer, checkpoint_argument=checkpoint_argument)
    problems = [locate(p, provenance, source=yaml_source) for p in rules]
    problems += [locate(message, provenance, fields) for message, fields in schema.settings_problems(config)]
    if check_plugins:
        from telescope.config.rules import registry_problems

        problems += [locate(p, provenance, source=yaml_source) for p in registry_problems(config, plugins, derived)]
        if not problems:
            problems += [locate(p, provenance) for p in plugins.validate_config(config)]
    if problems:
        raise ConfigError(problems, source)

    config = config.model_copy(update={name: value for name, (value, _) in derived.items()})  # frozen: a new one
    for name in schema.model.model_fields:
        if name in derived:
            provenance[name] = f"derived: {derived[name][1]}"
        provenance.setdefault(name, "default")
    return LoadedConfig(config=config, provenance=provenance, path=config_path)
