"""Configuration: the flat schema, the three-layer loader and the validation rules."""

from telescope.config.entries import EnvironmentEntry, EvalEntry
from telescope.config.loader import ConfigError, LoadedConfig, load_config, parse_overrides
from telescope.config.schema import TelescopeConfig

__all__ = [
    "ConfigError",
    "EnvironmentEntry",
    "EvalEntry",
    "LoadedConfig",
    "TelescopeConfig",
    "load_config",
    "parse_overrides",
]
