"""The inference service: one policy, many callers, auto-batched.

``InferenceServer`` owns the behaviour policy, its device and its weights, and stamps every answer with
``policy_version``. The policy is built where the server's placement puts it (see
`ServedPolicy`); clients reach it through the resolved transport. Placed
``direct``, there is no serving loop: the client is the owner and a call is one forward pass in the caller's
thread.
"""

from __future__ import annotations

import functools
from concurrent.futures import Future
from typing import Any, Callable, Mapping

import torch
from tensordict import TensorDictBase
from torch import nn

from transports import registry as transport_registry
from transports.kernel.errors import ConfigurationError, IncompatibleCombinationError

from ..resolution import Resolved
from ..scope import choose_transport
from ..service import Owner
from .client import DiscoveringEndpoint, InferenceClient
from .config import InferenceServerConfig
from .modes import MODE_KEY
from .sampling import with_seed_leaf
from .target import UPDATE_TIMEOUT, ServedPolicy, keep


class InferenceServer(Owner["InferenceServer"]):
    """Auto-batching policy server.

    Args:
        config: where it runs, batching, statistics and devices (`InferenceServerConfig`; ``None``: its
            defaults).
        policy: a TensorDict module (reads ``observation``, writes ``action``...). Only for placements in this
            process; elsewhere the policy is built where the server lives: pass ``policy_factory``.
        policy_factory: a picklable callable returning the policy, called where the server lives.
        weight_sync: a weight-sync client polled between batches.
        request_layout: layout (or representative TensorDict) of one request; fixed-layout transports need it.
        response_layout: layout of one response (outputs and ``policy_version``). Give both layouts or neither.
        collate_fn: combines requests into a batch (default: stack along a new first dimension).
        transport: overrides ``config.transport``: a kind, a `TransportConfig`, or a transport
            instance (validated against the placement like a name); ``None`` and no ``config.transport`` take the
            ``transport_backend`` context, else ``auto``.
        resolved: the plan's resolution of this server (placement, transport, layouts, resources).

    Raises:
        IncompatibleCombinationError: only one of the two layouts is given (whatever the transport: ``auto``
            never drops a half layout for ``queue``), or the placement does not support the transport.

    Examples:
        >>> server = InferenceServer(InferenceServerConfig(placement="thread"), policy_factory=make_policy)
        >>> with server:
        ...     td = server.client()(TensorDict({"observation": obs}, [8]))
    """

    component = "inference"

    def __init__(
        self,
        config: InferenceServerConfig | None = None,
        *,
        policy: nn.Module | None = None,
        policy_factory: Callable[[], nn.Module] | None = None,
        weight_sync: Any = None,
        request_layout: Any = None,
        response_layout: Any = None,
        collate_fn: Callable | None = None,
        transport: Any = None,
        resolved: Resolved | None = None,
    ):
        if (policy is None) == (policy_factory is None):
            raise ConfigurationError("InferenceServer needs exactly one of policy or policy_factory")
        config = config or InferenceServerConfig()
        if resolved is not None:
            request_layout = request_layout if request_layout is not None else resolved.layouts.get("request")
            response_layout = response_layout if response_layout is not None else resolved.layouts.get("response")
        _require_both_layouts(request_layout, response_layout, transport if transport is not None else
                              config.transport, resolved)  # before auto chooses
        super().__init__(config, transport=transport, layouts_known=request_layout is not None, resolved=resolved)
        if policy is not None and not self.host_type.same_process:
            raise ConfigurationError(
                f"{self.placement} placement requires policy_factory: the policy is constructed where the server lives",
                path="components.inference",
            )
        self._build = policy_factory if policy is None else functools.partial(keep, policy)
        self._weight_sync = weight_sync
        self._collate = collate_fn
        # requests carry their rows' sampling seeds (see .sampling); a client fills them in where a caller did not
        self.request_layout = None if request_layout is None else with_seed_leaf(request_layout)
        self.response_layout = response_layout
        if config.static_batch_size is not None:
            _check_static(config, self.placement, self.inline, self.request_layout)

    # ------------------------------------------------------------------ hosting
    def _target(self, server_side: Any) -> Callable[[], ServedPolicy]:
        return functools.partial(ServedPolicy, self._build, server_side, self.config, self._weight_sync, self._collate,
                                 self.request_layout)

    def _layouts(self) -> dict:
        return {"request_layout": self.request_layout, "response_layout": self.response_layout}

    @classmethod
    def hosts_of(cls, resolved: Resolved) -> tuple[int, ...]:
        return (max(resolved.config.max_batch_size, 2) + 2,)  # an actor takes that many requests at once, to batch them

    def _client(self) -> InferenceClient:
        endpoint = self._transport.client()
        if self.descriptor.fixed_layout and self.request_layout is None:  # a Ray owner discovers them
            endpoint = DiscoveringEndpoint(self._host.handle, endpoint)
        return self._wrap(endpoint)

    def _wrap(self, endpoint: Any) -> InferenceClient:
        layout = self.request_layout
        return InferenceClient(endpoint, fills_seeds=layout is not None,
                               carries_modes=layout is None or (MODE_KEY,) in layout.keys)

    # ------------------------------------------------------------------ in the caller: the owner serves
    @property
    def policy_version(self) -> int:
        """How many weight updates this server has applied (or the version last pushed to it)."""
        return int(self._host.call("version", timeout=UPDATE_TIMEOUT))

    def __call__(self, td: TensorDictBase, timeout: float | None = None) -> TensorDictBase:
        """Run the policy on ``td`` and return it with the outputs and ``policy_version`` written in."""
        if not self.inline:
            raise TypeError(f"call the client (owner.client()) of a server placed {self.placement!r}")
        self._require_running()
        return self._host.target.forward(td)

    def submit(self, td: TensorDictBase) -> Future:
        """Submit ``td``; the returned future holds the answer (already complete in the caller's thread)."""
        future: Future = Future()
        try:
            future.set_result(self(td))
        except BaseException as exc:  # the future carries the failure to whoever waits on it
            future.set_exception(exc)
        return future

    # ------------------------------------------------------------------ owner-side operations
    def update_weights(self, weights: nn.Module | Mapping[str, torch.Tensor], version: int | None = None) -> int:
        """Copy ``weights`` (a module or a state dict) into the served policy, in place, between batches.

        Returns:
            The new ``policy_version`` (once applied: a request served afterwards sees it).
        """
        self._require_running()
        state = weights.state_dict() if isinstance(weights, nn.Module) else dict(weights)
        if not self.host_type.same_process:
            state = {k: v.detach().cpu() for k, v in state.items()}
        return int(self._host.call("update_weights", state, version, timeout=UPDATE_TIMEOUT))

    def stats(self) -> dict:
        """Batch-size histogram and p50/p95 of queue wait and forward time (seconds) over the stats window."""
        self._require_running()
        return self._host.call("stats", timeout=UPDATE_TIMEOUT)


def _check_static(config: InferenceServerConfig, placement: str, inline: bool, request_layout: Any) -> None:
    """Refuse static batches where they cannot be captured: without a serving loop (an owner called in the caller's
    thread, ``direct``) or without the request layout the graph's input is made from."""
    path = "components.inference.static_batch_size"
    config.check_placement(placement, inline=inline)
    if request_layout is None:
        raise ConfigurationError(
            f"{path}={config.static_batch_size} needs the layout of one request to capture its graph for: pass "
            "request_layout (and response_layout), or a representative TensorDict (the launcher derives both)",
            path=path)


def _require_both_layouts(request_layout: Any, response_layout: Any, transport: Any, resolved: Resolved | None) -> None:
    """Refuse a half fixed layout when the server is built, naming the missing one (a fixed-layout transport
    would fail only at start, and ``auto`` would quietly pick ``queue``)."""
    if (request_layout is None) == (response_layout is None):
        return
    given, missing = (("request_layout", "response_layout") if request_layout is not None
                      else ("response_layout", "request_layout"))
    if resolved is not None:
        kind = resolved.transport
    else:  # a transport instance carries its config; a config its kind; None means the scope, else auto
        config = getattr(transport, "config", transport)
        kind = choose_transport(getattr(config, "kind", config)).value
    raise IncompatibleCombinationError(
        f"inference server has {given} but no {missing} (transport {kind!r}): a fixed layout needs both (transports "
        f"{', '.join(sorted(d.kind for d in transport_registry.descriptors() if d.fixed_layout))}), and half of one "
        f"never falls back to 'queue'; pass {missing} too, "
        "or neither",
        path=f"components.inference.{missing}", alternatives=(f"{given} and {missing}", "neither (transport 'queue')"),
    )
