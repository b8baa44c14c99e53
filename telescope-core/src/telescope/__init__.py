"""Telescope: asynchronous reinforcement-learning post-training for LLMs.

This package stays light to import: the CLI, the config and the plugin system need
only pydantic, click, pluggy and PyYAML. The training and inference stack (torch,
transformers, ray) is imported by the modules that use it, when they are used.
"""

from telescope.plugins.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = ["__version__", "hookimpl"]
