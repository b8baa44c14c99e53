"""The local provider through the sandbox conformance kit."""

from __future__ import annotations

from telescope.api.sandbox import SandboxProvider
from telescope.testing.sandbox import SandboxProviderConformance
from telescope_sandbox.local import LocalProvider


class TestLocalProvider(SandboxProviderConformance):
    def provider_factory(self) -> SandboxProvider:
        return LocalProvider()
