"""Frame-deduplicated storage of frame stacks: each frame of an observation stack is stored once.

Consecutive observations of a frame-stacked env (Atari's ``(4, 84, 84)``) share three of their four frames, and a
transition's next observation shares three with its observation, so storing whole stacks keeps every frame eight
times over (a 100k-transition buffer of observation and next observation: 5.6 GB). A `FramePool` keeps
single frames in a ring of slots; a stored stack becomes the serial numbers of its frames (``stack`` int64 each)
and is rebuilt from them at sample time, as memory-optimised DQN buffers do.

Frames are found again by content, not by position: each incoming frame is hashed (vectorised, one pass over the
batch), looked up among the live frames and compared byte for byte before it is reused, so the pool is correct
whatever the order of envs, steps, n-step windows and episode ends in a batch, and a stack rebuilt is always the
stack written. A frame is written again rather than reused once it is older than half the ring, which keeps the
frames of every transition close in age to the transition itself; a transition whose oldest frame has been
overwritten all the same (a batch that brought more new frames than the ring's spare room) is reported stale by
`FramePool.live` and the storage stops sampling it.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from transports.layout import Layout, LeafSpec
from transports.segments import SlotBank

SPARE = 0.1  # ring slots beyond one frame per transition: the frames of episode starts and ends
_HASH_WEIGHTS: dict[int, torch.Tensor] = {}


def pool_slots(capacity: int, stack: int) -> int:
    """Ring slots for a buffer of ``capacity`` transitions of ``stack``-frame observations: one new frame per
    transition, the spare share for episode boundaries, and room for the first stacks."""
    return capacity + int(capacity * SPARE) + 4 * stack


class FramePool:
    """A ring of single frames addressed by serial number (frame ``s`` lives in slot ``s % slots``).

    Args:
        frame: the layout of one frame (shape and dtype).
        slots: ring size, in frames.
        share: keep the ring in shared memory, for clients that rebuild samples themselves.
        bank: an existing shared ring to read (`attach`).
    """

    def __init__(self, frame: LeafSpec, slots: int, share: bool = False, bank: SlotBank | None = None):
        self.frame, self.slots = frame, slots
        layout = Layout.from_tensordict(TensorDict({"frame": torch.zeros(frame.shape, dtype=frame.dtype),
                                                    "serial": torch.zeros((), dtype=torch.int64)}))
        self.bank = bank if bank is not None else (SlotBank(layout, slots) if share else None)
        ring = self.bank.slots if self.bank is not None else layout.zeros(slots)
        self.frames, self.serials = ring.get("frame"), ring.get("serial")
        if bank is None:
            self.serials.fill_(-1)
        self.next_serial = 0
        self._by_hash: dict[int, int] = {}  # hash of a frame -> serial of its newest copy (owner side only)

    @classmethod
    def attach(cls, bank: SlotBank) -> "FramePool":
        """A reader of a shared ring (a client that rebuilds samples itself)."""
        frame = next(leaf for leaf in bank.layout if leaf.key == ("frame",))
        return cls(frame, bank.num_slots, bank=bank)

    def rebuild(self, rows: TensorDict, keys, verify: bool = False) -> tuple[TensorDict, bool]:
        """``rows`` of a storage with their frame stacks rebuilt under ``keys``, and (with ``verify``, for a reader
        racing the writer, who retries when not) whether every frame read was still the one the row names."""
        live = True
        for key in keys:
            serials = rows.get(("_frames", *key))
            rows.set(key, self.get(serials))
            live = live and (not verify or bool(self.live(serials).all()))
        return rows.exclude("_frames", "_first_frame"), live

    @property
    def nbytes(self) -> int:
        """Bytes of the ring: its frames and their serials."""
        return self.frames.nbytes + self.serials.nbytes

    def close(self) -> None:
        """Detach from a shared ring (its creator also removes it); nothing for a private one."""
        if self.bank is not None:
            self.bank.close()

    # ------------------------------------------------------------------ writing (the owner)
    def put(self, stacks: torch.Tensor) -> torch.Tensor:
        """Store the frames of ``stacks`` (``[N, stack, *frame]``) not already live; their serials ``[N, stack]``."""
        n, depth = stacks.shape[:2]
        flat = stacks.reshape(n * depth, *self.frame.shape)
        words = _words(flat)  # each frame as one row of machine words: hashing and comparing run 8x fewer elements
        keys, group = torch.unique(_hashes(words), return_inverse=True)
        first = torch.full((len(keys),), n * depth, dtype=torch.long).scatter_reduce_(
            0, group, torch.arange(n * depth), "amin")  # the first frame of each hash in the batch
        # a frame whose hash matches an earlier one of the batch but whose bytes do not is a collision: its own frame
        alone = ~_same(words, torch.index_select(words, 0, first[group]))
        # look the batch's distinct frames up among the live ones younger than half the ring, then compare bytes
        fresh_after = self.next_serial - self.slots // 2
        found = torch.tensor([self._by_hash.get(k, -1) for k in keys.tolist()], dtype=torch.long)
        hit = found >= max(fresh_after, 0)
        if hit.any():
            rows = torch.nonzero(hit).squeeze(-1)
            slot = found[rows] % self.slots
            held = (self.serials[slot] == found[rows]) & _same(
                _words(torch.index_select(self.frames, 0, slot)), torch.index_select(words, 0, first[rows]))
            hit[rows[~held]] = False
        serial_of_key = torch.where(hit, found, -1)
        new_keys = torch.nonzero(~hit).squeeze(-1)
        serial_of_key[new_keys] = self.next_serial + torch.arange(len(new_keys))
        serials = serial_of_key[group]
        new_rows = [first[new_keys]]
        if alone.any():
            extra = torch.nonzero(alone).squeeze(-1)
            serials[extra] = self.next_serial + len(new_keys) + torch.arange(len(extra))
            new_rows.append(extra)
        rows = torch.cat(new_rows)
        if len(rows):
            count = len(rows)
            written = self.next_serial + torch.arange(count)
            for k, s in zip(keys[new_keys].tolist(), written[: len(new_keys)].tolist()):
                self._by_hash[k] = s
            if len(rows) > self.slots:  # more new frames than the ring holds: only the last ones survive
                rows, written = rows[-self.slots:], written[-self.slots:]
            slot = written % self.slots
            self.serials[slot] = -1  # readers see a slot in rewrite as not live
            self.frames.index_copy_(0, slot, torch.index_select(flat, 0, rows))
            self.serials[slot] = written
            self.next_serial += count
            if len(self._by_hash) > 2 * self.slots:  # forget hashes of overwritten frames
                oldest = self.oldest
                self._by_hash = {k: s for k, s in self._by_hash.items() if s >= oldest}
        return serials.reshape(n, depth)

    @property
    def oldest(self) -> int:
        """The serial of the oldest frame still in the ring."""
        return max(0, self.next_serial - self.slots)

    # ------------------------------------------------------------------ reading
    def get(self, serials: torch.Tensor) -> torch.Tensor:
        """The frames of ``serials`` (any shape ``[...]``), as ``[..., *frame]``."""
        out = torch.index_select(self.frames, 0, (serials.reshape(-1) % self.slots))
        return out.reshape(*serials.shape, *self.frame.shape)

    def live(self, serials: torch.Tensor) -> torch.Tensor:
        """Whether every frame of each row of ``serials`` (``[N, ...]``) is still in the ring, per row."""
        held = torch.index_select(self.serials, 0, serials.reshape(-1) % self.slots).reshape(serials.shape)
        return (held == serials).reshape(serials.shape[0], -1).all(dim=1)

    def state_dict(self) -> dict:
        """Copies of the ring's frames and serials, and the next serial, for a checkpoint."""
        return {"frames": self.frames.clone(), "serials": self.serials.clone(), "next_serial": self.next_serial}

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned (a ring of the same size and frame layout)."""
        self.frames.copy_(state["frames"])
        self.serials.copy_(state["serials"])
        self.next_serial = int(state["next_serial"])
        self._by_hash = {}  # rebuilt as frames arrive: until then frames are stored again, never wrongly reused


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Per row, whether ``a`` and ``b`` (``[M, words]``) hold the same words."""
    return (a == b).all(dim=1)


def _words(frames: torch.Tensor) -> torch.Tensor:
    """``[M, *frame]`` as ``[M, words]``: int64 words where a frame's bytes divide by 8, else its own elements."""
    flat = frames.reshape(frames.shape[0], -1)
    if (flat.shape[1] * flat.element_size()) % 8 or not flat.is_contiguous():
        return flat
    return flat.view(torch.uint8).view(torch.int64)


def _hashes(words: torch.Tensor) -> torch.Tensor:
    """One hash per row of ``words``: a random projection of every word, one matrix product for the batch. Equal
    frames hash alike; a collision costs only a frame stored twice, never a wrong one (reuse compares every word)."""
    width = words.shape[1]
    weights = _HASH_WEIGHTS.get(width)
    if weights is None:
        weights = _HASH_WEIGHTS[width] = torch.randn(width, generator=torch.Generator().manual_seed(width),
                                                     dtype=torch.float64)
    return words.to(torch.float64) @ weights
