"""Pieces shared by the in-process transports (``thread``, ``direct``): a process-local registry so their
clients survive pickling inside the owner's process, a status flag, and the future a thread of this process
answers (also used by the ``distributed`` clients' receiving threads)."""

from __future__ import annotations

import _thread
import itertools
import logging
import os
import threading
import weakref

from .base import ResponseFuture
from .kernel.errors import PeerFailureError, ServiceTimeoutError

_REGISTRY: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
_tokens = itertools.count(1)


def register(transport) -> tuple[int, int]:
    """Register an in-process transport; returns the (pid, token) its clients pickle as."""
    token = next(_tokens)
    _REGISTRY[token] = transport
    return os.getpid(), token


def lookup(pid: int, token: int, kind: str):
    """The transport a client was pickled from; raises if it is gone or in another process."""
    transport = _REGISTRY.get(token) if pid == os.getpid() else None
    if transport is None:
        raise PeerFailureError(
            f"a {kind!r} transport client works only inside the process of its owner (pid {pid}) while the owner "
            "runs; use a process transport (queue, shared_memory, process_slot) to reach it from elsewhere"
        )
    return transport


class LocalStatus:
    """Whether the in-process server accepts requests, and why not."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reason: str | None = "the server has not started"

    def problem(self) -> str | None:
        """Why the server does not accept requests, or ``None`` while it does."""
        return self.reason


class LocalFuture(ResponseFuture):
    """The answer to one request, set by a serving or receiving thread of this process: one lock, held until the
    answer is set (no condition variable to build or notify). The first answer set wins; ``result(timeout)``
    raises our timeout type."""

    __slots__ = ("_lock", "_done", "_value", "_error", "_callbacks")

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._done = False
        self._value = self._error = self._callbacks = None

    def _set(self, value, error: BaseException | None) -> None:
        if self._done:
            return
        self._value, self._error, self._done = value, error, True
        self._lock.release()
        if self._callbacks:
            self._run_callback()

    def add_done_callback(self, fn) -> None:
        """Call ``fn(self)`` once the answer is set (at once when it is), in the thread that sets it. One callback per
        future (a second replaces the first); its errors are logged, never raised into the setter."""
        self._callbacks = [fn]
        if self._done:
            self._run_callback()

    def _run_callback(self) -> None:
        try:
            fn = self._callbacks.pop()  # atomic: the setter and add_done_callback may both get here, one runs it
        except IndexError:
            return
        try:
            fn(self)
        except Exception:  # noqa: BLE001 - the setter (a serving loop) goes on
            logging.getLogger(__name__).exception("a future's done callback failed")

    def set_result(self, value) -> None:
        """Answer with ``value``, unless an answer was already set."""
        self._set(value, None)

    def set_exception(self, error: BaseException) -> None:
        """Answer with ``error`` (raised by `result`), unless an answer was already set."""
        self._set(None, error)

    def done(self) -> bool:
        return self._done

    def result(self, timeout: float | None = None):
        if not self._done:
            if not self._lock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
                raise ServiceTimeoutError(f"no answer within {timeout} s (the server is alive)")
            self._lock.release()  # later calls (and other waiters) return at once
        if self._error is not None:
            raise self._error
        return self._value
