"""The replay client of a thread- or process-placed buffer.

Every operation is one acknowledged command. With transport ``shared_memory`` the payloads of ``extend``
and ``sample`` do not travel in the command: the client writes rows into its own staging slots in shared
memory and the owner copies them into storage; the owner keeps its storage in shared memory and answers a
sample with indices only, and the client gathers the rows itself (one copy, as in one process), retrying if a
concurrent write touched a row while it was copied. The sample layout is fixed per endpoint: a different
batch size raises `LayoutError`.
"""

from __future__ import annotations

import threading

import torch
from tensordict import TensorDict, TensorDictBase

from transports.kernel.errors import LayoutError
from transports.layout import Layout

from ..commands import CommandClient
from .frames import FramePool
from .operations import ReplayOperations
from .payload import PayloadChannels


MAX_RETRIES = 10


class ReplayClient(ReplayOperations, CommandClient):
    """``add``, ``extend``, ``sample``, ``update_priority``, ``len``, ``empty``, ``state_dict``,
    ``load_state_dict``, and the domain operations of `ReplayOperations` over
    them.

    Args:
        endpoint: the owner's command endpoint.
        shared_memory: rows travel through shared memory (the owner's storage and this client's staging slots).
        batch_size: rows per ``sample`` when none is given.
        payload: the payload endpoint of a ``distributed`` owner, or ``None``.
        operations: the explicit layouts of the payload endpoint's operations, or ``None``.
    """

    def __init__(self, endpoint, *, shared_memory: bool = False, batch_size: int = 256, payload=None,
                 operations=None):
        super().__init__(endpoint)
        self._payload_endpoint, self._operations = payload, operations
        self._channels = None if payload is None else PayloadChannels(payload, self._call, operations)
        self.shared_memory = shared_memory
        self.batch_size = batch_size
        self._lock = threading.Lock()
        self._extend_stage = None  # (stage id, bank, rows)
        self._storage = None  # (storage bank, generation segment, generation view): the owner's storage, shared
        self._fixed = 0
        self._frames = None  # (ring of frames, frame-stack keys) of a frame-deduplicated shared storage
        self._layout: Layout | None = None

    def __getstate__(self):
        return {"endpoint": self._endpoint, "shared_memory": self.shared_memory, "batch_size": self.batch_size,
                "payload": self._payload_endpoint, "operations": self._operations}

    def __setstate__(self, state):
        self.__init__(state["endpoint"], shared_memory=state["shared_memory"], batch_size=state["batch_size"],
                      payload=state.get("payload"), operations=state.get("operations"))

    def __len__(self) -> int:
        return self._call("__len__")

    def add(self, item: TensorDictBase) -> int | None:
        """Write one transition; its storage position (``None`` when an extend-time filter drops it)."""
        index = self.extend(item.unsqueeze(0))
        return int(index[0]) if len(index) else None

    def extend(self, batch: TensorDictBase) -> torch.Tensor:
        """Write the rows of ``batch``; the storage positions written, in row order (a 1-D int64 tensor)."""
        self.note_write(batch)
        if self._channels is not None:
            return self._channels.extend(batch)
        if not self.shared_memory:
            return self._call("extend", batch)
        if batch.batch_dims > 1:
            batch = batch.reshape(-1)
        n = batch.shape[0]
        with self._lock:
            if self._layout is None:
                self._layout = Layout.from_tensordict(batch[0])
            if self._extend_stage is None or self._extend_stage[2] < n:
                stage, bank = self._call("_open_extend_stage", self._layout, n)
                self._extend_stage = (stage, bank, n)
            stage, bank, _ = self._extend_stage
            for leaf in self._layout:
                value = batch.get(leaf.key, None)
                if value is None:
                    raise LayoutError(leaf.key, leaf.describe(), "a missing key")
                if tuple(value.shape[1:]) != leaf.shape or value.dtype != leaf.dtype:
                    raise LayoutError(leaf.key,
                                      f"shape [N, {', '.join(map(str, leaf.shape))}] dtype {str(leaf.dtype)[6:]}",
                                      f"shape {list(value.shape)} dtype {str(value.dtype)[6:]}")
                bank.slots.get(leaf.key)[:n].copy_(value)
            return torch.from_numpy(self._call("_extend_from_stage", stage, n))

    def sample(self, batch_size: int | None = None) -> TensorDict:
        """Sample ``batch_size`` (default: the client's ``batch_size``) transitions, with their ``index`` (and
        ``_weight``, the importance weights, for the prioritized sampler).

        Raises:
            RuntimeError: nothing valid to sample, or (shared memory) the rows kept being overwritten while read.
            LayoutError: a shared-memory or ``distributed`` endpoint is asked for another batch size than its first.
        """
        n = batch_size or self.batch_size
        if self._channels is not None:
            return self._channels.sample(n)
        if not self.shared_memory:
            return self._call("sample", n)
        with self._lock:
            if self._storage is None:
                bank, generation, frames = self._call("_shared_storage")
                self._frames = None if frames is None else (FramePool.attach(frames[0]), frames[1])
                self._storage = (bank, generation,
                                 torch.frombuffer(generation.buf, dtype=torch.int64, count=bank.num_slots))
                self._fixed = n
            if n != self._fixed:
                raise LayoutError(("batch_size",), f"{self._fixed} (fixed by this endpoint's first sample)", str(n),
                                  hint="the shared-memory sample layout is fixed per endpoint")
            bank, _, written = self._storage
            for _ in range(MAX_RETRIES):
                index, weight, before = self._call("_sample_indices", n)
                index, before = torch.from_numpy(index), torch.from_numpy(before)
                out = bank.slots.apply(lambda leaf: torch.index_select(leaf, 0, index), batch_size=[n])
                live = True
                if self._frames is not None:  # frame stacks rebuilt from the shared ring of frames
                    out, live = self._frames[0].rebuild(out, self._frames[1], verify=True)
                after = written[index]
                if live and torch.equal(before, after) and not bool((after % 2).any()):
                    break  # no row (and no frame) was rewritten while it was copied
            else:
                raise RuntimeError(f"samples kept being overwritten while read ({MAX_RETRIES} tries)")
        out.set("index", index)
        if weight is not None:
            out.set("_weight", torch.from_numpy(weight))
        return out

    def update_priority(self, index, priority) -> None:
        """Set the priorities of the transitions at ``index`` (prioritized sampler only)."""
        if self._channels is not None:
            return self._channels.update_priority(index, priority)
        return self._call("update_priority", index, priority)

    def empty(self) -> None:
        """Forget every stored transition (the layout stays)."""
        return self._call("empty")

    def state_dict(self) -> dict:
        """Everything the owner needs to resume: storage content, write position, validity, sampler state."""
        return self._call("state_dict")

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned into the owner (same capacity)."""
        return self._call("load_state_dict", state)
