"""Samplers: which stored transitions a ``sample`` returns.

- ``uniform``: with replacement, among valid items.
- ``without_replacement``: epochs over the valid items (a write starts a new epoch), as PPO minibatches need.
- ``prioritized``: proportional to ``priority ** alpha`` through a sum tree; each sample carries importance
  weights ``(N * P(i)) ** -beta`` normalised by the batch maximum. New items get the highest priority seen.
- ``fifo``: a learner queue: each item once, oldest first, and ``len`` counts the items not sampled yet.
"""

from __future__ import annotations

import numpy as np
import torch

from .config import SAMPLERS  # noqa: F401 - the names, declared once


class Sampler:
    """Base: ``sample(n, size, valid)`` returns indices (and optional importance weights)."""

    def __init__(self, capacity: int, generator: torch.Generator):
        self.capacity = capacity
        self.generator = generator

    def on_write(self, index: torch.Tensor) -> None:
        """``index`` was (over)written."""

    def invalidate(self, index: torch.Tensor) -> None:
        """``index`` may no longer be sampled (until overwritten)."""

    def clear(self, index: torch.Tensor) -> None:
        """The buffer forgot everything it held (``index``: what was valid); writes start again at position 0."""
        self.invalidate(index)

    def available(self, size: int) -> int:
        """What ``len`` of the buffer says: the items that may be sampled, of the ``size`` stored."""
        return size

    def sample(self, n: int, size: int, valid: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Choose ``n`` stored items to return.

        Args:
            n: how many indices to return.
            size: how many items the storage holds (positions ``[0, size)``).
            valid: a boolean mask over positions of the items that may be sampled, or ``None`` when all may.

        Returns:
            ``(index, weights)``: the positions, and importance weights for them (``None`` for unweighted samplers).

        Raises:
            RuntimeError: nothing may be sampled (or, for ``fifo``, fewer than ``n`` items are queued).
        """
        raise NotImplementedError

    def update_priority(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        """Set the priorities of the items at ``index`` (one priority, or one per index).

        Raises:
            TypeError: the sampler has no priorities (only ``prioritized`` has).
            ValueError: the counts differ, or a priority is negative or not finite.
        """
        raise TypeError(f"sampler {type(self).__name__} has no priorities to update")

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the sampler (empty for a sampler with no state of its own)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned."""
        pass


def _candidates(size: int, valid: torch.Tensor | None) -> torch.Tensor | None:
    """Indices that may be sampled, or ``None`` when all of ``[0, size)`` may."""
    if valid is None:
        return None
    return torch.nonzero(valid[:size]).squeeze(-1)


class UniformSampler(Sampler):
    """Samples with replacement, uniformly among the valid items."""

    def sample(self, n, size, valid):
        pool = _candidates(size, valid)
        count = size if pool is None else len(pool)
        if count == 0:
            raise RuntimeError("no valid transition to sample")
        draw = torch.randint(count, (n,), generator=self.generator)
        return (draw if pool is None else pool[draw]), None


class WithoutReplacementSampler(Sampler):
    """Samples epochs: permutations of the valid items; a write or an invalidation starts a new one."""

    def __init__(self, capacity, generator):
        super().__init__(capacity, generator)
        self.epoch: torch.Tensor | None = None
        self.position = 0

    def on_write(self, index):
        self.epoch = None

    def invalidate(self, index):
        self.epoch = None

    def sample(self, n, size, valid):
        """``n`` rows of the current epoch (a permutation of the valid items); a call that does not fit in what is
        left of it starts a new one. A call for more rows than there are items (several epochs at once) takes what
        is left of the current epoch, then continues through new ones: the rows that consecutive calls of a size
        dividing the item count would return, in order."""
        pool = _candidates(size, valid)
        count = size if pool is None else len(pool)
        if count == 0:
            raise RuntimeError("no valid transition to sample")
        if n > count:
            return self._epochs(n, count, pool), None
        if self.epoch is None or self.position + n > len(self.epoch):
            self._new_epoch(count, pool)
        index = self.epoch[self.position : self.position + n]
        self.position += n
        return index, None

    def _new_epoch(self, count: int, pool: torch.Tensor | None) -> None:
        perm = torch.randperm(count, generator=self.generator)
        self.epoch = perm if pool is None else pool[perm]
        self.position = 0

    def _epochs(self, n: int, count: int, pool: torch.Tensor | None) -> torch.Tensor:
        parts = [] if self.epoch is None else [self.epoch[self.position :]]
        taken = sum(len(part) for part in parts)
        while taken < n:
            self._new_epoch(count, pool)
            self.position = min(count, n - taken)
            parts.append(self.epoch[: self.position])
            taken += self.position
        return torch.cat(parts)


class SumTree:
    """A binary sum tree over ``capacity`` leaves (numpy, float64), updated and searched level by level."""

    def __init__(self, capacity: int):
        self.leaves = 1 << max(0, (capacity - 1).bit_length())
        self.tree = np.zeros(2 * self.leaves)

    def set(self, index: np.ndarray, values: np.ndarray) -> None:
        """Set the leaves at ``index`` to ``values`` and update their ancestors' sums."""
        pos = np.asarray(index, dtype=np.int64) + self.leaves
        self.tree[pos] = values
        pos = np.unique(pos // 2)
        while len(pos) and pos[-1] >= 1:
            self.tree[pos] = self.tree[2 * pos] + self.tree[2 * pos + 1]
            if pos[-1] == 1:
                break
            pos = np.unique(pos // 2)

    @property
    def total(self) -> float:
        """The sum of every leaf."""
        return float(self.tree[1])

    def get(self, index: np.ndarray) -> np.ndarray:
        """The values of the leaves at ``index``."""
        return self.tree[np.asarray(index) + self.leaves]

    def find(self, targets: np.ndarray) -> np.ndarray:
        """Leaf indices whose prefix-sum interval contains each target."""
        pos = np.ones(len(targets), dtype=np.int64)
        targets = targets.copy()
        while pos[0] < self.leaves:
            left = 2 * pos
            right_side = targets > self.tree[left]
            targets = np.where(right_side, targets - self.tree[left], targets)
            pos = np.where(right_side, left + 1, left)
        return pos - self.leaves


class PrioritizedSampler(Sampler):
    """Proportional prioritized sampling.

    Args:
        alpha: how strongly priorities shape sampling (0: uniform).
        beta: importance-weight correction (1: full).
        eps: added to every priority so none is exactly zero.
    """

    def __init__(self, capacity, generator, alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6):
        super().__init__(capacity, generator)
        self.alpha, self.beta, self.eps = alpha, beta, eps
        self.tree = SumTree(capacity)
        self.max_priority = 1.0
        self.rng = np.random.default_rng(int(torch.randint(2**31, (1,), generator=generator)))

    def on_write(self, index):
        idx = index.numpy()
        self.tree.set(idx, np.full(len(idx), self.max_priority**self.alpha))

    def invalidate(self, index):
        self.tree.set(index.numpy(), np.zeros(len(index)))

    def sample(self, n, size, valid):
        total = self.tree.total
        if total <= 0:
            raise RuntimeError("no valid transition to sample")
        segment = total / n
        targets = (np.arange(n) + self.rng.random(n)) * segment
        index = np.minimum(self.tree.find(np.minimum(targets, total * (1 - 1e-12))), size - 1)
        probs = self.tree.get(index) / total
        weights = (size * np.maximum(probs, 1e-12)) ** (-self.beta)
        weights /= weights.max()
        return torch.from_numpy(index), torch.from_numpy(weights.astype(np.float32))

    def update_priority(self, index, priority):
        index = torch.as_tensor(index).reshape(-1).numpy()
        priority = torch.as_tensor(priority, dtype=torch.float64).reshape(-1).numpy()
        if len(priority) == 1 and len(index) > 1:
            priority = np.full(len(index), priority[0])
        if len(index) != len(priority):
            raise ValueError(f"{len(index)} indices but {len(priority)} priorities")
        if (priority < 0).any() or not np.isfinite(priority).all():
            raise ValueError("priorities must be finite and non-negative")
        live = self.tree.get(index) > 0  # stale (invalidated) items stay out
        priority = priority + self.eps
        self.max_priority = max(self.max_priority, float(priority.max()))
        self.tree.set(index[live], priority[live] ** self.alpha)

    def state_dict(self):
        return {"tree": self.tree.tree.copy(), "max_priority": self.max_priority}

    def load_state_dict(self, state):
        self.tree.tree[:] = state["tree"]
        self.max_priority = state["max_priority"]


class FifoSampler(Sampler):
    """A learner queue: every item is sampled once, oldest first, in the order it was written.

    The queued items are a run of the ring the storage writes circularly: from the oldest not yet sampled to the
    last written. A write that passes the oldest queued item (the consumer is behind by more than the capacity)
    drops it, counted in `overwritten`; an item invalidated before its turn (a stale policy, at sample time)
    is passed over, counted in `skipped`. A sample asks for exactly ``n`` items: fewer queued is an error
    (the consumer checks ``len`` first), so every sample has one layout.
    """

    def __init__(self, capacity, generator):
        super().__init__(capacity, generator)
        self.end = 0  # one past the last written position
        self.queued = 0  # items from (end - queued) to end, not sampled yet
        self.overwritten = self.skipped = 0

    def on_write(self, index):
        if not len(index):
            return
        self.end = (int(index[-1]) + 1) % self.capacity
        self.queued += len(index)
        if self.queued > self.capacity:
            self.overwritten += self.queued - self.capacity
            self.queued = self.capacity

    def clear(self, index):
        self.end = self.queued = 0

    def available(self, size):
        return self.queued

    def sample(self, n, size, valid):
        run = (self.end - self.queued + torch.arange(self.queued)) % self.capacity
        live = torch.arange(len(run)) if valid is None else torch.nonzero(valid[run]).squeeze(-1)  # places in the run
        if len(live) < n:
            raise RuntimeError(f"the queue holds {len(live)} items, {n} were asked for")
        index = run[live[:n]]
        taken = int(live[n - 1]) + 1 if n else 0  # the queue advances past the last item taken
        self.skipped += taken - n
        self.queued -= taken
        return index, None

    def state_dict(self):
        return {"end": self.end, "queued": self.queued, "overwritten": self.overwritten, "skipped": self.skipped}

    def load_state_dict(self, state):
        self.end, self.queued = state["end"], state["queued"]
        self.overwritten, self.skipped = state["overwritten"], state["skipped"]


def make_sampler(name: str, capacity: int, generator: torch.Generator, alpha: float, beta: float) -> Sampler:
    """Build the sampler ``name`` (one of `SAMPLERS`) for a buffer of ``capacity`` items.

    Args:
        name: the sampler's name; an unknown name gives the prioritized sampler (the config checks names first).
        capacity: the buffer's capacity.
        generator: the random generator the sampler draws from (seeded by the buffer).
        alpha: the priority exponent of ``prioritized`` (ignored by the others).
        beta: the importance-weight exponent of ``prioritized`` (ignored by the others).
    """
    if name == "uniform":
        return UniformSampler(capacity, generator)
    if name == "without_replacement":
        return WithoutReplacementSampler(capacity, generator)
    if name == "fifo":
        return FifoSampler(capacity, generator)
    return PrioritizedSampler(capacity, generator, alpha, beta)


def sampler_nbytes(name: str, capacity: int) -> int:
    """Bytes the sampler ``name`` holds for a buffer of ``capacity`` (what the plan counts against memory): the
    prioritized sampler's sum tree, the without-replacement sampler's epoch; the others hold none."""
    if name == "prioritized":
        return 2 * (1 << max(0, (capacity - 1).bit_length())) * 8  # SumTree: float64, two per leaf
    if name == "without_replacement":
        return 8 * capacity  # an epoch: a permutation of int64 positions
    return 0
