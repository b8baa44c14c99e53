"""Configuration: the flat schema, the three-layer loader and the validation rules."""

from telescope.config.entries import EnvironmentEntry, EvalEntry
from telescope.config.errors import ConfigError
from telescope.config.loader import LoadedConfig, load_config
from telescope.config.schema import TelescopeConfig
from telescope.config.sources import parse_overrides

__all__ = [
    "ConfigError",
    "EnvironmentEntry",
    "EvalEntry",
    "LoadedConfig",
    "TelescopeConfig",
    "load_config",
    "parse_overrides",
]
