"""The error an operation raises when it does not finish within its limit, and the text it records.

A rollout's error is stored as text; a timeout's text starts with ``timeout/<kind>:``
(:data:`TIMEOUT_PREFIX`), so the run's timeout counters
(:func:`telescope.orchestrator.deadlines.timeout_metrics`) can tell the kinds apart
from the records alone. The inference side raises it for a request with no answer
(kind ``inference_request``); the orchestrator's deadlines for rewards and
environment steps.
"""

from __future__ import annotations

TIMEOUT_PREFIX = "timeout/"


class OperationTimeout(TimeoutError):
    """An operation did not finish within its limit; ``str()`` starts with ``timeout/<kind>:``."""

    def __init__(self, kind: str, what: str, timeout_s: float) -> None:
        super().__init__(f"{TIMEOUT_PREFIX}{kind}: {what} did not finish within {timeout_s:g} s")
        self.kind = kind
        self.what = what
        self.timeout_s = timeout_s
