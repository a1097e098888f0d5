"""The replay storage: a TensorDict storage and a sampler behind ``extend`` / ``sample``; the resource a
`ReplayBuffer` owner hosts where it is placed.

The storage is shaped by the first write (each leaf gets a leading ``capacity`` dimension), in memory or
memory-mapped on disk, and written circularly. Once ``extend`` returns, ``len`` counts what it wrote and it can
be sampled. Writes return the storage positions they wrote, in row order (as torchrl's writers do): row ``i`` of
a batch lands at ``(cursor + i) % capacity``, so a batch longer than the capacity keeps its last ``capacity``
rows and the positions of the earlier ones repeat. With ``share=True`` (a buffer reached over ``shared_memory``)
the storage lives in shared memory and clients stage writes and gather samples themselves (see
`ReplayClient`).
"""

from __future__ import annotations

import os
import threading
from typing import Sequence

import torch
from tensordict import TensorDict, TensorDictBase

from transports.kernel.errors import ConfigurationError, LayoutError
from transports.layout import Layout, LeafSpec
from transports.segments import Segment, SlotBank

from .filters import PolicyAgeFilter
from .frames import FramePool, pool_slots
from .samplers import make_sampler


class ReplayStorage:
    """Storage, sampler and filters of one replay buffer, where it lives.

    Args: those of `ReplayBuffer` (which checked them), and
        share: keep the storage in shared memory and accept staged writes (the ``shared_memory`` transport).
    """

    def __init__(self, capacity: int, sampler: str, batch_size: int, storage: str = "memory",
                 scratch_dir: str | None = None, alpha: float = 0.6, beta: float = 0.4,
                 filters: Sequence[PolicyAgeFilter] = (), seed: int | None = None, share: bool = False,
                 frames: Sequence = ()):
        self.capacity, self.sampler_name, self.batch_size = capacity, sampler, batch_size
        self.frame_keys = tuple(_key(k) for k in frames)
        self._pool: FramePool | None = None
        self.storage_kind, self.scratch_dir = storage, scratch_dir
        self.filters = tuple(filters)
        self._share_storage = share
        self._lock = threading.RLock()
        self._storage: TensorDict | None = None
        self._layout: Layout | None = None
        self._valid: torch.Tensor | None = None
        self._cursor = self._size = 0
        self._generator = torch.Generator()
        if seed is not None:
            self._generator.manual_seed(seed)
        self._sampler = make_sampler(sampler, capacity, self._generator, alpha, beta)
        self._stages: list = []
        self._generation: torch.Tensor | None = None
        self._shared: tuple | None = None  # (storage bank, generation segment, frames) of a shared storage
        self.stale_frames = 0  # transitions no longer sampled because their frames were overwritten

    def close(self) -> None:
        """Release the shared segments (storage and staging banks)."""
        for stage in self._stages:
            stage.close()
        if self._pool is not None:
            self._pool.close()
        self._stages = []
        self._storage = None

    # ------------------------------------------------------------------ operations
    def __len__(self) -> int:
        return self._sampler.available(self._size)

    @property
    def nbytes(self) -> int:
        """Bytes the storage holds: its rows and, for frame stacks, the ring of frames (0 before the first write)."""
        rows = 0 if self._storage is None else sum(
            leaf.nbytes for leaf in self._storage.values(include_nested=True, leaves_only=True))
        return rows + (0 if self._pool is None else self._pool.nbytes)

    def add(self, item: TensorDictBase) -> int | None:
        """Write one transition (a TensorDict without batch dimension). Returns its storage position (``None``
        when a `PolicyAgeFilter` at extend time drops it)."""
        index = self._write(item.unsqueeze(0))
        return int(index[0]) if len(index) else None

    def extend(self, batch: TensorDictBase) -> torch.Tensor:
        """Write every element of ``batch`` (flattened over its batch dimensions). Returns the storage positions
        written, in row order, as a 1-D int64 tensor (for `update_priority`); its length is how many were
        written (fewer when a `PolicyAgeFilter` at extend time drops stale ones).

        Raises:
            LayoutError: ``batch`` does not match the layout fixed by the first write.
        """
        return self._write(batch)

    def _write(self, batch: TensorDictBase) -> torch.Tensor:
        if batch.batch_dims < 1:
            raise LayoutError((), "a TensorDict with a leading batch dimension", f"batch_size {list(batch.batch_size)}")
        if batch.batch_dims > 1:
            batch = batch.reshape(-1)
        with self._lock:
            if self._storage is None:
                self._allocate(Layout.from_tensordict(batch[0]))
            rows = _rows(batch, self._layout)
            for f in self.filters:
                if f.when == "extend":
                    rows = rows[f.fresh(rows.get(f.key))]
            n = rows.shape[0]
            positions = (torch.arange(n) + self._cursor) % self.capacity  # row i's position, as returned
            if n == 0:
                return positions
            kept = min(n, self.capacity)  # a batch longer than the capacity keeps its last rows
            rows, start = rows[n - kept :], (self._cursor + n - kept) % self.capacity
            if self._pool is not None:
                rows = self._encode(rows)
            index = positions[n - kept :]
            if self._generation is not None:  # odd while rows are written: readers of shared storage retry
                self._generation[index] += 1
            first = min(kept, self.capacity - start)  # one contiguous slice, or two when the write wraps
            self._storage[start : start + first] = rows[:first]
            if first < kept:
                self._storage[: kept - first] = rows[first:]
            if self._generation is not None:
                self._generation[index] += 1
            self._valid[index] = True
            self._sampler.on_write(index)
            self._cursor = int((self._cursor + n) % self.capacity)
            self._size = min(self._size + n, self.capacity)
            if self._pool is not None:
                self._drop_stale_frames()
            return positions

    # ------------------------------------------------------------------ frame stacks stored frame by frame
    def _encode(self, rows: TensorDict) -> TensorDict:
        """Replace each frame-stack leaf by the serials of its frames in the pool (one pass over all of them)."""
        stacks = [rows.get(key) for key in self.frame_keys]
        serials = self._pool.put(torch.cat(stacks, dim=1) if len(stacks) > 1 else stacks[0])
        out = rows.exclude(*self.frame_keys)
        for key, part in zip(self.frame_keys, serials.split([s.shape[1] for s in stacks], dim=1)):
            out.set(("_frames", *key), part)
        out.set("_first_frame", serials.min(dim=1).values)  # the row's oldest frame: stale once the ring passes it
        return out

    def _drop_stale_frames(self) -> None:
        stale = self._valid & (self._storage.get("_first_frame") < self._pool.oldest)
        if stale.any():
            index = torch.nonzero(stale).squeeze(-1)
            self._valid[index] = False
            self._sampler.invalidate(index)
            self.stale_frames += len(index)

    def _allocate(self, layout: Layout) -> None:
        self._layout = stored = layout
        if self.frame_keys:
            stored = self._allocate_frames(layout)
        if self._share_storage and self.storage_kind == "memory":
            bank, generation = SlotBank(stored, self.capacity), Segment(8 * self.capacity)
            self._stages += [bank, generation]  # closed (and unlinked) with the other stages at shutdown
            self._shared = (bank, generation, None if self._pool is None else (self._pool.bank, self.frame_keys))
            self._storage = bank.slots
            self._generation = torch.frombuffer(generation.buf, dtype=torch.int64, count=self.capacity)
            self._valid = torch.zeros(self.capacity, dtype=torch.bool)
            return
        storage = stored.zeros(self.capacity)
        if self.storage_kind == "memmap":
            os.makedirs(self.scratch_dir, exist_ok=True)
            storage = storage.memmap_(prefix=self.scratch_dir)
        self._storage = storage
        self._valid = torch.zeros(self.capacity, dtype=torch.bool)

    def _allocate_frames(self, layout: Layout) -> Layout:
        """Build the frame pool for the frame-stack leaves of ``layout``; the layout rows are stored with."""
        leaves = {leaf.key: leaf for leaf in layout}
        stacks = []
        for key in self.frame_keys:
            leaf = leaves.get(key)
            if leaf is None or len(leaf.shape) < 2:
                raise LayoutError(key, "a frame stack [stack, *frame] (components.replay.frames)",
                                  "a missing key" if leaf is None else leaf.describe())
            stacks.append(leaf)
        frame = {(leaf.shape[1:], leaf.dtype) for leaf in stacks}
        if len(frame) != 1:
            raise LayoutError(self.frame_keys[1], f"frames like {self.frame_keys[0]}'s", stacks[1].describe(),
                              hint="every frame-stack key of one buffer holds frames of one shape and dtype")
        shape, dtype = frame.pop()
        depth = max(leaf.shape[0] for leaf in stacks)
        self._pool = FramePool(LeafSpec(("frame",), shape, dtype, "cpu"), pool_slots(self.capacity, depth),
                               share=self._share_storage)
        item = layout.zeros().exclude(*self.frame_keys)
        for leaf in stacks:
            item.set(("_frames", *leaf.key), torch.zeros(leaf.shape[0], dtype=torch.int64))
        item.set("_first_frame", torch.zeros((), dtype=torch.int64))
        return Layout.from_tensordict(item)

    def sample(self, batch_size: int | None = None) -> TensorDict:
        """Sample ``batch_size`` (default: the configured one) transitions, with their ``index`` (and
        ``_weight``, the importance weights, for the prioritized sampler).

        Raises:
            RuntimeError: nothing valid to sample.
        """
        with self._lock:
            index, weight = self._draw(batch_size or self.batch_size)
            # index_select copies each leaf once (advanced indexing plus clone would copy twice, slowly)
            out = self._storage.apply(lambda leaf: torch.index_select(leaf, 0, index), batch_size=[len(index)])
            if self._pool is not None:
                out, _ = self._pool.rebuild(out, self.frame_keys)  # under the lock: no write races it
        out.set("index", index.to(torch.long))
        if weight is not None:
            out.set("_weight", weight)
        return out

    def _draw(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self._size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        self._apply_sample_filters()
        valid = None if bool(self._valid[: self._size].all()) else self._valid
        return self._sampler.sample(n, self._size, valid)

    def _apply_sample_filters(self) -> None:
        for f in self.filters:
            if f.when == "sample":
                versions = self._storage.get(f.key)[: self._size]
                stale = (~f.fresh(versions)) & self._valid[: self._size]
                if stale.any():
                    index = torch.nonzero(stale).squeeze(-1)
                    self._valid[index] = False
                    self._sampler.invalidate(index)

    def update_priority(self, index, priority) -> None:
        """Set the priorities of ``index`` (prioritized sampler only).

        Raises:
            ConfigurationError: this buffer's sampler has no priorities.
        """
        if self.sampler_name != "prioritized":
            raise ConfigurationError(f"sampler {self.sampler_name!r} has no priorities to update",
                                     path="components.replay.sampler")
        with self._lock:
            self._sampler.update_priority(index, priority)

    def empty(self) -> None:
        """Forget every stored transition (the layout stays)."""
        with self._lock:
            self._cursor = self._size = 0
            if self._valid is not None:
                index = torch.nonzero(self._valid).squeeze(-1)
                self._valid.zero_()
                self._sampler.clear(index)

    def state_dict(self) -> dict:
        """Everything needed to resume: storage content, write position, validity, sampler state."""
        with self._lock:
            return {
                "layout": None if self._layout is None else self._layout.to_text(),
                "frames": None if self._pool is None else self._pool.state_dict(),
                "storage": None if self._storage is None else self._storage[: self._size].clone(),
                "valid": None if self._valid is None else self._valid[: self._size].clone(),
                "cursor": self._cursor,
                "size": self._size,
                "sampler": self._sampler.state_dict(),
                "generator": self._generator.get_state(),
            }

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned (same capacity)."""
        with self._lock:
            if state["storage"] is not None:
                if self._storage is None:
                    self._allocate(Layout.from_text(state["layout"]) if state.get("layout") else
                                   Layout.from_tensordict(state["storage"][0]))
                n = state["size"]
                self._storage[:n] = state["storage"]
                if self._pool is not None:
                    self._pool.load_state_dict(state["frames"])
                self._valid.zero_()
                self._valid[:n] = state["valid"]
            self._cursor, self._size = state["cursor"], state["size"]
            self._sampler.load_state_dict(state["sampler"])
            self._generator.set_state(state["generator"])

    # ------------------------------------------------------------------ shared-memory staging (process twin)
    def _open_extend_stage(self, layout: Layout, rows: int):
        bank = SlotBank(layout, rows)
        self._stages.append(bank)
        return len(self._stages) - 1, bank

    def _extend_from_stage(self, stage: int, n: int):
        """`extend` of the first ``n`` staged rows; the positions as a numpy array (it pickles faster)."""
        return self._write(self._stages[stage].slots[:n]).numpy()

    def _shared_storage(self):
        """The storage bank and its per-row write generations, for clients that gather samples themselves."""
        with self._lock:
            if self._generation is None:
                raise RuntimeError("cannot sample from an empty replay buffer")
            return self._shared

    def _sample_indices(self, batch_size: int):
        """Indices (and importance weights) of a sample, with the rows' write generations at this moment
        (as numpy arrays: they pickle several times faster than tensors)."""
        with self._lock:
            index, weight = self._draw(batch_size)
            return index.numpy(), None if weight is None else weight.numpy(), self._generation[index].numpy()



def _rows(batch: TensorDictBase, layout: Layout) -> TensorDict:
    """Select the declared leaves of ``batch`` and check them against the per-item ``layout``."""
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


def _key(key) -> tuple[str, ...]:
    """A nested key from ``"next.observation"``, ``("next", "observation")`` or ``"observation"``."""
    return tuple(key.split(".")) if isinstance(key, str) else tuple(key)
