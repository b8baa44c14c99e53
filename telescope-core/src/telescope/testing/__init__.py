"""Conformance test kits for plugin authors (``telescope.testing.<kind>``).

Each module holds a base test class to inherit in a plugin's own test suite, as
langchain's standard tests do: ``telescope.testing.environment`` for environments,
``telescope.testing.sandbox`` for sandbox providers, ``telescope.testing.algorithm``
for algorithms and ``telescope.testing.trainer`` for trainer backends. Import the
module you need; this package imports nothing.
"""
