"""Named shared-memory segments and slot banks: the public pieces of shared memory that services build on.

Segments are named ``rlsvc_<pid>_<n>`` under ``/dev/shm`` (Linux). The creating process unlinks them on
close and registers them with multiprocessing's resource tracker, so they are removed even if it dies;
processes that attach by name never unlink. A :class:`SlotBank` lays TensorDicts of one
:class:`~transports.layout.Layout` out in one segment.
"""

from __future__ import annotations

import itertools
import math
import mmap
import os
import time
from multiprocessing import resource_tracker

import torch
from tensordict import TensorDict

from .layout import Layout

SHM_PREFIX = "rlsvc_"
_SHM_DIR = "/dev/shm"
_counter = itertools.count()


class Segment:
    """A named shared-memory segment. Picklable by name: it re-attaches wherever it is unpickled.

    Args:
        size: bytes (rounded up to at least one byte).
        name: attach to this existing segment instead of creating one.
    """

    def __init__(self, size: int, name: str | None = None):
        self.size = max(int(size), 1)
        self.owner = name is None
        self.name = name or f"{SHM_PREFIX}{os.getpid()}_{next(_counter)}_{os.urandom(3).hex()}"
        path = os.path.join(_SHM_DIR, self.name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if self.owner else 0)
        if self.owner:  # registered before the file exists: a creator killed in between leaves no unknown name for
            resource_tracker.register("/" + self.name, "shared_memory")  # remove_segments_of to unregister
        created = False
        try:
            fd = os.open(path, flags, 0o600)
            created = self.owner
            try:
                if self.owner:
                    os.ftruncate(fd, self.size)
                self._mmap = mmap.mmap(fd, self.size)
            finally:
                os.close(fd)
        except BaseException:
            if created:
                os.unlink(path)
            if self.owner:
                resource_tracker.unregister("/" + self.name, "shared_memory")
            raise
        self.buf = memoryview(self._mmap)

    def __reduce__(self):
        return (Segment, (self.size, self.name))

    def close(self) -> None:
        """Detach; the creator also unlinks the name. Safe to call more than once. Tensors viewing the segment stay
        valid: the memory is unmapped when the last of them is freed."""
        if getattr(self, "buf", None) is None:
            return
        # Never unmapped here: a tensor made by torch.frombuffer holds the memoryview, not an export of it, so
        # releasing the view and closing the mmap would succeed and leave such tensors pointing at unmapped memory
        # (a crash, or silent corruption of whatever is mapped there next). The mapping goes with its last view.
        self.buf = self._mmap = None
        if self.owner:
            try:
                os.unlink(os.path.join(_SHM_DIR, self.name))
            except FileNotFoundError:
                pass
            resource_tracker.unregister("/" + self.name, "shared_memory")


class SlotBank:
    """``num_slots`` TensorDicts of one :class:`Layout` in one shared segment; each leaf is a tensor view.

    ``bank.slots`` is a TensorDict with a leading ``num_slots`` dimension whose leaves live in shared memory:
    ``bank.slots[i]`` reads or writes slot ``i`` without copying the bank.
    """

    def __init__(self, layout: Layout, num_slots: int, segment: Segment | None = None):
        self.layout = layout
        self.num_slots = num_slots
        offsets, total = [], 0
        for leaf in layout:
            total = (total + 63) // 64 * 64  # cache-line aligned leaves
            offsets.append(total)
            total += num_slots * leaf.nbytes
        self.segment = segment or Segment(total)
        self.slots = TensorDict(batch_size=(num_slots, *layout.batch_size))
        for leaf, offset in zip(layout, offsets):
            count = num_slots * math.prod(leaf.shape)
            flat = torch.frombuffer(self.segment.buf, dtype=leaf.dtype, count=count, offset=offset) if count else torch.empty(0, dtype=leaf.dtype)
            self.slots.set(leaf.key, flat.view(num_slots, *leaf.shape))

    def __reduce__(self):
        return (SlotBank, (self.layout, self.num_slots, self.segment))

    def close(self) -> None:
        self.slots = None
        self.segment.close()


def creator_of(name: str) -> int | None:
    """The pid of the process that created segment ``name``; ``None`` for a name not of this module."""
    pid = name[len(SHM_PREFIX):].split("_", 1)[0] if name.startswith(SHM_PREFIX) else ""
    return int(pid) if pid.isdigit() else None


def segments_of(pids) -> list[str]:
    """Names of the segments that processes ``pids`` created and that still exist."""
    prefixes = tuple(f"{SHM_PREFIX}{pid}_" for pid in pids)
    try:
        return [name for name in os.listdir(_SHM_DIR) if name.startswith(prefixes)]
    except FileNotFoundError:
        return []


def remove_orphans() -> list[str]:
    """Unlink every segment whose creating process no longer exists (it was killed before it could, and so was the
    resource tracker that would have); returns their names. A run calls it as it starts: no segment of a dead run
    outlives the next one's start."""
    removed = []
    try:
        names = os.listdir(_SHM_DIR)
    except FileNotFoundError:
        return removed
    for name in names:
        pid = creator_of(name)
        if pid is not None and not pid_alive(pid):
            try:
                os.unlink(os.path.join(_SHM_DIR, name))
                removed.append(name)
            except OSError:
                continue
    return removed


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie counts until it is reaped; another user's process too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_segments_of(pid: int, *, tracked_here: bool = True) -> list[str]:
    """Unlink every segment a (dead) process created; returns their names. Used after a child was killed.

    Args:
        tracked_here: the process shared this one's resource tracker (a multiprocessing child), whose record of
            each name is dropped too; ``False`` for a process of its own tracker (a Ray actor).
    """
    removed = []
    prefix = f"{SHM_PREFIX}{pid}_"
    for name in os.listdir(_SHM_DIR):
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(_SHM_DIR, name))
            except FileNotFoundError:
                continue
            if tracked_here:
                resource_tracker.unregister("/" + name, "shared_memory")
            removed.append(name)
    return removed


def remove_segments_left_by(pids, wait: float) -> list[str]:
    """Wait up to ``wait`` seconds for processes ``pids`` (each with its own resource tracker) to end, then unlink
    the segments the ended ones left; a process still running keeps its own. Returns the names unlinked. A process
    that left none (it unlinked its own as it stopped) is not waited for."""
    pids = [pid for pid in pids if segments_of([pid])]
    deadline = time.monotonic() + wait
    while any(map(pid_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [name for pid in pids if not pid_alive(pid) for name in remove_segments_of(pid, tracked_here=False)]
