"""How a run ends when it does not finish: which service died, and the signals that stop a run. The exit statuses
are in `launcher.conventions`.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from typing import Any, Callable, Mapping

from transports.kernel.secret import is_loopback
from transports.kernel.errors import (NO_SPACE, PeerFailureError, RemoteError, ServiceError, ServiceTimeoutError,
                               SharedMemoryFull, qualified_name)

SETTLE_S = 2.0
"""Seconds to wait, after a client saw its peer fail, for the host watching that peer to record why."""
_SHARED_MEMORY_FULL = qualified_name(SharedMemoryFull)


class ServiceDied(ServiceError):
    """A service's owner died during the run (a killed process, a lost actor, a crashed thread).

    Attributes:
        component: the component (``replay``, ``inference``...).
        placement: where it was placed.
        pid: the process it lived in, where known.
        node: the address of the machine it ran on, where that may be another one (named unless loopback).
        cause: why, as its host recorded it (``the replay process died (killed by SIGKILL)``).
    """

    def __init__(self, component: str, placement: str, pid: int | None, cause: str, node: str | None = None):
        self.component, self.placement, self.pid, self.cause = component, placement, pid, cause
        where = placement if pid is None else f"{placement}, pid {pid}"
        if node and not is_loopback(node):  # another machine: name it (a pid alone points at the wrong one)
            where += f" on {node}"
        super().__init__(f"{component} ({where}) died: {cause}")


class ServiceFailedToStart(ServiceDied):
    """A service's owner did not come up: building it raised where it runs, its process or job ended first, or it
    was not ready in time (``cause`` says which)."""

    def __init__(self, component: str, placement: str, cause: str):
        ServiceError.__init__(self, f"{component} ({placement}) failed to start: {cause}")
        self.component, self.placement, self.pid, self.cause = component, placement, None, cause


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread so the run unwinds (and shuts down) as on Ctrl-C."""

    signal_name = "SIGTERM"


def handle_sigterm() -> None:
    """Turn SIGTERM into `Terminated` in the main thread (call it there)."""

    def raise_terminated(signum, frame):
        raise Terminated()

    signal.signal(signal.SIGTERM, raise_terminated)


class ShutdownShield:
    """While a run's services shut down, a further Ctrl-C or SIGTERM does not cut the shutdown short (which would
    leave what the interrupted step was to remove, for the resource tracker to warn about): it is noted, answered
    with one line, and the shutdown goes on; each owner still stops within ``launcher.shutdown_timeout``. SIGKILL
    remains the way to stop at once. Only the main thread can hold signal handlers: elsewhere this does nothing.

    Args:
        timeout: seconds each owner gets to stop (for the line it prints).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.received: list[str] = []
        self._saved: dict[int, Any] = {}

    def raise_shield(self) -> None:
        """From now on the shutdown runs to its end (call it as the shutdown begins)."""
        if self._saved or threading.current_thread() is not threading.main_thread():
            return
        for sig in self.SIGNALS:
            self._saved[sig] = signal.signal(sig, self._note)

    def lower_shield(self) -> None:
        """The handlers the run had before (safe to call more than once, or without `raise_shield`)."""
        saved, self._saved = self._saved, {}
        for sig, handler in saved.items():
            signal.signal(sig, handler)

    def _note(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        if len(self.received) == 1:  # os.write: the main thread may be inside a print when the signal lands
            os.write(2, (f"{name} while the services shut down: each stops within {self.timeout:g} s "
                         f"(launcher.shutdown_timeout); kill -9 {os.getpid()} stops at once\n").encode())


def ending() -> None:
    """The run has ended and says how: a SIGTERM from now on (torchrun ending the other ranks, a batch system) only
    ends the process, which is exiting with its own status already, instead of unwinding its interpreter's shutdown."""
    signal.signal(signal.SIGTERM, lambda signum, frame: None)


def no_space(error: BaseException | None) -> str | None:
    """What a run could not write for want of space, where ``error`` (or an error it came from, here or in a
    service's owner) is a full disk or quota: ``"No space left on device: /path"`` (the path where known), or shared
    memory that ran out (`SharedMemoryFull`: ``"ran out of shared memory in /dev/shm
    ..."``); else ``None``."""
    def said(e: BaseException) -> str | None:
        if isinstance(e, OSError) and e.errno in NO_SPACE:
            return e.strerror + (f": {e.filename}" if e.filename else "")
        if isinstance(e, RemoteError) and e.remote_type == _SHARED_MEMORY_FULL:  # its message says it all
            return e.remote_message
        if isinstance(e, RemoteError) and e.remote_type in ("OSError", "PermissionError"):
            told = re.match(r"\[Errno (\d+)\] ([^:]+)(?:: '(.*)')?$", e.remote_message.strip())
            if told and int(told[1]) in NO_SPACE:
                return told[2] + (f": {told[3]}" if told[3] else "")
        return None

    full = in_chain(error, lambda e: said(e) is not None)
    return None if full is None else said(full)


def cause_of(error: BaseException) -> str:
    """Why an owner did not come up, in one line: our own transport errors (a peer that died, a start that timed out)
    as they say it, anything else as its type and message, a remote error's as raised where the owner was built (``numpy
    ..._ArrayMemoryError: Unable to allocate 256. GiB ...``); a traceback stays in ``launcher.log``."""
    if isinstance(error, (PeerFailureError, ServiceTimeoutError)):
        return str(error)
    if isinstance(error, RemoteError):
        kind, message = error.remote_type, error.remote_message
    else:
        kind, message = qualified_name(type(error)), str(error)
    return f"{kind}: {' '.join(message.split())}" if message.strip() else kind


def dead_service(owners: Mapping[str, Any], error: BaseException) -> ServiceDied | None:
    """The service whose death explains ``error``, if one died: checked at once, and for a peer failure a little
    longer (the client may notice before the host's watcher records the cause)."""
    deadline = time.monotonic() + (SETTLE_S if _peer_failure(error) else 0.0)
    while True:
        for name, owner in owners.items():
            for host in owner.all_hosts():
                if host.death is not None:
                    return ServiceDied(name, owner.placement, host.pid, host.death, host.node_address)
        if time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    for name, owner in owners.items():  # a host that records no cause (a Ray actor) but is gone
        for host in owner.all_hosts():
            if not host.is_alive:
                return ServiceDied(name, owner.placement, host.pid, f"its {owner.placement} host {host.name} is "
                                   "no longer alive", host.node_address)
    return None


def _peer_failure(error: BaseException | None) -> bool:
    return in_chain(error, lambda e: isinstance(e, PeerFailureError)) is not None


def in_chain(error: BaseException | None, wanted: Callable[[BaseException], bool]) -> BaseException | None:
    """The first of ``error`` and the errors it came from (``__cause__``, else ``__context__``) that is ``wanted``."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if wanted(error):
            return error
        error = error.__cause__ or error.__context__
    return None
