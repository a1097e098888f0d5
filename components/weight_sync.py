"""Weight sync: a versioned channel from the learner to inference owners and collectors.

``push(module)`` publishes a new version; receivers ``poll(since, into=module)`` between their batches and
copy a newer version in place; versions are monotonic.

- ``direct``: receivers share the process and thread; a push hands over references (no copy).
- ``thread``: receivers on other threads; a push snapshots the state so a receiver never sees a torn one.
- ``process`` (transport ``shared_memory``): the state lives in one shared-memory segment laid out from a
  template state dict, guarded by a sequence counter (a reader retries if a push overlapped its copy). The
  client is picklable by segment name and reaches receivers in any process of the host.
- ``ray``: the versions live in an actor; pushes and polls are actor calls, tensors go through the object
  store, and the client reaches receivers anywhere in the cluster.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from typing import Mapping

import numpy as np
import torch
from torch import nn

from transports import _local
from transports.errors import ConfigurationError, LayoutError

from .service import Owner

StateDict = Mapping[str, torch.Tensor]


def _state(weights: nn.Module | StateDict) -> dict[str, torch.Tensor]:
    return dict(weights.state_dict() if isinstance(weights, nn.Module) else weights)


def _copy_into(module: nn.Module, state: StateDict) -> None:
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            if name not in state:
                raise LayoutError((name,), "a parameter of the receiving module", "a missing key")
            tensor.copy_(state[name])


class WeightSync(Owner["WeightSync"]):
    """A versioned weight channel.

    Args:
        template: a module or state dict with the layout of the weights (required for ``process``).
        placement: where receivers live; ``None`` takes the ``service_backend`` context, else ``direct``.
        transport: transport kind; ``None`` takes the ``transport_backend`` context, else ``auto``.

    Example:
        >>> sync = WeightSync().start()
        >>> server = InferenceServer(policy_factory=make_policy, weight_sync=sync.client()).start()
        >>> sync.push(learner)
        1
    """

    component = "weight_sync"

    def __init__(self, template: nn.Module | StateDict | None = None, *, placement: str | None = None, transport=None):
        super().__init__(placement=placement, transport=transport)
        if self.placement == "process" and template is None:
            raise ConfigurationError(
                "weight sync placed on 'process' needs a template (a module or state dict) to lay out shared memory",
                path="components.weight_sync",
            )
        self._template = None if template is None else {k: v.detach() for k, v in _state(template).items()}
        self._version = 0
        self._latest: dict[str, torch.Tensor] | None = None
        self._lock = threading.Lock()
        self._shared: SharedWeights | None = None
        self._host = None  # placement ray: the actor keeping the versions
        self._local_id = _local.register(self)

    def _start(self) -> None:
        if self.placement == "process":
            self._shared = SharedWeights.create(self._template)
        elif self.placement == "ray":
            from .hosting import Allowed, Host

            twin = functools.partial(WeightSync, placement="direct", transport="direct")
            self._host = Host("weight-sync", twin, "ray", Allowed(RAY_OPERATIONS), resources=self.resources)
            self._host.start()
            self._shared = RayWeights(self._host.endpoint())

    def _shutdown(self, timeout: float | None) -> None:
        if self._host is not None:
            self._host.stop(timeout)
            self._host = None
            self._shared = None
        with self._lock:
            self._latest = None
        if self._shared is not None:
            self._shared._release()

    def _alive(self) -> bool:
        return self._host is None or self._host.is_alive

    def _client(self):
        if self._shared is not None:
            return self._shared.attached()
        return LocalWeights(self._local_id)

    # ------------------------------------------------------------------ domain operations (direct, thread)
    @property
    def version(self) -> int:
        """The latest published version (0 before the first push)."""
        return self._shared.version if self._shared is not None else self._version

    def push(self, weights: nn.Module | StateDict) -> int:
        """Publish ``weights`` as a new version. Returns the version."""
        self._require_running()
        if self._shared is not None:
            return self._shared.push(weights)
        state = _state(weights)
        if self.placement == "thread":
            state = {k: v.detach().clone() for k, v in state.items()}
        with self._lock:
            self._version += 1
            self._latest = state
            return self._version

    def poll(self, since: int, into: nn.Module) -> int | None:
        """If a version newer than ``since`` exists, copy it into ``into`` in place and return it."""
        if self._shared is not None:
            return self._shared.poll(since, into)
        with self._lock:
            version, state = self._version, self._latest
        if version <= since or state is None:
            return None
        _copy_into(into, state)
        return version

    def pull(self) -> tuple[int, StateDict | None]:
        """The latest ``(version, state_dict)``; the state is ``None`` before the first push."""
        if self._shared is not None:
            return self._shared.pull()
        with self._lock:
            return self._version, self._latest

    def _newer_than(self, since: int) -> tuple[int, StateDict] | None:
        """``(version, state)`` if a version newer than ``since`` exists: one round trip for a remote poll."""
        version, state = self.pull()
        return None if version <= since or state is None else (version, state)

    def _current_version(self) -> int:
        return self.version


RAY_OPERATIONS = frozenset({"push", "pull", "_newer_than", "_current_version"})


class RayWeights:
    """The client of a ``ray`` weight sync: the versions live in an actor; tensors travel through Ray's object
    store. ``push``, ``poll``, ``pull`` and ``version``; picklable to any process connected to the cluster.
    A ``poll`` is one actor call (its state only when a newer version exists)."""

    def __init__(self, endpoint):
        from .hosting import CommandClient

        self._endpoint = endpoint
        self._calls = CommandClient(endpoint)

    def __reduce__(self):
        return (RayWeights, (self._endpoint,))

    def attached(self) -> "RayWeights":
        return RayWeights(self._endpoint)

    @property
    def version(self) -> int:
        return self._calls._call("_current_version")

    def push(self, weights: nn.Module | StateDict) -> int:
        state = {k: v.detach().cpu() for k, v in _state(weights).items()}
        return self._calls._call("push", state)

    def poll(self, since: int, into: nn.Module) -> int | None:
        newer = self._calls._call("_newer_than", since)
        if newer is None:
            return None
        version, state = newer
        _copy_into(into, state)
        return version

    def pull(self) -> tuple[int, StateDict | None]:
        return self._calls._call("pull")


class LocalWeights:
    """The client of a ``thread`` weight sync: ``push``, ``poll``, ``pull`` and ``version`` on the owner's board.

    Picklable inside the owner's process only (like the ``thread`` transport's clients).
    """

    def __init__(self, owner_id: tuple[int, int]):
        self._id = owner_id
        self._owner = _local.lookup(*owner_id, "thread")

    def __reduce__(self):
        return (LocalWeights, (self._id,))

    @property
    def version(self) -> int:
        return self._owner.version

    def push(self, weights: nn.Module | StateDict) -> int:
        return self._owner.push(weights)

    def poll(self, since: int, into: nn.Module) -> int | None:
        return self._owner.poll(since, into)

    def pull(self) -> tuple[int, StateDict | None]:
        return self._owner.pull()


class SharedWeights:
    """The client of a ``process`` weight sync: a state dict in shared memory plus a sequence counter.

    Picklable by segment name: it attaches wherever it is unpickled. Has ``push``, ``poll``, ``pull`` and
    ``version``, no lifecycle methods.
    """

    def __init__(self, layout: list, header, data):
        self._layout = layout
        self._header, self._data = header, data
        self._counters = np.frombuffer(header.buf, dtype=np.int64, count=2)  # [sequence, version]
        self._views = {
            name: torch.frombuffer(data.buf, dtype=dtype, count=max(math.prod(shape), 1), offset=offset)[: math.prod(shape)].view(shape)
            for name, shape, dtype, offset in layout
        }

    @classmethod
    def create(cls, template: StateDict) -> "SharedWeights":
        from transports._shared import Segment

        layout, offset = [], 0
        for name in sorted(template):
            t = template[name]
            offset = (offset + 63) // 64 * 64
            layout.append((name, tuple(t.shape), t.dtype, offset))
            offset += max(t.numel(), 1) * t.element_size()
        return cls(layout, Segment(16), Segment(offset))

    def attached(self) -> "SharedWeights":
        return SharedWeights(self._layout, self._header, self._data)

    def __reduce__(self):
        return (SharedWeights, (self._layout, self._header, self._data))

    @property
    def version(self) -> int:
        return int(self._counters[1])

    def push(self, weights: nn.Module | StateDict) -> int:
        """Write a new version (one writer at a time: the learner)."""
        state = _state(weights)
        missing = set(self._views) - set(state)
        if missing:
            raise LayoutError((sorted(missing)[0],), "a parameter of the template", "a missing key")
        counters = self._counters
        counters[0] += 1  # odd: a write is in progress
        with torch.no_grad():
            for name, view in self._views.items():
                view.copy_(state[name])
        counters[1] += 1
        counters[0] += 1  # even: consistent again
        return int(counters[1])

    def _read(self, copy) -> int:
        counters = self._counters
        while True:
            start = int(counters[0])
            if start % 2:
                time.sleep(0)
                continue
            version = int(counters[1])
            copy()
            if int(counters[0]) == start:
                return version

    def poll(self, since: int, into: nn.Module) -> int | None:
        """If a version newer than ``since`` exists, copy it into ``into`` in place and return it."""
        if int(self._counters[1]) <= since:
            return None
        return self._read(lambda: _copy_into(into, self._views))

    def pull(self) -> tuple[int, StateDict | None]:
        if int(self._counters[1]) == 0:
            return 0, None
        out: dict[str, torch.Tensor] = {}
        version = self._read(lambda: out.update({k: v.clone() for k, v in self._views.items()}))
        return version, out

    def _release(self) -> None:
        """Detach (the owner's copy also unlinks the segments). Not a client operation: the owner calls it."""
        self._views = {}
        self._counters = None
        self._header.close()
        self._data.close()
