"""``thread``: the target is built on a thread of the owner's process and serves there.

The host thread builds the target (so a thread-affine SDK is built on the thread that uses it) and runs its
serving loop; control calls run on a second thread, one at a time, in order (an exception they raise comes back
as `RemoteError` with its traceback text; our own errors keep their type). If the
serving loop ends while nobody asked it to, ``on_death`` is called.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

from transports.kernel.errors import PeerFailureError, RemoteError, ServiceError, ServiceTimeoutError
from transports.kernel.placements import Placement, Reach, register

from .base import DEFAULT_STOP_TIMEOUT, Host, Pending, close_target, run_serving_loop


class _Answer(Pending):
    __slots__ = ("host", "event", "value", "error")

    def __init__(self, host: "ThreadHost"):
        self.host, self.event, self.value, self.error = host, threading.Event(), None, None

    def ready(self, timeout: float) -> bool:
        return self.event.wait(timeout) or not self.host.is_alive

    def result(self, timeout: float | None = None) -> Any:
        waited = 0.0
        while not self.event.wait(0.1):
            waited += 0.1
            if not self.host.is_alive and not self.event.is_set():
                raise PeerFailureError(self.host.death or f"{self.host.name} stopped")
            if timeout is not None and waited >= timeout:
                raise ServiceTimeoutError(f"{self.host.name}: no answer within {timeout} s (the thread is alive)")
        if self.error is not None:
            raise self.error
        return self.value


class ThreadHost(Host):
    """Builds and serves the target on a thread of this process."""

    placement = "thread"
    same_process = True
    command_transport = "thread"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.target: Any = None
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._control: threading.Thread | None = None

    def _launch(self) -> None:
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            self.target = self.factory()
        except BaseException as exc:  # noqa: BLE001 - raised at start()
            self._error = exc
            self._ready.set()
            return
        self._control = threading.Thread(target=self._control_loop, name=f"{self.name}-control", daemon=True)
        self._control.start()
        self._ready.set()
        try:
            run_serving_loop(self.target, self._stop)
        finally:
            if not self._stop.is_set():
                self._died(f"the {self.name} thread stopped on its own")
            self._calls.put(None)
            self._control.join()
            close_target(self.target)

    def _control_loop(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            method, args, answer = item
            try:
                answer.value = getattr(self.target, method)(*args)
            except ServiceError as exc:  # our own errors keep their type
                answer.error = exc
            except BaseException as exc:  # noqa: BLE001 - raised in the caller, with this thread's traceback text
                answer.error = RemoteError.from_exception(exc)
            answer.event.set()

    def wait_ready(self) -> None:
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    def submit(self, method: str, *args: Any) -> Pending:
        if not self.is_alive:
            raise PeerFailureError(self.death or f"{self.name} is not running")
        answer = _Answer(self)
        self._calls.put((method, args, answer))
        return answer

    def begin_shutdown(self) -> None:
        self._stop.set()

    def shutdown(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(DEFAULT_STOP_TIMEOUT if timeout is None else timeout)
            self._thread = None

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._ready.is_set() and self._error is None

    @property
    def pid(self) -> int:
        return os.getpid()

    @staticmethod
    def make_queue(maxsize: int):
        """A bounded queue its targets can put into and the owner can read."""
        return queue.Queue(maxsize=maxsize)


PLACEMENT = register(Placement("thread", ThreadHost, Reach.PROCESS, aliases=("threading",),
                                summary="a thread of the driver's process"))
