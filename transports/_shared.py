"""Mechanics the process transports share: the peer-status block that tells clients whether their server is
alive, endpoint claims (one process per channel), polling before blocking, and the waiting loop that turns
"no answer yet" into a result, a peer failure or a timeout. Segments and slot banks live in
`transports.segments`.
"""

from __future__ import annotations

import os
import time
from typing import Callable

import numpy as np

from .kernel.errors import PeerFailureError, ServiceTimeoutError, TransportError
from .segments import Segment, pid_alive

WAIT_SLICE = 0.1
"""Seconds a waiting client blocks before it re-checks that its peer is alive."""


class PeerStatus:
    """A tiny shared block: is the server alive, and which pid serves. Written by the owner side.

    Clients check it while they wait, so a dead server turns into `PeerFailureError` quickly even
    when nothing else wakes them.
    """

    ALIVE, PID, STOPPED = 0, 1, 2

    def __init__(self, segment: Segment | None = None, name: str = "service"):
        self.segment = segment or Segment(3 * 8)
        self.name = name  # the component serving, named in every problem
        self._view = np.frombuffer(self.segment.buf, dtype=np.int64, count=3)

    def __reduce__(self):
        return (PeerStatus, (self.segment, self.name))

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
            return f"the {self.name} server was shut down"
        if self._view[self.ALIVE] == 1:
            if not probe:
                return None
            pid = int(self._view[self.PID])
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return f"the {self.name} server process (pid {pid}) died"
            except PermissionError:
                pass
            return None
        if self._view[self.STOPPED]:
            return f"the {self.name} server was shut down"
        return f"the {self.name} server is not running (it died or has not started)"

    def close(self) -> None:
        self._view = None
        self.segment.close()


_pid = os.getpid()  # this process's pid, kept by a fork hook: os.getpid is a system call, a per-request cost


def current_pid() -> int:
    """This process's pid, read from memory (a child's since the fork)."""
    return _pid


def _forked() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_forked)


class EndpointClaims:
    """Which process uses each client endpoint of a transport: an endpoint answers one process.

    A client pickled into two processes would share one reply channel, and each copy could read the other's
    answers. The first process that uses endpoint ``i`` claims it; a copy in another live process is refused
    at its call site with `TransportError` instead of waiting forever. A claim by a
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


SPIN_S = 50e-6
"""Seconds a waiter polls before it blocks, at least: a blocked process can take tens of microseconds to be woken
on a small VM, more than a whole small round trip. Servers spin when idle; a slot client only while its request is
the only one in flight (many spinning clients would take the cores the server needs). `AdaptiveSpin` polls
longer where a waiter's own recent waits say the answer comes within `SPIN_MAX_S`."""
YIELD_EVERY = 8
"""Spin turns between two yields of the core: a peer that shares it runs within a few microseconds instead of after
our time slice, while a yield every turn would add its system call to every wake-up, a share of a small round trip
worth keeping (see the inference benchmark's page)."""


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


SPIN_MAX_S = 1e-3
"""The longest an `AdaptiveSpin` polls: a waiter whose answers come sooner (a collector worker asking its
server, a server between one worker's steps) catches them without a wake-up."""


class AdaptiveSpin:
    """One waiter's polling budget, learned from its own recent waits.

    It polls up to twice its typical wait, between `SPIN_S` and `SPIN_MAX_S`; a waiter whose waits
    are longer than that (a server idle while the learner trains) polls only `SPIN_S` before it blocks, so it
    does not burn a core for nothing. The typical wait is a running mean over about the last eight waits, each
    counted up to twice the cap (one long pause among short waits barely moves it).

    Per waiter (a client, a server), in its own process: not shared, not pickled.
    """

    __slots__ = ("typical",)

    def __init__(self):
        self.typical = SPIN_S

    def budget(self) -> float:
        """Seconds to poll now."""
        return SPIN_S if self.typical > SPIN_MAX_S else min(SPIN_MAX_S, max(SPIN_S, 2.0 * self.typical))

    def wait(self, ready: Callable[[], bool], block: Callable[[], bool]) -> bool:
        """Poll ``ready()`` for `budget` seconds, then ``block()`` (which waits on its own terms); whether
        either succeeded. The time it took (or, when neither did, the longest counted) updates the typical wait."""
        start = time.perf_counter()
        done = ready() or spin(ready, self.budget()) or block()
        waited = time.perf_counter() - start if done else 2.0 * SPIN_MAX_S
        self.typical += (min(waited, 2.0 * SPIN_MAX_S) - self.typical) * 0.125
        return done


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
        """As `spin` for endpoint ``index``, unless another endpoint polls now (False at once)."""
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
    succeeds; raise `PeerFailureError` if the peer dies first, `ServiceTimeoutError` after
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


