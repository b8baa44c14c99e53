"""Every field the core reads, composed section by section into one model (no validators).

:class:`ConfigFields` is :class:`~telescope.schema.config.TelescopeConfig` without
its validators: the type the rules between fields
(:mod:`telescope.schema.cross_field`, :mod:`telescope.schema.long_horizon`) read, so
that they need not import the class that runs them.
"""

from __future__ import annotations

from telescope.schema.fields_cluster import RayClusterFields, WeightBroadcastingFields
from telescope.schema.fields_generation import (
    CompactionFields,
    InferenceServerFields,
    RolloutSamplingFields,
    SandboxesFields,
    SequencePackingFields,
)
from telescope.schema.fields_learning import AlgorithmFields, OverlongAndOutputFiltersFields, TrainerFields
from telescope.schema.fields_operations import (
    CheckpointingFields,
    EvalsFields,
    FaultToleranceFields,
    LoggingFields,
    StandaloneEvalFields,
)
from telescope.schema.fields_run import (
    EnvironmentsFields,
    GeneralFields,
    ModelFields,
    OrchestratorFields,
    WorkersFields,
)


# pydantic orders the fields from the last base to the first: the sections are listed in
# reverse, so that the fields come in the order of the reference documentation.
class ConfigFields(
    WeightBroadcastingFields,
    RayClusterFields,
    LoggingFields,
    StandaloneEvalFields,
    EvalsFields,
    FaultToleranceFields,
    CheckpointingFields,
    SandboxesFields,
    InferenceServerFields,
    SequencePackingFields,
    CompactionFields,
    RolloutSamplingFields,
    OverlongAndOutputFiltersFields,
    AlgorithmFields,
    TrainerFields,
    OrchestratorFields,
    WorkersFields,
    EnvironmentsFields,
    ModelFields,
    GeneralFields,
):
    """The core's fields of a Telescope run, section by section."""
