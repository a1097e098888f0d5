"""Weight sync: a versioned channel from the learner to inference owners and collectors.

``push(module)`` publishes a new version; receivers ``poll(since, into=module)`` between their batches and
copy a newer version in place; versions are monotonic. How versions move is the resolved transport's, as the
component's bindings (`components.weight_sync.declaration`) say:

- no endpoint (``direct``): a board in this owner. Placed ``direct`` (receivers share the caller's thread) a push
  hands over references; placed on ``thread`` it snapshots the state so a receiver never sees a torn one.
- shared state (``shared_memory``, placement ``process``): the state lives in one shared-memory segment laid out
  from a template state dict, guarded by a sequence counter (a reader retries if a push overlapped its copy). The
  client is picklable by segment name and reaches receivers in any process of the host.
- commands (``ray``, ``monarch``): the versions live in the hosting actor; pushes and polls are actor calls, tensors
  travel with them, and the client reaches receivers anywhere in the cluster.
- commands and a payload transport (``distributed``, placements ``process``, ``ray`` and ``distributed``): the
  owner's process, actor or rank holds the versions; pushes and each receiver's standing subscription travel over
  gloo, so a poll is local (see `components.weight_sync.hub`).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import torch
from torch import nn

from transports import local as _local
from transports.kernel.errors import ConfigurationError

from .. import compat
from ..commands import Allowed, CommandTarget
from .config import WeightSyncConfig
from ..resolution import Resolved
from ..service import Owner
from .channels import LocalWeights, RayWeights, SharedWeights, StateDict, copy_into, state_of
from .hub import DistributedWeights, WeightHub

REMOTE_OPERATIONS = frozenset({"push", "pull", "_newer_than", "_current_version"})


class WeightSync(Owner["WeightSync"]):
    """A versioned weight channel.

    Args:
        config: where the versions live and how receivers reach them
            (`WeightSyncConfig`; ``None``: its defaults, whose placement takes
            the ``service_backend`` context, else ``direct``).
        template: a module or state dict with the layout of the weights (required where the versions live in shared
            memory: ``shared_memory``).
        first_version: the version before the first push (a resumed run's: its versions go on from there).
        transport: overrides ``config.transport``; ``None`` takes the ``transport_backend`` context, else ``auto``.
        resolved: the plan's resolution of this channel (it holds the config).

    Examples:
        >>> sync = WeightSync().start()
        >>> server = InferenceServer(policy_factory=make_policy, weight_sync=sync.client()).start()
        >>> sync.push(learner)
        1
    """

    component = "weight_sync"

    def __init__(self, config: WeightSyncConfig | None = None, *, template: nn.Module | StateDict | None = None,
                 first_version: int = 0, transport: Any = None, resolved: Resolved | None = None):
        super().__init__(config, transport=transport, resolved=resolved)
        if self.binding.shared_state and template is None:
            raise ConfigurationError(
                f"weight sync placed on {self.placement!r} needs a template (a module or state dict) to lay out "
                "shared memory",
                path="components.weight_sync",
            )
        self._template = None if template is None else {k: v.detach() for k, v in state_of(template).items()}
        if first_version < 0:
            raise ValueError(f"first_version must be >= 0, got {first_version!r}")
        self._first_version = self._version = int(first_version)
        self._latest: dict[str, torch.Tensor] | None = None
        self._lock = threading.Lock()
        self._shared: SharedWeights | RayWeights | None = None
        self._local_id = _local.register(self)

    @classmethod
    def needs_template(cls, resolved: Resolved) -> bool:
        """Whether a channel of this resolution lays its versions out from a template (shared state)."""
        return compat.declaration(cls.component).binding(resolved.transport).shared_state

    # ------------------------------------------------------------------ hosting
    def _target(self, server_side: Any) -> Callable[[], Any] | None:
        if server_side is None:
            return None
        if self._payload is not None:
            return functools.partial(WeightHub, server_side, self._payload.server_side(), Allowed(REMOTE_OPERATIONS),
                                     self._first_version)
        board = functools.partial(WeightSync, WeightSyncConfig(placement="direct", transport="direct"),
                                  first_version=self._first_version)
        return functools.partial(CommandTarget, functools.partial(_started, board), server_side,
                                 Allowed(REMOTE_OPERATIONS))

    def _ready(self) -> None:
        if self._payload is not None:
            self._shared = DistributedWeights(self._transport.client(), self._payload.client())
        elif self._transport is not None:
            self._shared = RayWeights(self._transport.client())
        elif self.binding.shared_state:
            self._shared = SharedWeights.create(self._template, self._first_version)

    def _shutdown(self, timeout: float | None) -> None:
        super()._shutdown(timeout)
        with self._lock:
            self._latest = None
        if isinstance(self._shared, SharedWeights):
            self._shared._release()
        self._shared = None

    def _client(self):
        if self._payload is not None:  # endpoints of their own: a command client belongs to one process
            return DistributedWeights(self._transport.client(), self._payload.client())
        if self._shared is not None:
            return self._shared.attached()
        return LocalWeights(self._local_id)

    # ------------------------------------------------------------------ domain operations
    @property
    def version(self) -> int:
        """The latest published version (``first_version`` before the first push)."""
        return self._shared.version if self._shared is not None else self._version

    def push(self, weights: nn.Module | StateDict) -> int:
        """Publish ``weights`` as a new version. Returns the version."""
        self._require_running()
        if self._shared is not None:
            return self._shared.push(weights)
        state = state_of(weights)
        if not self.inline:  # receivers on other threads: a snapshot, never a state torn by the next step
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
        copy_into(into, state)
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


def _started(build: Callable[[], WeightSync]) -> WeightSync:
    return build().start()
