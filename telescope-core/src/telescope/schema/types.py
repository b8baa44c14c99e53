"""Value types of the config's fields, shared by the sections that declare them and by their readers."""

from __future__ import annotations

from typing import Literal

Dtype = Literal["float32", "float16", "bfloat16"]
PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]

#: What the code snapshot (the run store's, uploaded by the W&B logger) leaves out by default.
DEFAULT_CODE_EXCLUDES = [".git", ".venv", "__pycache__", "*.pyc", "runs", "wandb", "checkpoints", "node_modules"]
