"""The inference service: one policy, many callers, auto-batched.

``InferenceServer`` owns the behaviour policy, its device and its weights, and stamps every answer with
``policy_version``. Placement ``direct`` has no server thread: the client is the owner and a call is one
forward pass in the caller's thread. ``thread`` runs the serving loop on a thread of this process;
``process`` builds the policy from ``policy_factory`` in a child process and serves there; ``ray`` does the
same in a Ray actor (see :mod:`components.inference.ray_server`).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Callable, Mapping

import torch
from tensordict import TensorDictBase
from torch import nn

from transports.base import RequestReplyTransport, Transport
from transports.errors import ConfigurationError

from ..process import ChildProcess
from ..service import Owner
from .client import InferenceClient
from .config import InferenceDeviceConfig, InferenceServerConfig
from .core import ServingCore, copy_weights

UPDATE_TIMEOUT = 60.0


def build_transport(kind: str, options: Mapping[str, Any], request_layout, response_layout) -> RequestReplyTransport:
    """Construct the request/reply transport of ``kind`` (imports only the module it needs)."""
    options = dict(options)
    if kind == "thread":
        from transports.thread import ThreadTransport

        return ThreadTransport(**options)
    if kind == "direct":
        from transports.direct import DirectSlotTransport

        return DirectSlotTransport(**options)
    if kind == "queue":
        from transports.queue import QueueTransport

        return QueueTransport(**options)
    if kind in ("shared_memory", "process_slot"):
        if request_layout is None or response_layout is None:
            raise ConfigurationError(
                f"transport {kind!r} needs request_layout and response_layout (fixed layouts); pass them, or use "
                "transport 'queue' for payloads whose layout is not known up front",
                path="components.inference.transport",
                alternatives=("queue",),
            )
        if kind == "shared_memory":
            from transports.shared_memory import SharedMemoryTransport as cls
        else:
            from transports.process_slot import ProcessSlotTransport as cls
        return cls(request_layout, response_layout, **options)
    raise ConfigurationError(f"no inference transport {kind!r} is built", path="components.inference.transport")


class InferenceServer(Owner["InferenceServer"]):
    """Auto-batching policy server.

    Args:
        policy: a TensorDict module (reads ``observation``, writes ``action``...). Not for ``process``
            placement, where the policy is built in the child: pass ``policy_factory``.
        policy_factory: a picklable callable returning the policy, called where the server lives.
        config: execution and batching settings (:class:`InferenceServerConfig`).
        device_config: devices (:class:`InferenceDeviceConfig`).
        transport: a kind, a :class:`~transports.TransportConfig`, or a transport instance (validated against
            the placement like a name); ``None`` takes the ``transport_backend`` context, else ``auto``.
        weight_sync: a weight-sync client polled between batches.
        request_layout: layout (or representative TensorDict) of one request; fixed-layout transports need it.
        response_layout: layout of one response (outputs and ``policy_version``).
        collate_fn: combines requests into a batch (default: stack along a new first dimension).

    Example:
        >>> server = InferenceServer(policy_factory=make_policy, config=InferenceServerConfig(placement="thread"))
        >>> with server:
        ...     td = server.client()(TensorDict({"observation": obs}, [8]))
    """

    component = "inference"

    def __init__(
        self,
        policy: nn.Module | None = None,
        *,
        policy_factory: Callable[[], nn.Module] | None = None,
        config: InferenceServerConfig | None = None,
        device_config: InferenceDeviceConfig | None = None,
        transport: Any = None,
        weight_sync: Any = None,
        request_layout: Any = None,
        response_layout: Any = None,
        collate_fn: Callable | None = None,
    ):
        if (policy is None) == (policy_factory is None):
            raise ConfigurationError("InferenceServer needs exactly one of policy or policy_factory")
        self.config = config or InferenceServerConfig()
        self.device_config = device_config or InferenceDeviceConfig()
        layouts_known = request_layout is not None and response_layout is not None
        super().__init__(placement=self.config.placement, transport=transport, layouts_known=layouts_known)
        if self.placement in ("process", "ray") and policy is not None:
            raise ConfigurationError(
                f"{self.placement} placement requires policy_factory: the policy is constructed where the server lives",
                path="components.inference",
            )
        self._policy = policy
        self._policy_factory = policy_factory
        self._weight_sync = weight_sync
        self._collate = collate_fn
        self.request_layout = request_layout
        self.response_layout = response_layout
        self._transport: RequestReplyTransport | None = transport if isinstance(transport, Transport) else None
        self._core: ServingCore | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._child: ChildProcess | None = None
        self._actor: Any = None  # placement ray: the serving RayActor
        self._version = 0
        self._lock = threading.Lock()
        self._device = torch.device(self.device_config.policy_device)

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        if self.placement == "direct":
            self._policy = (self._policy if self._policy is not None else self._policy_factory()).to(self._device).eval()
            return
        if self.placement == "ray":
            from ..ray_support import RayActor
            from .ray_server import InferenceActor

            self._actor = RayActor(
                InferenceActor, "inference-server",
                (self._policy_factory, self.config, self.device_config, self._weight_sync, self._collate),
                self.resources, max_concurrency=max(self.config.max_batch_size, 2) + 2,
            ).wait_ready()
            return
        if self._transport is None:
            self._transport = build_transport(
                self.transport_kind, self.transport_config.options, self.request_layout, self.response_layout
            )
        if self.placement == "thread":
            policy = self._policy if self._policy is not None else self._policy_factory()
            self._core = ServingCore(policy.to(self._device).eval(), self._transport.server(), self.config,
                                     self.device_config, self._weight_sync, self._collate)
            self._thread = threading.Thread(target=self._serve_thread, name="inference-server", daemon=True)
            self._transport.mark_serving(0)
            self._thread.start()
            return
        self._child = ChildProcess(
            "inference-server",
            _serve_in_child,
            (self._policy_factory, self._transport.server_side(), self.config, self.device_config, self._weight_sync,
             self._collate),
            on_death=lambda reason: self._transport.mark_dead(stopped=False),
        )
        pid = self._child.start()
        self._transport.mark_serving(pid)

    def _serve_thread(self) -> None:
        try:
            self._core.run(self._stop)
        finally:
            if not self._stop.is_set():  # the loop died on its own
                self._transport.mark_dead(stopped=False)

    def _shutdown(self, timeout: float | None) -> None:
        if self._actor is not None:
            self._actor.stop(timeout)
            self._actor = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout if timeout is not None else 10.0)
            self._thread = None
        if self._child is not None:
            self._child.stop(timeout)
            self._child = None
        if self._transport is not None:
            self._transport.mark_dead(stopped=True)
            self._transport.close()

    def _alive(self) -> bool:
        if self._actor is not None:
            return self._actor.is_alive
        if self._thread is not None:
            return self._thread.is_alive()
        if self._child is not None:
            return self._child.is_alive
        return True

    def _client(self) -> InferenceClient:
        if self._actor is not None:
            from .ray_server import RayInferenceEndpoint

            return InferenceClient(RayInferenceEndpoint(self._actor.handle))
        return InferenceClient(self._transport.client())

    # ------------------------------------------------------------------ direct placement: the owner serves
    @property
    def policy_version(self) -> int:
        """How many weight updates this server has applied (or the version last pushed to it)."""
        if self.placement == "direct":
            return self._version
        if self._core is not None:
            return self._core.version
        if self._actor is not None:
            return int(self._actor.call("version", timeout=UPDATE_TIMEOUT))
        return int(self._child.call("version"))

    @torch.no_grad()
    def __call__(self, td: TensorDictBase, timeout: float | None = None) -> TensorDictBase:
        """Run the policy on ``td`` and return it with the outputs and ``policy_version`` written in."""
        if self.placement != "direct":
            raise TypeError("call the client (owner.client()) of a server that is not placed 'direct'")
        self._require_running()
        with self._lock:
            self._poll_weights()
            source_device = td.device
            out = self._policy(td.to(self._device) if td.device != self._device else td)
            version = self._version
        out.set("policy_version", torch.full(out.batch_size, version, dtype=torch.long, device=out.device))
        target = self.device_config.output_device or source_device
        if target is not None and out.device != torch.device(target):
            out = out.to(target)
        return out

    def submit(self, td: TensorDictBase) -> Future:
        """Submit ``td``; the returned future holds the answer (already complete for ``direct``)."""
        future: Future = Future()
        try:
            future.set_result(self(td))
        except BaseException as exc:  # the future carries the failure to whoever waits on it
            future.set_exception(exc)
        return future

    def _poll_weights(self) -> None:
        if self._weight_sync is not None:
            update = self._weight_sync.poll(self._version, into=self._policy)
            if update is not None:
                self._version = update

    # ------------------------------------------------------------------ owner-side operations
    def update_weights(self, weights: nn.Module | Mapping[str, torch.Tensor], version: int | None = None) -> int:
        """Copy ``weights`` (a module or a state dict) into the served policy, in place, between batches.

        Returns:
            The new ``policy_version`` (once applied: a request served afterwards sees it).
        """
        self._require_running()
        state = weights.state_dict() if isinstance(weights, nn.Module) else dict(weights)
        if self.placement == "direct":
            with self._lock:
                copy_weights(self._policy, state)
                self._version = self._version + 1 if version is None else int(version)
                return self._version
        if self._core is not None:
            return self._core.request_update(state, version).result(UPDATE_TIMEOUT)
        state = {k: v.detach().cpu() for k, v in state.items()}
        if self._actor is not None:
            return int(self._actor.call("update_weights", state, version, timeout=UPDATE_TIMEOUT))
        return int(self._child.call("update_weights", (state, version), timeout=UPDATE_TIMEOUT))

    def stats(self) -> dict:
        """Batch-size histogram and p50/p95 of queue wait and forward time (seconds) over the stats window."""
        self._require_running()
        if self.placement == "direct":
            return {"batches": 0, "requests": 0, "mean_batch_size": 0.0, "batch_size_histogram": {}}
        if self._core is not None:
            return self._core.stats.snapshot()
        if self._actor is not None:
            return self._actor.call("stats", timeout=UPDATE_TIMEOUT)
        return self._child.call("stats")


class _ChildServer:
    """What runs in the child process: the policy, the server endpoint and the loop."""

    def __init__(self, policy_factory, transport, config, device_config, weight_sync, collate_fn):
        torch.set_num_threads(1)
        device = torch.device(device_config.policy_device)
        policy = policy_factory().to(device).eval()
        self.core = ServingCore(policy, transport.server(), config, device_config, weight_sync, collate_fn)

    def run(self, stop: threading.Event) -> None:
        self.core.run(stop)

    def handle(self, command: str, payload: Any) -> Any:
        if command == "update_weights":
            state, version = payload
            return self.core.request_update(state, version).result(UPDATE_TIMEOUT)
        if command == "stats":
            return self.core.stats.snapshot()
        if command == "version":
            return self.core.version
        raise ValueError(f"unknown command {command!r}")

    def close(self) -> None:
        pass


def _serve_in_child(*args) -> _ChildServer:
    return _ChildServer(*args)


