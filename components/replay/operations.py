"""What a learner asks of a replay buffer, in its own terms: every replay client (the buffer placed ``direct``, and
`ReplayClient` elsewhere) offers these over its ``extend`` and ``sample``.

- `ReplayOperations.minibatches`: an update's minibatches, fetched several at a time. A shared-memory or
  ``distributed`` endpoint binds its sample layout with its first call, so the rows per call are chosen once, from
  the first batch written, and stay fixed.
- `ReplayOperations.sample_prioritized`: rows with their importance weights and the handle
  `update_priority` takes back.
- `ReplayOperations.take`: rows as the sampler hands them out (a FIFO queue: the oldest), holding only what
  was written.

The bookkeeping keys a sample carries (``index``, ``_weight``) stay behind these operations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch
from tensordict import TensorDictBase

SAMPLE_BYTES = 64 << 20
"""The most bytes `ReplayOperations.minibatches` asks the buffer for in one call."""

BOOKKEEPING = ("index", "_weight")
"""The keys a sample carries beside the rows written: storage positions and importance weights."""


def rows_per_call(batch_rows: int, count: int, size: int, row_bytes: int = 0) -> int:
    """How many rows `ReplayOperations.minibatches` asks the buffer for at once.

    When minibatches tile the batch written: as many of an update's minibatches as fit in `SAMPLE_BYTES`
    (every one of them, with small rows: a buffer in another process then costs one round trip per update), a
    number that divides them; else one minibatch.

    Args:
        batch_rows: rows of the batch written before the update.
        count: minibatches per update.
        size: rows per minibatch.
        row_bytes: bytes of one row.

    Returns:
        Rows per call, a multiple of ``size``.
    """
    if batch_rows % size:
        return size
    fit = max(1, SAMPLE_BYTES // max(1, row_bytes * size))
    return max(m for m in range(1, count + 1) if count % m == 0 and m <= fit) * size


@dataclass(frozen=True)
class PrioritizedSample:
    """Rows drawn by a (prioritized) sampler.

    Attributes:
        rows: the rows as written.
        weight: each row's importance weight (ones where the sampler weighs none).
        index: the rows' storage positions: hand them back to `ReplayOperations.update_priority`.
    """

    rows: TensorDictBase
    weight: torch.Tensor
    index: torch.Tensor


class ReplayOperations:
    """The domain operations of a replay client, over its ``extend``, ``sample`` and ``update_priority``.

    A client calls `note_write` with each batch it writes (the first sizes `minibatches`' calls).
    """

    _per_call = 0  # rows per sample call of minibatches(): fixed by its first call
    _written = (0, 0)  # (rows, bytes per row) of the latest batch written before that call

    def note_write(self, batch: TensorDictBase) -> None:
        """Remember the size of a batch written (until `minibatches` has chosen its rows per call)."""
        if not self._per_call:
            rows = max(1, batch.numel())
            self._written = (batch.numel(), batch.bytes() // rows)

    def minibatches(self, count: int, size: int) -> Iterator[TensorDictBase]:
        """``count`` minibatches of ``size`` rows, in order, fetched several per call.

        The rows are those ``count`` calls of ``sample(size)`` would give one by one, in the same order, where the
        sampler draws without replacement (one permutation of what the buffer holds at a time, a call for more rows
        than it holds continuing through the next permutations); a buffer in another process then costs a round trip
        per update (or per `SAMPLE_BYTES`) rather than per minibatch. The rows per call are chosen by the first
        call (`rows_per_call`, from the batch written before it) and stay fixed.

        Args:
            count: minibatches to yield.
            size: rows per minibatch.

        Yields:
            Each minibatch's rows as written.
        """
        if not self._per_call:
            self._per_call = rows_per_call(self._written[0], count, size, self._written[1])
        left = count
        while left > 0:
            for minibatch in self.sample(self._per_call).exclude(*BOOKKEEPING).split(size)[:left]:
                left -= 1
                yield minibatch

    def sample_prioritized(self, batch_size: int | None = None) -> PrioritizedSample:
        """``batch_size`` rows (default: the configured number) with their importance weights and positions.

        Raises:
            RuntimeError: nothing valid to sample.
        """
        sample = self.sample(batch_size)
        index = sample.get("index")
        weight = sample.get("_weight", None)
        if weight is None:
            weight = torch.ones(len(index))
        return PrioritizedSample(sample.exclude(*BOOKKEEPING), weight, index)

    def take(self, batch_size: int | None = None) -> TensorDictBase:
        """``batch_size`` rows (default: the configured number) as the sampler hands them out (a ``fifo`` sampler:
        the oldest, each once), holding only what was written.

        Raises:
            RuntimeError: nothing valid to sample.
        """
        return self.sample(batch_size).exclude(*BOOKKEEPING)
