"""Configuration: the flat schema, the three-layer loader and the validation rules."""

from telescope.config.errors import ConfigError
from telescope.config.loader import LoadedConfig, load_config
from telescope.config.sources import parse_overrides
from telescope.schema.config import TelescopeConfig
from telescope.schema.entries import EnvironmentEntry, EvalEntry

__all__ = [
    "ConfigError",
    "EnvironmentEntry",
    "EvalEntry",
    "LoadedConfig",
    "TelescopeConfig",
    "load_config",
    "parse_overrides",
]
