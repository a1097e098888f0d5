"""The replay buffer service: a TensorDict storage and a sampler behind ``extend`` / ``sample``.

The storage is shaped lazily by the first write (every leaf gets a leading ``capacity`` dimension) and
written circularly. Samplers: ``uniform`` (with replacement) and ``without_replacement`` (epochs over the
current content, as PPO minibatches need; a write starts a new epoch).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Optional

import torch
from tensordict import TensorDict, TensorDictBase

from transports.errors import ConfigurationError, LayoutError
from transports.layout import Layout

from .service import Owner

SAMPLERS = ("uniform", "without_replacement")


@dataclass
class ReplayBufferConfig:
    """Replay buffer settings.

    Attributes:
        capacity: most transitions held; older ones are overwritten first.
        sampler: ``uniform`` or ``without_replacement``.
        batch_size: default ``sample()`` size.
        placement: where the buffer lives; ``None`` takes the ``service_backend`` context, else ``direct``.
        seed: seed of the sampler's generator (``None``: nondeterministic).
    """

    capacity: int = 100_000
    sampler: str = "uniform"
    batch_size: int = 256
    placement: Optional[str] = None
    seed: Optional[int] = None


class ReplayBuffer(Owner["ReplayBuffer"]):
    """A replay buffer owner (and, in ``direct`` placement, its own client).

    Args:
        capacity: most transitions held.
        sampler: ``uniform`` or ``without_replacement``.
        batch_size: default ``sample()`` size.
        placement: where the buffer lives.
        transport: transport kind; ``None`` takes the ``transport_backend`` context, else ``auto``.
        seed: seed of the sampler's generator.

    Example:
        >>> buffer = ReplayBuffer(capacity=1000, batch_size=32).start()
        >>> buffer.extend(TensorDict({"observation": torch.randn(100, 4)}, [100]))
        100
        >>> buffer.sample()["observation"].shape
        torch.Size([32, 4])
    """

    component = "replay"

    def __init__(
        self,
        capacity: int = 100_000,
        sampler: str = "uniform",
        batch_size: int = 256,
        *,
        placement: str | None = None,
        transport=None,
        seed: int | None = None,
    ):
        if capacity < 1:
            raise ConfigurationError(f"capacity must be >= 1, got {capacity!r}", path="components.replay.capacity")
        if sampler not in SAMPLERS:
            raise ConfigurationError(f"unknown sampler {sampler!r}", path="components.replay.sampler", alternatives=SAMPLERS)
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be >= 1, got {batch_size!r}", path="components.replay.batch_size")
        super().__init__(placement=placement, transport=transport)
        self.capacity = capacity
        self.sampler = sampler
        self.batch_size = batch_size
        self.seed = seed
        self._lock = threading.Lock()
        self._storage: TensorDict | None = None
        self._layout: Layout | None = None
        self._cursor = 0
        self._size = 0
        self._generator = torch.Generator()
        if seed is not None:
            self._generator.manual_seed(seed)
        self._epoch: torch.Tensor | None = None
        self._epoch_pos = 0

    def _shutdown(self, timeout: float | None) -> None:
        self._storage = None

    # ------------------------------------------------------------------ domain operations
    def __len__(self) -> int:
        return self._size

    def add(self, item: TensorDictBase) -> int:
        """Write one transition (a TensorDict without batch dimension). Returns its index."""
        return self._write(item.unsqueeze(0))[0]

    def extend(self, batch: TensorDictBase) -> int:
        """Write every element of ``batch`` along its first dimension. Returns how many were written.

        Raises:
            LayoutError: ``batch`` does not match the layout fixed by the first write.
        """
        return len(self._write(batch))

    def _write(self, batch: TensorDictBase) -> list[int]:
        self._require_running()
        if batch.batch_dims < 1:
            raise LayoutError((), "a TensorDict with a leading batch dimension", f"batch_size {list(batch.batch_size)}")
        if batch.batch_dims > 1:
            batch = batch.reshape(-1)
        n = batch.shape[0]
        with self._lock:
            if self._storage is None:
                self._layout = Layout.from_tensordict(batch[0])
                self._storage = self._layout.zeros(self.capacity)
            item = _rows(batch, self._layout)
            if n >= self.capacity:
                item, n = item[-self.capacity :], self.capacity
            idx = (torch.arange(n) + self._cursor) % self.capacity
            self._storage[idx] = item
            self._cursor = int((self._cursor + n) % self.capacity)
            self._size = min(self._size + n, self.capacity)
            self._epoch = None
            return idx.tolist()

    def sample(self, batch_size: int | None = None) -> TensorDict:
        """Sample ``batch_size`` (default: the configured one) transitions.

        Raises:
            RuntimeError: the buffer is empty.
        """
        self._require_running()
        n = batch_size or self.batch_size
        with self._lock:
            if self._size == 0:
                raise RuntimeError("cannot sample from an empty replay buffer")
            if self.sampler == "uniform":
                idx = torch.randint(self._size, (n,), generator=self._generator)
            else:
                idx = self._next_without_replacement(n)
            return self._storage[idx].clone()

    def _next_without_replacement(self, n: int) -> torch.Tensor:
        if n > self._size:
            raise ValueError(f"batch_size {n} exceeds the {self._size} stored transitions (sampling without replacement)")
        if self._epoch is None or self._epoch_pos + n > len(self._epoch):
            self._epoch = torch.randperm(self._size, generator=self._generator)
            self._epoch_pos = 0
        idx = self._epoch[self._epoch_pos : self._epoch_pos + n]
        self._epoch_pos += n
        return idx

    def update_priority(self, index, priority) -> None:
        """Update sampling priorities. Only prioritized samplers have priorities.

        Raises:
            ConfigurationError: this buffer's sampler has no priorities.
        """
        raise ConfigurationError(
            f"sampler {self.sampler!r} has no priorities to update", path="components.replay.sampler"
        )

    def empty(self) -> None:
        """Forget every stored transition (the layout stays)."""
        with self._lock:
            self._cursor = 0
            self._size = 0
            self._epoch = None


def _rows(batch: TensorDictBase, layout: Layout) -> TensorDict:
    """Check each leaf of ``batch`` against the per-item ``layout`` (ignoring the leading dimension)."""
    out = TensorDict(batch_size=batch.batch_size[:1])
    for leaf in layout:
        value = batch.get(leaf.key, None)
        if value is None:
            raise LayoutError(leaf.key, leaf.describe(), "a missing key")
        if tuple(value.shape[1:]) != leaf.shape or value.dtype != leaf.dtype:
            raise LayoutError(
                leaf.key,
                f"shape [N, {', '.join(map(str, leaf.shape))}] dtype {str(leaf.dtype)[6:]}",
                f"shape {list(value.shape)} dtype {str(value.dtype)[6:]}",
            )
        out.set(leaf.key, value)
    return out
