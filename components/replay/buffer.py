"""The replay buffer owner: hosts a `ReplayStorage` where it is placed.

Placed ``direct`` the owner is its own client and every operation runs on the storage in the caller. Elsewhere
the storage is built where the host runs it and the operations are acknowledged commands over the resolved
transport (``thread``, ``queue``, ``ray``); with ``shared_memory`` the commands go over a local socket while
the payloads of ``extend`` and ``sample`` stay in shared memory (see `components.replay.client`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import torch
from tensordict import TensorDict, TensorDictBase

from transports.kernel.errors import ConfigurationError, IncompatibleCombinationError

from .. import compat
from ..commands import Allowed, CommandTarget
from ..resolution import Resolved
from ..service import Owner
from .config import ReplayConfig
from .filters import PolicyAgeFilter
from .operations import ReplayOperations
from .payload import SERVER_OPS, explicit_operations
from .storage import ReplayStorage

def _payload_kinds() -> tuple[str, ...]:
    """The kinds whose binding carries replay's payloads (``distributed``)."""
    declaration = compat.declaration(ReplayBuffer.component)
    return tuple(k for k in compat.transports_of(ReplayBuffer.component) if declaration.binding(k).payload)


CLIENT_OPERATIONS = frozenset({
    "add", "extend", "sample", "update_priority", "__len__", "empty", "state_dict", "load_state_dict",
    "_open_extend_stage", "_extend_from_stage", "_shared_storage", "_sample_indices",
})


class ReplayBuffer(ReplayOperations, Owner["ReplayBuffer"]):
    """A replay buffer owner (and, placed ``direct``, its own client).

    Args:
        config: where the buffer lives, its storage and its sampler (`ReplayConfig`;
            ``None``: its defaults).
        weight_sync: a weight-sync client: the live policy version that ``config.max_policy_lag`` is measured
            against (required with it).
        filters: more `PolicyAgeFilter`s, applied at extend or sample time.
        seed: seed of the sampler's generator.
        layouts: explicit layouts of the ``distributed`` transport's operations (``extend``: a batch as written;
            ``sample``: a sample as returned; ``update_priority``): their channels bind up front and the owner
            refuses other layouts; any operation without one binds its layout with its first call, so a subset
            is complete. With another transport (``auto`` included) they raise ``IncompatibleCombinationError``.
        transport: overrides ``config.transport``: ``queue`` or ``shared_memory`` for ``process`` (samples come back
            through shared memory without pickling), a `TransportConfig` or an instance.
        resolved: the plan's resolution of this buffer (it holds the config).

    Examples:
        >>> with ReplayBuffer(ReplayConfig(capacity=1000, batch_size=32)) as buffer:
        ...     index = buffer.extend(TensorDict({"observation": torch.randn(100, 4)}, [100]))
        ...     buffer.sample()["observation"].shape
        torch.Size([32, 4])
    """

    component = "replay"

    def __init__(
        self,
        config: ReplayConfig | None = None,
        *,
        weight_sync: Any = None,
        filters: Sequence[PolicyAgeFilter] = (),
        seed: int | None = None,
        layouts: Mapping[str, Any] | None = None,
        transport: Any = None,
        resolved: Resolved | None = None,
    ):
        super().__init__(config, transport=transport, resolved=resolved)
        c = self.config
        filters = tuple(filters)
        if c.max_policy_lag is not None:  # measured against the live version the weight-sync channel holds
            if weight_sync is None:
                raise ConfigurationError(f"{c.path}.max_policy_lag={c.max_policy_lag} needs the live policy version: "
                                         "pass weight_sync (a weight-sync client)", path=f"{c.path}.max_policy_lag")
            filters += (PolicyAgeFilter(int(c.max_policy_lag), weight_sync, when="sample"),)
        self.capacity, self.sampler_name, self.batch_size = c.capacity, c.sampler, c.batch_size
        self.filters = filters
        self._storage_args = dict(capacity=c.capacity, sampler=c.sampler, batch_size=c.batch_size, storage=c.storage,
                                  scratch_dir=c.scratch_dir, alpha=c.alpha, beta=c.beta, filters=filters, seed=seed,
                                  frames=tuple(c.frames))
        self._operations = explicit_operations(layouts or {})
        if self._operations and not self.binding.payload:
            raise IncompatibleCombinationError(  # auto included: layouts never fall back to another transport
                f"replay layouts apply to transport {' or '.join(map(repr, _payload_kinds()))}, not "
                f"{self.transport_kind!r} ({self.transport_reason})",
                path="components.replay.layouts", alternatives=_payload_kinds())
        self._ops: Any = None  # the storage (in the caller) or this owner's client

    @property
    def _shares_storage(self) -> bool:
        return self.binding.shared_state

    # ------------------------------------------------------------------ hosting
    def _target(self, server_side: Any) -> Callable[[], Any]:
        build = functools.partial(ReplayStorage, **self._storage_args, share=self._shares_storage)
        if server_side is None:
            return build
        payload = None if self._payload is None else self._payload.server_side()
        return functools.partial(CommandTarget, build, server_side, Allowed(CLIENT_OPERATIONS), payload, SERVER_OPS)

    def _payload_arguments(self) -> dict:
        return {"operations": self._operations}

    def _ready(self) -> None:
        self._ops = self._host.target if self.inline else self._client()

    def _shutdown(self, timeout: float | None) -> None:
        self._ops = None
        super()._shutdown(timeout)

    def _wrap(self, endpoint: Any):
        from .client import ReplayClient

        payload = None if self._payload is None else self._payload.client()
        return ReplayClient(endpoint, shared_memory=self._shares_storage, batch_size=self.batch_size, payload=payload,
                            operations=self._operations or None)

    # ------------------------------------------------------------------ domain operations
    def _storage(self) -> Any:
        self._require_running()
        return self._ops

    def __len__(self) -> int:
        return len(self._storage())

    def add(self, item: TensorDictBase) -> int | None:
        """Write one transition (a TensorDict without batch dimension). Returns its storage position (``None``
        when a `PolicyAgeFilter` at extend time drops it)."""
        return self._storage().add(item)

    def extend(self, batch: TensorDictBase) -> torch.Tensor:
        """Write every element of ``batch`` (flattened over its batch dimensions).

        Returns:
            The storage positions written, in row order, as a 1-D int64 tensor, ready for
            `update_priority`. Its length is how many were written (fewer when a `PolicyAgeFilter`
            at extend time drops stale ones); a batch longer than ``capacity`` keeps its last rows, and the
            positions of the earlier ones repeat (as in torchrl).

        Raises:
            LayoutError: ``batch`` does not match the layout fixed by the first write.
        """
        self.note_write(batch)
        return self._storage().extend(batch)

    def sample(self, batch_size: int | None = None) -> TensorDict:
        """Sample ``batch_size`` (default: the configured one) transitions, with their ``index`` (and
        ``_weight``, the importance weights, for the prioritized sampler).

        Raises:
            RuntimeError: nothing valid to sample.
        """
        return self._storage().sample(batch_size)

    def update_priority(self, index, priority) -> None:
        """Set the priorities of ``index`` (prioritized sampler only)."""
        return self._storage().update_priority(index, priority)

    def empty(self) -> None:
        """Forget every stored transition (the layout stays)."""
        return self._storage().empty()

    def state_dict(self) -> dict:
        """Everything needed to resume: storage content, write position, validity, sampler state."""
        return self._storage().state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned (same capacity)."""
        return self._storage().load_state_dict(state)
