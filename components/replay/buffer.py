"""The replay buffer owner: hosts a :class:`~components.replay.storage.ReplayStorage` where it is placed.

Placed ``direct`` the owner is its own client and every operation runs on the storage in the caller. Elsewhere
the storage is built where the host runs it and the operations are acknowledged commands over the resolved
transport (``thread``, ``queue``, ``ray``); with ``shared_memory`` the commands go over a local socket while
the payloads of ``extend`` and ``sample`` stay in shared memory (see :mod:`components.replay.client`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import torch
from tensordict import TensorDict, TensorDictBase

from transports import registry as transport_registry
from transports.errors import IncompatibleCombinationError

from ..commands import Allowed, CommandTarget
from ..resolution import Resolved
from ..service import Owner
from .filters import PolicyAgeFilter
from .payload import SERVER_OPS, explicit_operations
from .storage import ReplayStorage

CLIENT_OPERATIONS = frozenset({
    "add", "extend", "sample", "update_priority", "__len__", "empty", "state_dict", "load_state_dict",
    "_open_extend_stage", "_extend_from_stage", "_shared_storage", "_sample_indices",
})


class ReplayBuffer(Owner["ReplayBuffer"]):
    """A replay buffer owner (and, placed ``direct``, its own client).

    Args:
        capacity: most transitions held; the oldest are overwritten first.
        sampler: ``uniform``, ``without_replacement`` or ``prioritized``.
        batch_size: default ``sample()`` size.
        storage: ``memory`` or ``memmap`` (files under ``scratch_dir``).
        scratch_dir: directory of the memory-mapped storage (``memmap`` only).
        alpha: prioritized sampling exponent.
        beta: importance-weight exponent.
        filters: :class:`PolicyAgeFilter` s applied at extend or sample time.
        placement: where the buffer lives (``direct``, ``thread``, ``process``, ``ray``).
        transport: ``queue`` or ``shared_memory`` for ``process`` (samples come back through shared memory
            without pickling); ``None`` takes the ``transport_backend`` context, else ``auto``.
        seed: seed of the sampler's generator.
        layouts: explicit layouts of the ``distributed`` transport's operations (``extend``: a batch as written;
            ``sample``: a sample as returned; ``update_priority``): their channels bind up front and the owner
            refuses other layouts; any operation without one binds its layout with its first call, so a subset
            is complete. With another transport (``auto`` included) they raise ``IncompatibleCombinationError``.
        resolved: the plan's resolution of this buffer.

    Example:
        >>> with ReplayBuffer(capacity=1000, batch_size=32) as buffer:
        ...     index = buffer.extend(TensorDict({"observation": torch.randn(100, 4)}, [100]))
        ...     buffer.sample()["observation"].shape
        torch.Size([32, 4])
    """

    component = "replay"

    def __init__(
        self,
        capacity: int = 100_000,
        sampler: str = "uniform",
        batch_size: int = 256,
        *,
        storage: str = "memory",
        scratch_dir: str | None = None,
        alpha: float = 0.6,
        beta: float = 0.4,
        filters: Sequence[PolicyAgeFilter] = (),
        placement: str | None = None,
        transport=None,
        seed: int | None = None,
        layouts: Mapping[str, Any] | None = None,
        resolved: Resolved | None = None,
    ):
        self._kwargs = dict(capacity=capacity, sampler=sampler, batch_size=batch_size, storage=storage,
                            scratch_dir=scratch_dir, alpha=alpha, beta=beta, filters=tuple(filters), seed=seed)
        options = {k: v for k, v in self._kwargs.items() if k != "filters"}
        super().__init__(placement=placement, transport=transport, resolved=resolved, options=options)
        self.capacity, self.sampler_name, self.batch_size = capacity, sampler, batch_size
        self.filters = tuple(filters)
        self._operations = explicit_operations(layouts or {})
        if self._operations and self.transport_kind != "distributed":
            raise IncompatibleCombinationError(  # auto included: layouts never fall back to another transport
                f"replay layouts apply to transport 'distributed', not {self.transport_kind!r} "
                f"({self.transport_reason})",
                path="components.replay.layouts", alternatives=("distributed",))
        self._ops: Any = None  # the storage (in the caller) or this owner's client

    @property
    def _shares_storage(self) -> bool:
        return self.transport_kind == "shared_memory"

    # ------------------------------------------------------------------ hosting
    def _target(self, server_side: Any) -> Callable[[], Any]:
        build = functools.partial(ReplayStorage, **self._kwargs, share=self._shares_storage)
        if server_side is None:
            return build
        payload = None if self._payload is None else self._payload.server_side()
        return functools.partial(CommandTarget, build, server_side, Allowed(CLIENT_OPERATIONS), payload, SERVER_OPS)

    def _endpoint(self) -> tuple[str | None, dict]:
        if self._shares_storage:  # commands over a local socket; payloads stay in shared memory
            return "queue", {}
        if self.transport_kind == "distributed":  # commands over the placement's own channel, tensors over gloo
            return self.host_type.command_transport, {}
        return super()._endpoint()

    def _payload_transport(self) -> Any:
        if self.transport_kind != "distributed":
            return None
        return transport_registry.build("distributed", {**self.resolved.transport_options, "operations": self._operations},
                                        name="replay")

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
        when a :class:`PolicyAgeFilter` at extend time drops it)."""
        return self._storage().add(item)

    def extend(self, batch: TensorDictBase) -> torch.Tensor:
        """Write every element of ``batch`` (flattened over its batch dimensions).

        Returns:
            The storage positions written, in row order, as a 1-D int64 tensor, ready for
            :meth:`update_priority`. Its length is how many were written (fewer when a :class:`PolicyAgeFilter`
            at extend time drops stale ones); a batch longer than ``capacity`` keeps its last rows, and the
            positions of the earlier ones repeat (as in torchrl).

        Raises:
            LayoutError: ``batch`` does not match the layout fixed by the first write.
        """
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
        """Restore what :meth:`state_dict` returned (same capacity)."""
        return self._storage().load_state_dict(state)
