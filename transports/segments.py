"""Named shared-memory segments and slot banks: the public pieces of shared memory that services build on.

Segments are files named ``rlsvc_<pid>_<n>`` in the segment directory (`transports.segment_dir`: ``/dev/shm``
unless ``RLSVC_SHM_DIR`` names another). Each one's pages are reserved as it is made, so a segment that does not fit
raises `SharedMemoryFull` there and then, instead of a SIGBUS when a page is first
touched. The creating process unlinks them on close; in ``/dev/shm`` it also registers them with multiprocessing's
resource tracker, so they are removed even if it dies (the tracker unlinks names in ``/dev/shm`` only: elsewhere a dead
creator's segments are removed by its host, or by the next run's start, `remove_orphans`). Processes that attach
by name never unlink. A `SlotBank` lays TensorDicts of one `Layout` out in one segment.
"""

from __future__ import annotations

import errno
import itertools
import math
import mmap
import os
import time
from multiprocessing import resource_tracker

import torch
from tensordict import TensorDict

from .kernel.errors import NO_SPACE, SharedMemoryFull
from .layout import Layout
from .segment_dir import DEFAULT, remedy, room_text, segment_dir, size_text

SHM_PREFIX = "rlsvc_"
_counter = itertools.count()


class Segment:
    """A named shared-memory segment. Picklable by name: it re-attaches wherever it is unpickled.

    Args:
        size: bytes (rounded up to at least one byte).
        name: attach to this existing segment instead of creating one.
        directory: where the segment is (default: `segment_dir`).

    Raises:
        SharedMemoryFull: a new segment does not fit in the segment directory (nothing of it is left there).
    """

    def __init__(self, size: int, name: str | None = None, directory: str | None = None):
        self.size = max(int(size), 1)
        self.owner = name is None
        self.name = name or f"{SHM_PREFIX}{os.getpid()}_{next(_counter)}_{os.urandom(3).hex()}"
        self.directory = directory or segment_dir()
        # the resource tracker unlinks what a dead creator left with shm_unlink, which reaches /dev/shm only
        self.tracked = self.owner and self.directory == DEFAULT
        path = os.path.join(self.directory, self.name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if self.owner else 0)
        if self.tracked:  # registered before the file exists: a creator killed in between leaves no unknown name for
            resource_tracker.register("/" + self.name, "shared_memory")  # remove_segments_of to unregister
        created = False
        try:
            fd = os.open(path, flags, 0o600)
            created = self.owner
            try:
                if self.owner:
                    os.ftruncate(fd, self.size)
                    _reserve(fd, self.size, self.directory)
                self._mmap = mmap.mmap(fd, self.size)
            finally:
                os.close(fd)
        except BaseException:
            if created:
                os.unlink(path)
            if self.tracked:
                resource_tracker.unregister("/" + self.name, "shared_memory")
            raise
        self.buf = memoryview(self._mmap)

    def __reduce__(self):
        return (Segment, (self.size, self.name, self.directory))

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
                os.unlink(os.path.join(self.directory, self.name))
            except FileNotFoundError:
                pass
            if self.tracked:
                resource_tracker.unregister("/" + self.name, "shared_memory")


def _reserve(fd: int, size: int, directory: str) -> None:
    """Back every page of a new segment now: a tmpfs without room for them says so here (ENOSPC), where a page
    first touched later would end whichever process touched it with SIGBUS."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in NO_SPACE:
            raise SharedMemoryFull(
                f"ran out of shared memory in {directory} ({room_text(directory)}): a segment of {size_text(size)} "
                f"does not fit; {remedy(directory)}") from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system that cannot reserve: pages on first use
            raise


class SlotBank:
    """``num_slots`` TensorDicts of one `Layout` in one shared segment; each leaf is a tensor view.

    ``bank.slots`` is a TensorDict with a leading ``num_slots`` dimension whose leaves live in shared memory:
    ``bank.slots[i]`` reads or writes slot ``i`` without copying the bank.
    """

    def __init__(self, layout: Layout, num_slots: int, segment: Segment | None = None):
        self.layout = layout
        self.num_slots = num_slots
        offsets, total = _offsets(layout, num_slots)
        self.segment = segment or Segment(total)
        self.slots = TensorDict(batch_size=(num_slots, *layout.batch_size))
        for leaf, offset in zip(layout, offsets):
            count = num_slots * math.prod(leaf.shape)
            flat = (torch.frombuffer(self.segment.buf, dtype=leaf.dtype, count=count, offset=offset) if count
                    else torch.empty(0, dtype=leaf.dtype))
            self.slots.set(leaf.key, flat.view(num_slots, *leaf.shape))

    def __reduce__(self):
        return (SlotBank, (self.layout, self.num_slots, self.segment))

    def close(self) -> None:
        """Drop the tensor views and detach from the segment (its creator also removes it)."""
        self.slots = None
        self.segment.close()

    @staticmethod
    def nbytes(layout: Layout, num_slots: int) -> int:
        """Bytes of the segment a bank of ``num_slots`` TensorDicts of ``layout`` takes."""
        return _offsets(layout, num_slots)[1]


def _offsets(layout: Layout, num_slots: int) -> tuple[list[int], int]:
    """Where each leaf of a bank starts (cache-line aligned), and the bank's bytes."""
    offsets, total = [], 0
    for leaf in layout:
        total = (total + 63) // 64 * 64
        offsets.append(total)
        total += num_slots * leaf.nbytes
    return offsets, total


def creator_of(name: str) -> int | None:
    """The pid of the process that created segment ``name``; ``None`` for a name not of this module."""
    pid = name[len(SHM_PREFIX):].split("_", 1)[0] if name.startswith(SHM_PREFIX) else ""
    return int(pid) if pid.isdigit() else None


def segments_of(pids) -> list[str]:
    """Names of the segments that processes ``pids`` created and that still exist."""
    prefixes = tuple(f"{SHM_PREFIX}{pid}_" for pid in pids)
    try:
        return [name for name in os.listdir(segment_dir()) if name.startswith(prefixes)]
    except FileNotFoundError:
        return []


def remove_orphans() -> list[str]:
    """Unlink every segment whose creating process no longer exists (it was killed before it could, and so was the
    resource tracker that would have); returns their names. A run calls it as it starts: no segment of a dead run
    outlives the next one's start."""
    removed, directory = [], segment_dir()
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        pid = creator_of(name)
        if pid is not None and not pid_alive(pid):
            try:
                os.unlink(os.path.join(directory, name))
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
    removed, directory = [], segment_dir()
    prefix = f"{SHM_PREFIX}{pid}_"
    for name in os.listdir(directory):
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(directory, name))
            except FileNotFoundError:
                continue
            if tracked_here and directory == DEFAULT:
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
