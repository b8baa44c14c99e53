"""The run configuration: one flat, pydantic-validated schema.

Every field name is globally unique and says what it is. The fields the core itself
reads are declared section by section (one class per section of the reference
documentation, in the ``fields_*`` modules of this package), and
:class:`TelescopeConfig` composes them with the validators; a field's section is the
class that declares it (:data:`SECTIONS`), so no name is listed twice. Every plugin
declares the fields it reads
(:mod:`telescope.api.settings`) and the loader composes the two
(:mod:`telescope.config.composition`). The defaults of both are written out,
field for field, in ``configs/defaults/default_train.yaml`` (``telescope config
defaults`` regenerates it from what is installed; a test keeps the two equal). Unknown
keys are rejected (``extra="forbid"``). Rules that involve several fields and need
no plugin are in :mod:`telescope.schema.cross_field` (run by
:meth:`TelescopeConfig._cross_field_rules`); rules that
need the plugin registry (names, algorithm capabilities) are in
:mod:`telescope.config.rules`.

Plugin-chosen fields (``algorithm``, ``train_backend``, ``inference_backend``,
``weight_transport``, ``sandbox_provider``, environment and eval names) are plain
strings checked against the registry, so that an installed package can add names.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

from telescope.schema.cross_field import cross_field_problems
from telescope.schema.entries import CheckpointEntry
from telescope.schema.fields import ConfigFields
from telescope.schema.sections import fields_by_section

S = TypeVar("S", bound=BaseModel)


class TelescopeConfig(ConfigFields):
    """The core's parameters of a Telescope run.

    The schema a run validates against is this class extended with the fields
    every installed plugin declares (:func:`telescope.config.composition.composed_schema`);
    code reads plugin fields through :meth:`settings`, typed by the plugin's model.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    def settings(self, model: type[S]) -> S:
        """This config's values of ``model``'s fields, as an instance of ``model`` (a typed slice).

        ``model`` is a plugin's :class:`~telescope.api.settings.PluginSettings` (or any
        model whose field names are fields of this config).
        """
        missing = [name for name in model.model_fields if name not in type(self).model_fields]
        if missing:
            raise KeyError(
                f"the config has no field(s) {', '.join(missing)} of {model.__name__}: it was loaded without "
                "the plugin that declares them (load it with telescope.config.load_config)"
            )
        return model.model_validate({name: getattr(self, name) for name in model.model_fields})

    @field_validator("checkpoint_every", mode="before")
    @classmethod
    def _checkpoint_every_bool(cls, value: Any) -> Any:
        if value is False or value is None:
            return 0
        if value is True:
            raise ValueError("checkpoint_every takes a step count (e.g. 50), or 0/false to disable")
        return value

    @field_validator("ray_inference_resources_per_worker", "ray_trainer_resources_per_worker")
    @classmethod
    def _custom_resources(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(
                    f"{name!r} is set by ray_*_cpus_per_worker and the GPU settings; list only custom resources "
                    "(the names given to `ray start --resources`)"
                )
            if amount <= 0:
                raise ValueError(f"resource {name!r} needs an amount > 0, got {amount}")
        return value

    @field_validator("checkpoints")
    @classmethod
    def _one_checkpoint_per_step(cls, value: list[CheckpointEntry]) -> list[CheckpointEntry]:
        steps = [entry.step for entry in value]
        twice = sorted({step for step in steps if steps.count(step) > 1})
        if twice:
            raise ValueError(f"step {twice[0]} is listed more than once; give each step one checkpoint")
        return value

    @field_validator("wandb_run_path")
    @classmethod
    def _wandb_run_path(cls, value: str | None) -> str | None:
        if value is not None:
            parts = value.split("/")
            if len(parts) != 3 or not all(part.strip() for part in parts) or value != value.strip():
                raise ValueError(f'{value!r} is not a W&B run path: write "entity/project/run_id" (or null for no W&B)')
        return value

    @field_validator("kl_penalty_tau", mode="before")
    @classmethod
    def _kl_penalty_off(cls, value: Any) -> Any:
        return 0.0 if value is None else value

    @field_validator("resume_from_checkpoint")
    @classmethod
    def _resume_step(cls, value: bool | int) -> bool | int:
        if not isinstance(value, bool) and value < 0:
            raise ValueError("resume_from_checkpoint is true, false or a step number >= 0")
        return value

    @model_validator(mode="after")
    def _cross_field_rules(self, info: ValidationInfo) -> TelescopeConfig:
        # A default that contradicts a field the user set yields to it; a value the
        # user set explicitly is never overridden (the rule below then reports it).
        if (
            self.free_lane_after_generation
            and not self.enable_individual_sample_lanes
            and "free_lane_after_generation" not in self.model_fields_set
        ):
            # still constructing: the frozen model's fields are set once, here (not a later mutation)
            object.__setattr__(self, "free_lane_after_generation", False)
        if info.context and info.context.get("defer_cross_field_rules"):
            return self  # the loader reports them together with the registry rules
        problems = cross_field_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self


#: The section of every core field (the class that declares it), in the reference order.
SECTIONS: dict[str, str] = fields_by_section(TelescopeConfig)
