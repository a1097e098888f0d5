"""Inference clients: ``InferenceClient`` (a callable TensorDict policy with ``submit``) and
``PolicyClientModule`` (a TensorDict module over an owner, a transport or a client)."""

from __future__ import annotations

import threading
from typing import Any, Sequence

from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase

from .modes import MODE_KEY, ambient_mode, check_mode, stamp
from .sampling import SAMPLE_SEED, random_seeds


class InferenceClient:
    """The restricted client of an inference server: ``client(td)`` and ``client.submit(td)``.

    Picklable along the rules of its transport (``thread``/``direct``: within the owner's process; process
    transports: as a ``Process`` argument). It has no lifecycle methods.

    Args:
        endpoint: a transport client endpoint.
        fills_seeds: the endpoint's fixed request layout holds ``sample_seed``: a request without one gets seeds
            from this process's torch generator (see `components.inference.sampling`).
        carries_modes: requests may carry an interaction-mode stamp (``False`` for a fixed request layout without
            ``interaction_mode``).
        mode: the interaction mode to stamp every request with (`with_mode`); ``None``: the mode of the caller's
            ``set_interaction_type`` block, if any (see `components.inference.modes`).
    """

    def __init__(self, endpoint: Any, fills_seeds: bool = False, carries_modes: bool = True, mode: str | None = None):
        self._endpoint = endpoint
        self._fills_seeds = fills_seeds
        self._carries_modes = carries_modes
        self._mode = mode

    def with_mode(self, mode: str) -> "InferenceClient":
        """A client of the same server whose requests are served in ``mode`` (``random``, ``deterministic``).

        Raises:
            ValueError: an unknown mode, or a transport whose fixed request layout has no room for the stamp.
        """
        check_mode(mode)
        if not self._carries_modes:
            raise ValueError(f"this server's fixed request layout has no {MODE_KEY!r} leaf, so its requests cannot "
                             "carry a mode: give the server the mode (components.inference.interaction_mode), or add "
                             f"{MODE_KEY!r} (uint8) to its request layout")
        return InferenceClient(self._endpoint, self._fills_seeds, self._carries_modes, mode)

    def submit(self, td: TensorDictBase):
        """Submit ``td``; returns a future whose ``result(timeout)`` is the response (outputs and ``policy_version``).

        Raises:
            LayoutError: a fixed-layout transport and ``td`` does not match (raised here, nothing is sent).
            PeerFailureError: the server is not running.
        """
        if self._fills_seeds and td.get(SAMPLE_SEED, None) is None:
            td = td.clone(False)  # the caller's TensorDict stays as it was
            td.set(SAMPLE_SEED, random_seeds(td.batch_size))
        mode = (self._mode or ambient_mode()) if self._carries_modes else None
        if mode is not None:
            td = stamp(td.clone(False), mode)
        return self._endpoint.submit(td)

    def __call__(self, td: TensorDictBase, timeout: float | None = None) -> TensorDictBase:
        """Run the policy on ``td`` and return ``td`` with the outputs and ``policy_version`` written in."""
        response = self.submit(td).result(timeout)
        td.update(response)
        return td


class DiscoveringEndpoint:
    """A ``distributed`` endpoint of a Ray-owned server built without layouts: the first request goes to the actor
    through Ray, where a probe forward on a clone of it gives the answer's layout; both layouts bind the endpoint,
    and the request itself then goes through it. Later requests must keep that layout (fixed per endpoint).

    Args:
        handle: the hosting actor (its ``call("probe", (td,))``).
        endpoint: an unbound client of the server's distributed transport.
    """

    def __init__(self, handle: Any, endpoint: Any):
        self.handle, self.endpoint = handle, endpoint
        self._bound = None
        self._lock = threading.Lock()

    def __reduce__(self):
        return (DiscoveringEndpoint, (self.handle, self.endpoint))

    def submit(self, td: TensorDictBase):
        """Send ``td``; the first call probes the server for the answer's layout and binds the endpoint.

        Returns:
            The future of the answer.
        """
        bound = self._bound
        if bound is None:
            with self._lock:
                if self._bound is None:
                    from transports.layout import Layout
                    from transports.ray import remote

                    request = Layout.from_tensordict(td)  # a request that cannot travel fails before the probe
                    answer = remote(self.handle, "call", ("probe", (td,)), "inference layout probe").result()
                    self._bound = self.endpoint.bind(self.endpoint.op, request, Layout.from_tensordict(answer))
                bound = self._bound
        return bound.submit(td)


class PolicyClientModule(TensorDictModuleBase):
    """A TensorDict module that serves ``in_keys`` -> ``out_keys`` through an inference server.

    Args:
        source: an inference owner, a transport, or a client: owners and transports are reduced to their
            restricted client here, so pickling the module never carries lifecycle.
        in_keys: keys sent to the server.
        out_keys: keys written back (``policy_version`` is a good one to keep).
        max_inflight: most requests this module keeps in flight at once (``None``: unbounded).

    Examples:
        >>> policy = PolicyClientModule(server, in_keys=["observation"], out_keys=["action", "policy_version"])
        >>> td = policy(TensorDict({"observation": obs}, [8]))
    """

    def __init__(self, source: Any, in_keys: Sequence = ("observation",), out_keys: Sequence = ("action",),
                 max_inflight: int | None = None):
        super().__init__()
        self.in_keys = list(in_keys)
        self.out_keys = list(out_keys)
        self.client = _reduce_to_client(source)
        self.max_inflight = max_inflight
        self._slots = threading.BoundedSemaphore(max_inflight) if max_inflight else None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_slots"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._slots = threading.BoundedSemaphore(self.max_inflight) if self.max_inflight else None

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """Send ``td``'s ``in_keys`` to the server and write the answer's ``out_keys`` into ``td``.

        Waits for the answer (and, with ``max_inflight``, for room among this module's requests in flight).
        """
        request = td.select(*self.in_keys)
        if self._slots is not None:
            with self._slots:
                response = self.client.submit(request).result()
        else:
            response = self.client.submit(request).result()
        td.update(response.select(*self.out_keys, strict=False))
        return td


def _reduce_to_client(source: Any) -> Any:
    from transports.base import Transport

    from ..service import Owner

    if isinstance(source, Owner):
        return source.client()
    if isinstance(source, Transport):
        return InferenceClient(source.client())
    if hasattr(source, "submit"):
        return source
    raise TypeError(f"PolicyClientModule needs an inference owner, transport or client, got {type(source).__name__}")
