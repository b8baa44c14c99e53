"""The run configuration's schema: the core's fields, section by section, and their validators.

Pure data: nothing here loads a file or knows a plugin. :mod:`telescope.config`
(above the plugin system) reads the layers, composes this schema with the fields
the installed plugins declare, and runs the rules that need the registry.
"""
