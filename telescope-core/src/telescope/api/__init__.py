"""The public API: record types and the interface of every plugin kind.

Import from here (``from telescope.api import BaseEnvironment, RewardResult``);
nothing here imports torch. :mod:`telescope.api.events` is the timeline event bus any
component, a plugin's included, emits on.
"""

from telescope.api.agent import AgentEnvironment
from telescope.api.algorithm import Algorithm, AlgorithmCapabilities, AlgorithmConfig
from telescope.api.browser import BrowserError, BrowserLimits, BrowserProvider, BrowserSession
from telescope.api.context import EnvironmentContext
from telescope.api.environment import (
    BaseEnvironment,
    EnvironmentBase,
    MultiTurnEnvironment,
    RolloutState,
)
from telescope.api.evals import EvalSpec
from telescope.api.inference import InferenceBackend, InferenceServer, ServerAddress
from telescope.api.logger import Logger
from telescope.api.records import (
    Group,
    Message,
    RewardResult,
    Rollout,
    Sample,
    TrainingBatch,
    TrainingSample,
    Turn,
)
from telescope.api.sandbox import ExecResult, Sandbox, SandboxError, SandboxLimits, SandboxProvider
from telescope.api.tools import ToolCall, ToolEnvironment, function_to_schema, parse_xml_tool_calls
from telescope.api.trainer import TrainerBackend
from telescope.api.transport import WeightTransport

__all__ = [
    "AgentEnvironment",
    "Algorithm",
    "AlgorithmCapabilities",
    "AlgorithmConfig",
    "BaseEnvironment",
    "BrowserError",
    "BrowserLimits",
    "BrowserProvider",
    "BrowserSession",
    "EnvironmentBase",
    "EnvironmentContext",
    "EvalSpec",
    "ExecResult",
    "Group",
    "InferenceBackend",
    "InferenceServer",
    "Logger",
    "Message",
    "MultiTurnEnvironment",
    "RewardResult",
    "Rollout",
    "RolloutState",
    "Sample",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxProvider",
    "ServerAddress",
    "ToolCall",
    "ToolEnvironment",
    "TrainerBackend",
    "TrainingBatch",
    "TrainingSample",
    "Turn",
    "WeightTransport",
    "function_to_schema",
    "parse_xml_tool_calls",
]
