"""The ground floor's host-level helpers that every server of a run shares (the run token's check).

Below ``inference/``, ``transports/``, ``recording/`` and ``runtime/``: nothing here imports
from them.
"""
