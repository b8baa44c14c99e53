"""Registers the built-in compactors through the public hook (lazily: nothing is imported until used)."""

from __future__ import annotations

from telescope.plugins.hookspecs import hookimpl
from telescope.plugins.registry import Registrar

#: name -> lazy target of each built-in compactor.
TARGETS = {
    "summarize": "telescope.compaction.builtins:Summarize",
    "drop_tool_outputs": "telescope.compaction.builtins:DropToolOutputs",
    "sliding": "telescope.compaction.builtins:Sliding",
}


@hookimpl
def telescope_register_compactions(register: Registrar) -> None:
    for name, target in TARGETS.items():
        register(name, target)
