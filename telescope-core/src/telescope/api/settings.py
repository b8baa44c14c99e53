"""Plugin-owned config fields: the settings a plugin reads, declared by the plugin.

A plugin that reads config fields of its own declares them as a pydantic model
derived from :class:`PluginSettings` and passes it at registration::

    class SapoSettings(PluginSettings):
        section = "algorithm"
        sapo_tau_pos: float = Field(1.0, gt=0, description="SAPO sigmoid sharpness for A > 0")

    register("sapo", "pkg.sapo:SAPO", settings=SapoSettings)   # or settings="pkg.settings:SapoSettings"

The loader composes one flat schema from the core's fields and the settings of
every installed plugin (:mod:`telescope.config.composition`): the user writes
``sapo_tau_pos: 2.0`` at the top level of the YAML or ``--sapo_tau_pos 2.0`` on the
command line, exactly like a core field. Field names are global: a name that two
distributions declare is an error naming both. When the run builds the plugin,
its constructor receives an instance of its settings model (the values of its
fields only) and a narrow context (:mod:`telescope.api.context`), never the
whole config.

Rules that involve the plugin's fields and core fields are contributed by the
owner: override :meth:`PluginSettings.config_problems`; each message should name
the fields it is about (the loader adds the file and line of the first field named
in ``fields``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from telescope.schema.config import TelescopeConfig


class SettingsProblem(str):
    """A problem message that knows which fields it is about (for ``file:line``)."""

    fields: tuple[str, ...] = ()

    def __new__(cls, message: str, fields: tuple[str, ...] = ()) -> SettingsProblem:
        problem = super().__new__(cls, message)
        problem.fields = tuple(fields)
        return problem


class PluginSettings(BaseModel):
    """Base class of the settings a plugin declares (flat fields, each with a default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Heading under which ``telescope config defaults`` lists these fields.
    section: ClassVar[str] = "plugins"

    @classmethod
    def config_problems(cls, config: TelescopeConfig) -> list[str]:
        """Cross-field rules owned by this plugin, checked on the composed config.

        Read your own fields with ``config.settings(cls)`` and core fields as
        attributes. Return one message per problem; a :class:`SettingsProblem`
        names the fields so that the message gets their file and line.
        """
        return []
