"""Where a run runs: the Ray cluster and the weight broadcast.

Each class is one section of the reference documentation (:mod:`telescope.schema.sections`);
:class:`~telescope.schema.config.TelescopeConfig` composes them.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from telescope.schema.sections import SectionFields
from telescope.schema.types import PlacementStrategy


class RayClusterFields(SectionFields):
    """The fields of the 'ray cluster' section."""

    section: ClassVar[str] = "ray cluster"

    ray_address: str = Field(
        "auto",
        description='Ray cluster address ("auto": RAY_ADDRESS or the cluster `ray start` made here; "local": private)',
    )
    ray_auto_start_local: bool = Field(
        True, description="Start a local Ray cluster, private to the run, if there is none to attach to"
    )
    ray_namespace: str = Field("telescope", description="Ray namespace")
    ray_log_to_driver: bool = Field(True, description="Forward worker logs to the driver process")
    ray_runtime_env: dict[str, Any] | None = Field(None, description="Custom Ray runtime environment")
    ray_disable_runtime_env_hook: bool = Field(True, description="Disable Ray's runtime environment hook")
    ray_pin_py_executable: bool = Field(True, description="Pin the Python executable path in workers")
    ray_propagate_active_venv: bool = Field(True, description="Propagate the active virtualenv to workers")
    ray_propagate_run_dir: bool = Field(
        True, description="Propagate the run directory to workers (true only: every worker is given it)"
    )
    ray_worker_keep_freed_memory: bool = Field(
        True,
        description="Workers keep the memory they free for their next allocations (glibc malloc: "
        "MALLOC_MMAP_THRESHOLD_=1 GiB, MALLOC_TRIM_THRESHOLD_=1 TiB) instead of returning it to the OS and faulting "
        "it in again every step; values set in ray_runtime_env's env_vars or in the environment win (a private "
        "cluster's own processes get them too: its workers inherit them from the environment it starts in)",
    )
    ray_broadcast_init_timeout_s: int = Field(300, ge=1, description="Timeout for weight broadcast initialization")
    ray_broadcast_prefer_loopback_if_single_node: bool = Field(
        True, description="Prefer the loopback interface for single-node broadcasts"
    )
    ray_shutdown_on_exit: bool = Field(False, description="Shut down the Ray cluster on exit")
    ray_inference_cpus_per_worker: float = Field(4.0, gt=0, description="CPU cores per inference worker")
    ray_trainer_cpus_per_worker: float = Field(4.0, gt=0, description="CPU cores per trainer worker")
    ray_inference_placement_strategy: PlacementStrategy = Field("PACK", description="Placement of inference workers")
    ray_trainer_placement_strategy: PlacementStrategy = Field("PACK", description="Placement of trainer workers")
    ray_inference_resources_per_worker: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources per inference worker, e.g. {node_b: 1}: servers go to nodes that offer them",
    )
    ray_trainer_resources_per_worker: dict[str, float] = Field(
        default_factory=dict,
        description="Custom Ray resources per trainer worker, e.g. {node_a: 1}: ranks go to nodes that offer them",
    )
    ray_placement_timeout_s: int = Field(900, ge=1, description="Timeout for placement group creation")


class WeightBroadcastingFields(SectionFields):
    """The fields of the 'weight broadcasting' section."""

    section: ClassVar[str] = "weight broadcasting"

    weight_transport: str = Field(
        "auto", description='Weight transport ("memory", "nccl" or a plugin). "auto" = nccl on GPU, memory on CPU'
    )
    weight_broadcast_free_grad_buffers: bool = Field(
        True,
        description="Free gradient buffers during broadcast (true only: the trainers free the gradients "
        "after every optimizer step)",
    )
