"""The inference side of weight updates: the RPC methods, the receiving transport, loading in place.

Shared by the embedded server and vLLM workers.

Both servers take weight updates through the same remote calls, so the
orchestrator's one client drives both: ``POST /collective_rpc`` with
``{"method": <name>, "args": [<json string>]}`` (vLLM's dev-mode route, which
calls the method on every worker through the worker extension; the embedded
server implements the same route for its one "worker"):

- :data:`INIT_METHOD` (once): ``{"transport", "settings", "context", "init_info", "rank_offset"}``
  creates the named transport and connects it as receiver ``rank_offset + local
  rank`` (the TP rank in a vLLM server, 0 in the embedded one);
- :data:`UPDATE_METHOD` (every step): ``{"version", "load"}`` receives that version and
  loads it in place; returns ``{"policy_version", "num_tensors", "seconds", "start"}``
  (``start``: when the worker began receiving, UNIX seconds). With ``"load": false`` the
  worker *holds* its weights: it still takes part in the transfer (a collective transport
  needs every receiver) but discards what it receives, and ``policy_version`` stays the
  version it holds (an eval server in the middle of an eval keeps that eval's weights);
- :data:`VERSION_METHOD`: the weights version the worker holds.

Arguments are JSON strings because vLLM's route only forwards strings.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from telescope.api.transport import WeightTransport

INIT_METHOD = "telescope_init_weight_transfer"
UPDATE_METHOD = "telescope_update_weights"
VERSION_METHOD = "telescope_policy_version"
METHODS = (INIT_METHOD, UPDATE_METHOD, VERSION_METHOD)


def init_payload(
    transport: str,
    init_info: dict[str, Any],
    rank_offset: int,
    settings: dict[str, Any] | None = None,
    context: dict[str, Any] | None = None,
) -> str:
    """The init call's argument: the transport's name, its own settings and context (JSON), where to connect."""
    return json.dumps(
        {
            "transport": transport,
            "settings": settings,
            "context": context,
            "init_info": init_info,
            "rank_offset": rank_offset,
        }
    )


def update_payload(version: int, load: bool = True) -> str:
    return json.dumps({"version": version, "load": load})


def should_load(payload: str | dict[str, Any]) -> bool:
    """Whether an update payload asks to load the weights (False: receive and discard, keep the old ones)."""
    return bool(decode(payload).get("load", True))


def discard(weights: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Consume a received version without loading it (a held worker); returns the number of tensors."""
    return sum(1 for _ in weights)


def decode(payload: str | dict[str, Any]) -> dict[str, Any]:
    data = json.loads(payload) if isinstance(payload, str) else payload
    if not isinstance(data, dict):
        raise ValueError(f"a weight-sync payload must be a JSON object, got {type(data).__name__}")
    return data


class WeightReceiver:
    """Holds one receiving transport for a server or a vLLM worker."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.transport: WeightTransport | None = None
        self.rank: int | None = None

    def init(self, payload: str | dict[str, Any], local_rank: int = 0) -> dict[str, Any]:
        from telescope.api.context import TransportContext
        from telescope.plugins.facade import get_plugins
        from telescope.plugins.registry import PluginKind

        data = decode(payload)
        name = str(data["transport"])
        plugins = get_plugins()
        model = plugins.settings_model(PluginKind.WEIGHT_TRANSPORT, name)
        settings = model.model_validate(data.get("settings") or {}) if model is not None else None
        context = TransportContext.from_dict(data.get("context") or {})
        if self.transport is not None:
            self.transport.close()
        self.transport = plugins.weight_transport(name)(context, settings)
        self.rank = int(data.get("rank_offset", 1)) + local_rank
        self.transport.connect_receiver(dict(data.get("init_info") or {}), self.rank, self.device)
        return {"rank": self.rank, "transport": self.transport.name}

    @property
    def streams(self) -> bool:
        """Whether :meth:`receive` yields tensors while later ones are still sent (load each as it comes)."""
        return self.transport is not None and self.transport.streams_while_sent

    def receive(self, payload: str | dict[str, Any]) -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
        if self.transport is None:
            raise RuntimeError(f"weight transfer is not initialised; call {INIT_METHOD} first")
        version = int(decode(payload)["version"])
        return version, self.transport.receive(version)


# ------------------------------------------------------------------ loading in place


def load_named_tensors(module: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy each ``(name, tensor)`` into ``module``'s state (dtype and device converted); returns the count."""
    import torch

    targets = module.state_dict(keep_vars=True)
    count = 0
    with torch.no_grad():
        for name, tensor in weights:
            target = targets.get(name)
            if target is None:
                known = ", ".join(list(targets)[:5])
                raise KeyError(
                    f"received weight {name!r} has no counterpart in the inference model "
                    f"(its names look like: {known}, ...); the trainer must send Hugging Face names"
                )
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"received weight {name!r} has shape {tuple(tensor.shape)}, the inference model "
                    f"expects {tuple(target.shape)}"
                )
            target.data.copy_(tensor, non_blocking=False)
            count += 1
    return count
