"""Mechanics the process transports share: named shared-memory segments, slot banks laid out from a
:class:`~transports.layout.Layout`, the peer-status block that tells clients whether their server is alive,
and the waiting loop that turns "no answer yet" into a result, a peer failure or a timeout.

Segments are named ``rlsvc_<pid>_<n>`` under ``/dev/shm`` (Linux). The creating process unlinks them on
close and registers them with multiprocessing's resource tracker, so they are removed even if it dies;
processes that attach by name never unlink.
"""

from __future__ import annotations

import itertools
import math
import mmap
import os
import time
from multiprocessing import resource_tracker
from typing import Callable

import numpy as np
import torch
from tensordict import TensorDict

from .errors import PeerFailureError, ServiceTimeoutError, TransportError
from .layout import Layout

SHM_PREFIX = "rlsvc_"
_SHM_DIR = "/dev/shm"
_counter = itertools.count()
WAIT_SLICE = 0.1
"""Seconds a waiting client blocks before it re-checks that its peer is alive."""


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
        fd = os.open(path, flags, 0o600)
        try:
            if self.owner:
                os.ftruncate(fd, self.size)
                resource_tracker.register("/" + self.name, "shared_memory")
            self._mmap = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        self.buf = memoryview(self._mmap)

    def __reduce__(self):
        return (Segment, (self.size, self.name))

    def close(self) -> None:
        """Detach; the creator also unlinks the name. Safe to call more than once."""
        if getattr(self, "buf", None) is None:
            return
        try:
            self.buf.release()
            self._mmap.close()
        except BufferError:  # tensor views still alive elsewhere: the mapping goes when they do
            pass
        self.buf = None
        if self.owner:
            try:
                os.unlink(os.path.join(_SHM_DIR, self.name))
            except FileNotFoundError:
                pass
            resource_tracker.unregister("/" + self.name, "shared_memory")


class PeerStatus:
    """A tiny shared block: is the server alive, and which pid serves. Written by the owner side.

    Clients check it while they wait, so a dead server turns into :class:`PeerFailureError` quickly even
    when nothing else wakes them.
    """

    ALIVE, PID, STOPPED = 0, 1, 2

    def __init__(self, segment: Segment | None = None):
        self.segment = segment or Segment(3 * 8)
        self._view = np.frombuffer(self.segment.buf, dtype=np.int64, count=3)

    def __reduce__(self):
        return (PeerStatus, (self.segment,))

    def set_serving(self, pid: int) -> None:
        self._view[self.PID] = pid
        self._view[self.ALIVE] = 1

    def set_dead(self, stopped: bool = False) -> None:
        self._view[self.STOPPED] = int(stopped)
        self._view[self.ALIVE] = 0

    def problem(self, probe: bool = True) -> str | None:
        """``None`` while the peer serves, else why not. ``probe=False`` reads the flags only (the check before
        each request, where a signal to the server pid would cost a third of a small round trip): a server killed
        before its owner marked it dead is then found by the waiting loop, which probes."""
        if self._view is None:  # the owner closed the transport in this very process
            return "the server was shut down"
        if self._view[self.ALIVE] == 1:
            if not probe:
                return None
            pid = int(self._view[self.PID])
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return f"the server process (pid {pid}) died"
            except PermissionError:
                pass
            return None
        if self._view[self.STOPPED]:
            return "the server was shut down"
        return "the server is not running (it died or has not started)"

    def close(self) -> None:
        self._view = None
        self.segment.close()


_pid = os.getpid()  # this process's pid, kept by a fork hook: os.getpid is a system call, a per-request cost


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


class EndpointClaims:
    """Which process uses each client endpoint of a transport: an endpoint answers one process.

    A client pickled into two processes would share one reply channel, and each copy could read the other's
    answers. The first process that uses endpoint ``i`` claims it; a copy in another live process is refused
    at its call site with :class:`~transports.errors.TransportError` instead of waiting forever. A claim by a
    process that has exited is taken over. Pickle with the transport, at process creation.

    Args:
        n: endpoints.
        lock: a multiprocessing lock shared by the processes involved.
    """

    def __init__(self, n: int, lock, segment: Segment | None = None):
        self.n, self.lock = n, lock
        self.segment = segment or Segment(8 * n)
        self._pids = np.frombuffer(self.segment.buf, dtype=np.int64, count=n)
        self._held: dict[int, int] = {}  # endpoint -> pid, claims this copy made (a repeat call is a dict lookup)

    def __reduce__(self):
        return (EndpointClaims, (self.n, self.lock, self.segment))

    def claim(self, index: int, what: str) -> None:
        """Claim endpoint ``index`` for this process; raise if another live process holds it. Called on every
        request: after the first claim in a process it costs a dict lookup."""
        pid = _pid
        if self._held.get(index) == pid:
            return
        with self.lock:
            user = int(self._pids[index])
            if user != pid and user and pid_alive(user):
                raise TransportError(
                    f"{what} {index} is used by process {user}: create one client per worker process "
                    "(call client() once for each, in the owner's process, before starting the workers)"
                )
            self._pids[index] = pid
        self._held[index] = pid

    def close(self) -> None:
        self._pids = None
        self.segment.close()


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a zombie counts until it is reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


SPIN_S = 50e-6
"""Seconds a waiter polls before it blocks: a blocked process can take tens of microseconds to be woken on a small
VM, more than a whole small round trip. Servers spin when idle; a slot client only while its request is the only
one in flight (many spinning clients would take the cores the server needs)."""
YIELD_EVERY = 8
"""Spin turns between two yields of the core: a peer that shares it runs within a few microseconds instead of after
our time slice, while a yield every turn would add its system call to every wake-up (about 1 us of a 17 us round
trip)."""


def spin(ready: Callable[[], bool], seconds: float = SPIN_S) -> bool:
    """Call ``ready()`` until it is true (True) or ``seconds`` have passed (False)."""
    clock, turn = time.perf_counter, 0
    end = clock() + seconds
    while clock() < end:
        if ready():
            return True
        turn += 1
        if turn % YIELD_EVERY == 0:
            os.sched_yield()
    return False


class Spinners:
    """Which client endpoints of a transport are polling for an answer, in a shared block: a client polls only while
    no other does, so a crowd of waiting clients never takes the cores their server needs. Each entry holds the
    ``time.monotonic()`` (one clock for every process of the machine) until which its client polls, so the entry of a
    client killed while polling expires on its own. Pickle with the transport.

    Args:
        n: endpoints.
    """

    def __init__(self, n: int, segment: Segment | None = None):
        self.n = n
        self.segment = segment or Segment(8 * n)
        self._until = np.frombuffer(self.segment.buf, dtype=np.float64, count=n)

    def __reduce__(self):
        return (Spinners, (self.n, self.segment))

    def spin(self, index: int, ready: Callable[[], bool], seconds: float) -> bool:
        """As :func:`spin` for endpoint ``index``, unless another endpoint polls now (False at once)."""
        until, now = self._until, time.monotonic()
        if until.max() > now:
            return False
        until[index] = now + seconds
        try:
            return spin(ready, seconds)
        finally:
            until[index] = 0.0

    def close(self) -> None:
        self._until = None
        self.segment.close()


def wait_for(
    poll: Callable[[float], bool],
    peer: PeerStatus,
    timeout: float | None,
    what: str,
) -> None:
    """Call ``poll(slice)`` (which blocks up to ``slice`` seconds and says whether the answer came) until it
    succeeds; raise :class:`PeerFailureError` if the peer dies first, :class:`ServiceTimeoutError` after
    ``timeout`` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        step = WAIT_SLICE if deadline is None else max(0.0, min(WAIT_SLICE, deadline - time.monotonic()))
        if poll(step):
            return
        problem = peer.problem()
        if problem is not None:
            if poll(0.0):  # the answer may have landed just before the server went away
                return
            raise PeerFailureError(f"{what}: {problem}")
        if deadline is not None and time.monotonic() >= deadline:
            raise ServiceTimeoutError(f"{what}: no answer within {timeout} s (the server is alive)")


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


def segments_of(pids) -> list[str]:
    """Names of the segments that processes ``pids`` created and that still exist."""
    prefixes = tuple(f"{SHM_PREFIX}{pid}_" for pid in pids)
    try:
        return [name for name in os.listdir(_SHM_DIR) if name.startswith(prefixes)]
    except FileNotFoundError:
        return []


def remove_segments_of(pid: int) -> list[str]:
    """Unlink every segment a (dead) process created; returns their names. Used after a child was killed."""
    removed = []
    prefix = f"{SHM_PREFIX}{pid}_"
    for name in os.listdir(_SHM_DIR):
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(_SHM_DIR, name))
            except FileNotFoundError:
                continue
            resource_tracker.unregister("/" + name, "shared_memory")
            removed.append(name)
    return removed
