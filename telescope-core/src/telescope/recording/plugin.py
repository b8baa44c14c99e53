"""Registers the built-in logger (``wandb``) and the settings it owns."""

from __future__ import annotations

from pydantic import Field

from telescope.api.settings import PluginSettings
from telescope.plugins.hookspecs import hookimpl
from telescope.plugins.registry import Registrar


class WandbSettings(PluginSettings):
    """The Weights & Biases logger's own fields.

    The code snapshot's selection (``wandb_code_max_file_size_mb``,
    ``wandb_code_exclude_patterns``) is the core's (the run store snapshots the code
    whether or not W&B is on); the logger reads it from its context.
    """

    section = "logging"

    use_wandb: bool = Field(True, description="Enable Weights & Biases logging")
    wandb_project: str = Field(
        "telescope", description="W&B project name (when the config does not set it: WANDB_PROJECT if set)"
    )
    wandb_tags: list[str] = Field(
        default_factory=lambda: ["telescope"],
        description="W&B tags (when the config does not set them: WANDB_TAGS, comma-separated, if set)",
    )
    wandb_upload_code: bool = Field(True, description="Upload source code to W&B")
    wandb_upload_logs: bool = Field(True, description="Upload trainer/inference logs to W&B")
    wandb_upload_logs_detailed: bool = Field(False, description="Include detailed logs in W&B upload")
    wandb_upload_logs_stdout: bool = Field(False, description="Include stdout logs in W&B upload")


@hookimpl
def telescope_register_loggers(register: Registrar) -> None:
    register(
        "wandb",
        "telescope.recording.wandb_logger:WandbLogger",
        settings=WandbSettings,
        install_hint="pip install 'telescope-core[wandb]'",
    )
