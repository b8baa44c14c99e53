"""Telescope sandboxes: the pool, the ``local`` provider and remote providers.

Public names::

    from telescope_sandbox import SandboxPool, get_provider, SandboxUsage
    pool = SandboxPool("local", size=4, limits=SandboxLimits(memory_mb=512, timeout_s=10))
    with pool.acquire(usage) as sandbox:
        sandbox.upload("main.py", b"print(1)")
        result = sandbox.execute("python3 main.py", timeout_s=5)

Importing this package is cheap (no SDK is imported until its provider is used).
"""

from telescope_sandbox.observed import ObservedProvider, ObservedSandbox, SandboxUsage
from telescope_sandbox.pool import SandboxPool
from telescope_sandbox.providers import get_provider, provider_class

__version__ = "0.1.0"

__all__ = [
    "ObservedProvider",
    "ObservedSandbox",
    "SandboxPool",
    "SandboxUsage",
    "get_provider",
    "provider_class",
]
