"""Conformance test kits for plugin authors (``telescope.testing.<kind>``).

Each module holds a base test class to inherit in a plugin's own test suite, as
langchain's standard tests do: ``telescope.testing.environment`` for environments,
``telescope.testing.sandbox`` for sandbox providers, ``telescope.testing.algorithm``
for algorithms, ``telescope.testing.trainer`` for trainer backends,
``telescope.testing.inference`` for inference backends and
``telescope.testing.transport`` for weight transports. Import the
module you need; this package imports nothing.
"""
