"""The NCCL weight transport: broadcast from trainer rank 0 to every inference worker (GPU).

Group: a process group of its own (not torch's default group, which the
trainer's FSDP and each vLLM server already use), world size ``1 +`` the number
of receiving processes; the trainer's rank 0 is rank 0. The sender opens a
``TCPStore`` (:meth:`prepare_sender` returns its address); receivers connect
with their rank (:meth:`connect_receiver`). The communicator itself is created
on the first ``send`` / ``receive``, which all ranks enter together.

One update:

1. a header (version, manifest length) and the JSON manifest
   (:mod:`telescope.transports.bucketing`) are broadcast, so receivers need no
   prior knowledge of names, shapes or dtypes;
2. ``weight_broadcast_mode: flattened_bucket``: tensors are packed into byte
   buckets of ``weight_broadcast_bucket_mb`` and each bucket is one broadcast
   (few large collectives, fast); ``per_tensor``: one broadcast per tensor in
   its own dtype (no packing buffer, less memory);
3. ``weight_broadcast_cpu_staging``: the sender packs each bucket in CPU memory
   (pinned when ``weight_broadcast_pin_memory``) and copies it to the GPU just
   before its broadcast, so full-size GPU copies of gathered weights need not
   coexist with the bucket; useful when the trainer's weights are offloaded.

Receivers yield the tensors as buckets arrive (views into the bucket), so a
vLLM worker loads bucket by bucket. A receiver must consume the whole iterator:
a collective that one rank skips blocks the others (until the timeout,
``ray_broadcast_init_timeout_s``).

Without CUDA the same code runs over gloo on CPU tensors; that is how its
protocol is tested here. The NCCL path itself (``ProcessGroupNCCL``, pinned
staging, H2D copies) needs a GPU machine and is covered by tests marked ``gpu``.
Where the rendezvous is: the sender (trainer rank 0) hosts the ``TCPStore``; it
is dialled at loopback only when ``ray_broadcast_prefer_loopback_if_single_node`` is
set and the run placed the sender and every receiver on one node
(``TransportContext.single_node``, computed from the placement), else at rank 0's
node address (``TransportContext.sender_host``, as Ray reports it), or
``TELESCOPE_WEIGHT_BROADCAST_HOST`` when set. The store listens on that address
only (a socket bound to it, handed to the store), not on every interface. Over
gloo every rank binds the interface that routes to that host
(:func:`telescope.system.addressing.local_address_towards`),
not the address its hostname resolves to, which is often loopback and unreachable
from another node; NCCL picks its interfaces itself (``NCCL_SOCKET_IFNAME``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from telescope.api.transport import WeightTransport
from telescope.system.addressing import bound_socket, local_address_towards, rendezvous_host
from telescope.transports.bucketing import Manifest, dtype_from_name, pack, plan, unpack

if TYPE_CHECKING:
    from telescope.api.context import TransportContext
    from telescope.transports.plugin import NCCLSettings

_PREFIX = "telescope-weights"


class NCCLTransport(WeightTransport):
    """Broadcast weights over a dedicated process group (see the module docstring)."""

    name = "nccl"

    def __init__(
        self,
        context: TransportContext | None = None,
        settings: NCCLSettings | None = None,
        *,
        backend: str | None = None,
    ) -> None:
        from telescope.transports.plugin import NCCLSettings

        super().__init__(context, settings)
        own = settings or NCCLSettings()
        self.backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        self.mode = own.weight_broadcast_mode
        self.bucket_bytes = own.weight_broadcast_bucket_mb << 20
        self.cpu_staging = own.weight_broadcast_cpu_staging
        self.pin_memory = own.weight_broadcast_pin_memory
        self.timeout_s = self.context.timeout_s
        self.prefer_loopback = self.context.prefer_loopback_if_single_node
        self.single_node = self.context.single_node  # from the run's placement (True for a hand-built context)
        self.rank: int | None = None
        self.world_size: int | None = None
        self.device = torch.device("cpu")
        self._store: Any = None
        self._address: tuple[str, int] | None = None
        self._group: Any = None
        self.last_send_seconds = 0.0

    # ------------------------------------------------------------------- setup
    def _default_device(self) -> torch.device:
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def prepare_sender(self, num_receivers: int) -> dict[str, Any]:
        if num_receivers < 1:
            raise ValueError("the nccl transport needs at least one receiver")
        host = rendezvous_host(self.prefer_loopback, self.single_node, self.context.sender_host)
        listening = bound_socket(host, 0)  # that address only: a TCPStore left to itself listens on every one
        listening.listen()
        port = int(listening.getsockname()[1])
        self._store = dist.TCPStore(
            host,
            port,
            world_size=None,
            is_master=True,
            timeout=timedelta(seconds=self.timeout_s),
            wait_for_workers=False,
            master_listen_fd=listening.detach(),  # the store owns (and closes) the socket from here
        )
        self._address = (host, int(self._store.port))
        self.rank, self.world_size = 0, num_receivers + 1
        self.device = self._default_device()
        return {
            "transport": self.name,
            "host": host,
            "port": self._address[1],
            "world_size": self.world_size,
            "backend": self.backend,
        }

    def connect_receiver(self, init_info: dict[str, Any], rank: int, device: str = "cpu") -> None:
        for key in ("host", "port", "world_size"):
            if key not in init_info:
                raise ValueError(f"nccl transport init info lacks {key!r}: {init_info}")
        if not 0 < rank < int(init_info["world_size"]):
            raise ValueError(f"receiver rank {rank} is outside 1..{int(init_info['world_size']) - 1}")
        self.backend = str(init_info.get("backend", self.backend))
        self._address = (str(init_info["host"]), int(init_info["port"]))
        self.rank, self.world_size = rank, int(init_info["world_size"])
        self.device = torch.device(device) if self.backend == "nccl" else torch.device("cpu")

    def _ensure_group(self) -> Any:
        if self._group is not None:
            return self._group
        if self._address is None or self.rank is None or self.world_size is None:
            raise RuntimeError("the nccl transport is not set up: call prepare_sender or connect_receiver first")
        timeout = timedelta(seconds=self.timeout_s)
        store = self._store or dist.TCPStore(self._address[0], self._address[1], is_master=False, timeout=timeout)
        self._store = store
        prefixed = dist.PrefixStore(_PREFIX, store)
        if self.backend == "gloo":
            options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # not in torch's stubs
            options._timeout = timeout
            # bind the interface that reaches the rendezvous host (see the module docstring)
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=local_address_towards(self._address[0]))]
            self._group = dist.ProcessGroupGloo(prefixed, self.rank, self.world_size, options)
        else:
            from torch.distributed import ProcessGroupNCCL

            torch.cuda.set_device(self.device)
            options = ProcessGroupNCCL.Options()
            options._timeout = timeout
            self._group = ProcessGroupNCCL(prefixed, self.rank, self.world_size, options)
        return self._group

    def _broadcast(self, tensor: torch.Tensor) -> None:
        self._ensure_group().broadcast(tensor, 0).wait()

    # ------------------------------------------------------------------ sender
    def send(self, weights: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        start = time.perf_counter()
        items = [(name, tensor.detach()) for name, tensor in weights]
        manifest = plan(items, version, self.bucket_bytes, self.mode)
        header = manifest.to_json().encode("utf-8")
        self._broadcast(torch.tensor([version, len(header)], dtype=torch.int64, device=self.device))
        self._broadcast(torch.frombuffer(bytearray(header), dtype=torch.uint8).to(self.device))
        if self.mode == "per_tensor":
            for _, tensor in items:
                self._broadcast(tensor.contiguous().to(self.device))
        else:
            members: dict[int, list[int]] = {}
            for index, spec in enumerate(manifest.tensors):
                members.setdefault(spec.bucket, []).append(index)
            for bucket, size in enumerate(manifest.bucket_sizes):
                specs = [manifest.tensors[i] for i in members[bucket]]
                tensors = [items[i][1] for i in members[bucket]]
                self._broadcast(self._pack_bucket(tensors, specs, size))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.last_send_seconds = time.perf_counter() - start

    def _pack_bucket(self, tensors: list[torch.Tensor], specs: list[Any], size: int) -> torch.Tensor:
        if self.cpu_staging and self.device.type == "cuda":
            staging = torch.empty(size, dtype=torch.uint8, pin_memory=self.pin_memory)
            pack(tensors, specs, staging)
            torch.cuda.synchronize()
            return staging.to(self.device, non_blocking=self.pin_memory)
        return pack(tensors, specs, torch.empty(size, dtype=torch.uint8, device=self.device))

    # ---------------------------------------------------------------- receiver
    def receive(self, version: int) -> Iterator[tuple[str, torch.Tensor]]:
        header = torch.empty(2, dtype=torch.int64, device=self.device)
        self._broadcast(header)
        sent_version, length = (int(x) for x in header.tolist())
        raw = torch.empty(length, dtype=torch.uint8, device=self.device)
        self._broadcast(raw)
        manifest = Manifest.from_json(raw.cpu().numpy().tobytes().decode("utf-8"))
        if sent_version != version or manifest.version != version:
            raise RuntimeError(
                f"expected weights version {version}, the sender broadcast version {sent_version}; "
                "sender and receivers must update in the same order"
            )
        if manifest.mode == "per_tensor":
            for spec in manifest.tensors:
                tensor = torch.empty(spec.shape, dtype=dtype_from_name(spec.dtype), device=self.device)
                self._broadcast(tensor)
                yield spec.name, tensor
            return
        for bucket, size in enumerate(manifest.bucket_sizes):
            buffer = torch.empty(size, dtype=torch.uint8, device=self.device)
            self._broadcast(buffer)
            yield from unpack(buffer, manifest.bucket_specs(bucket))

    def close(self) -> None:
        self._group = None
        self._store = None
