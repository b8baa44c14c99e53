"""The built-in compaction strategies (``compaction: summarize | drop_tool_outputs | sliding``).

The interface is :mod:`telescope.api.compaction`; the orchestrator's side (when to
compact, tokens, segments) is :mod:`telescope.orchestrator.compaction`.
"""
