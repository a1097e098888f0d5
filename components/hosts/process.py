"""Owners that live in a child process: start with a ready handshake, watch liveness, stop within a deadline.

``ChildProcess`` spawns ``main(*args)`` in a fresh interpreter. ``main`` builds the service there (an error
while building surfaces at :meth:`ChildProcess.start` with the child's traceback text) and returns an object
with ``run(stop_event)``, ``handle(command, payload)`` and ``close()``. A control pipe carries commands
(acknowledged, errors as :class:`~transports.errors.RemoteError`); its end-of-file tells the child that its
parent died, so it exits too. A watcher thread in the parent notices the child's death at once and calls
``on_death``. ``stop`` asks politely, then terminates, then kills, all within one deadline.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from multiprocessing.connection import wait
from typing import Any, Callable

from transports.errors import PeerFailureError, RemoteError, ServiceTimeoutError


PRELOAD = ["torch", "tensordict", "components.hosting", "components.inference.server", "components.replay"]
_preloaded = False


def context(method: str | None = None):
    """The multiprocessing context owners start children with.

    The default is ``forkserver`` with torch, tensordict and our services imported once in the server, so a
    child starts in tens of milliseconds instead of re-importing torch (seconds); children are forked from
    that clean, single-threaded server, never from a driver that runs threads.
    """
    global _preloaded
    method = method or "forkserver"
    ctx = mp.get_context(method)
    if method == "forkserver" and not _preloaded:
        ctx.set_forkserver_preload(PRELOAD)
        _preloaded = True
    return ctx


class ChildProcess:
    """A service process owned by this process.

    Args:
        name: the process name (shown by ``ps``).
        main: picklable callable building the service in the child (see the module docstring).
        args: arguments of ``main`` (travel by multiprocessing inheritance: queues and semaphores are fine).
        context: multiprocessing start method (default: see :func:`context`).
        startup_timeout: seconds the child may take to become ready.
        on_death: called (from the watcher thread) when the child dies without being asked to stop.
    """

    def __init__(
        self,
        name: str,
        main: Callable[..., Any],
        args: tuple = (),
        *,
        context: str | None = None,
        startup_timeout: float = 60.0,
        on_death: Callable[[str], None] | None = None,
    ):
        self.name, self.main, self.args = name, main, args
        self.ctx = globals()["context"](context)
        self.startup_timeout = startup_timeout
        self.on_death = on_death
        self.process = None
        self._conn = None
        self._lock = threading.Lock()
        self._stopping = False
        self._watcher: threading.Thread | None = None
        self._wake_r, self._wake_w = None, None
        self.death: str | None = None

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> int:
        """Spawn the child and return its pid once the service inside is ready.

        Raises:
            RemoteError: building the service in the child raised (carries the child's traceback text).
            PeerFailureError: the child died during startup.
            ServiceTimeoutError: the child was not ready within ``startup_timeout``.
        """
        parent_conn, child_conn = self.ctx.Pipe()
        self.process = self.ctx.Process(
            target=_child_entry, args=(self.main, child_conn, self.args), name=self.name, daemon=True
        )
        self.process.start()
        child_conn.close()
        self._conn = parent_conn
        deadline = time.monotonic() + self.startup_timeout
        while True:
            ready = wait([parent_conn, self.process.sentinel], timeout=max(0.0, deadline - time.monotonic()))
            if parent_conn in ready:
                try:
                    kind, value = parent_conn.recv()
                except (EOFError, OSError):
                    kind, value = "died", None
                break
            if self.process.sentinel in ready:
                kind, value = "died", None
                break
            if time.monotonic() >= deadline:
                kind, value = "timeout", None
                break
        if kind == "ready":
            self._wake_r, self._wake_w = os.pipe()
            self._watcher = threading.Thread(target=self._watch, name=f"{self.name}-watcher", daemon=True)
            self._watcher.start()
            return int(value)
        self._force_stop(1.0)
        if kind == "error":
            raise value
        if kind == "timeout":
            raise ServiceTimeoutError(f"{self.name}: not ready within {self.startup_timeout} s")
        raise PeerFailureError(f"{self.name}: the process died during startup (exit code {self.process.exitcode})")

    def _watch(self) -> None:
        ready = wait([self.process.sentinel, self._wake_r])
        if self.process.sentinel in ready and not self._stopping:
            code = self.process.exitcode
            self.death = f"the {self.name} process died (exit code {code})"
            if self.on_death is not None:
                self.on_death(self.death)

    @property
    def is_alive(self) -> bool:
        return self.process is not None and self.process.is_alive() and self.death is None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def submit(self, command: str, payload: Any = None) -> "Reply":
        """Send ``command`` to the child's service without waiting; read the answer from the returned reply.
        One command may be outstanding per child (use :meth:`call` from several threads instead)."""
        if not self.is_alive:
            raise PeerFailureError(self.death or f"the {self.name} process is not running")
        try:
            self._conn.send((command, payload))
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise PeerFailureError(f"the {self.name} process died before {command!r}") from exc
        return Reply(self, command)

    def call(self, command: str, payload: Any = None, timeout: float | None = 60.0) -> Any:
        """Run ``command`` in the child's service; return its result or raise its error here.

        Raises:
            PeerFailureError: the child is dead (or dies before answering).
            ServiceTimeoutError: no answer within ``timeout``.
        """
        with self._lock:
            return self.submit(command, payload).result(timeout)

    def request_stop(self) -> None:
        """Ask the child to stop without waiting (:meth:`stop` then waits); lets several children wind down
        at once."""
        if self.process is None or self._stopping:
            return
        self._stopping = True
        if self.process.is_alive():
            try:
                self._conn.send(("stop", None))
            except (OSError, ValueError):
                pass

    def stop(self, timeout: float | None = None) -> None:
        """Ask the child to stop; terminate, then kill if it does not exit in time. Idempotent."""
        if self.process is None:
            return
        timeout = 10.0 if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self.request_stop()
        if self.process.is_alive():
            self.process.join(max(0.0, 0.6 * (deadline - time.monotonic())))
        self._force_stop(max(0.1, deadline - time.monotonic()))
        if self._wake_w is not None:
            os.write(self._wake_w, b"x")
            self._watcher.join(timeout=5)
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        from transports._shared import remove_segments_of

        remove_segments_of(self.process.pid)  # what a killed child could not unlink itself
        self.process.close()
        self.process = None

    def _force_stop(self, budget: float) -> None:
        self._stopping = True
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(budget / 2)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(budget / 2 + 1.0)


def stop_all(children, timeout: float | None = None) -> None:
    """Stop several children within one deadline: all are asked first, then each is waited for."""
    timeout = 10.0 if timeout is None else timeout
    deadline = time.monotonic() + timeout
    for child in children:
        child.request_stop()
    for child in children:
        child.stop(max(0.1, deadline - time.monotonic()))


class Reply:
    """The answer to one :meth:`ChildProcess.submit`."""

    def __init__(self, child: ChildProcess, command: str):
        self.child, self.command = child, command

    def ready(self, timeout: float) -> bool:
        """Whether the answer arrived (or the child died) within ``timeout`` seconds."""
        conn = self.child._conn
        return conn is None or conn.poll(timeout) or not self.child.process.is_alive()

    def result(self, timeout: float | None = None) -> Any:
        child, conn = self.child, self.child._conn
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                step = 0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))
                if conn.poll(step):
                    kind, value = conn.recv()
                    break
                if not child.process.is_alive():
                    raise PeerFailureError(
                        f"the {child.name} process died during {self.command!r} (exit code {child.process.exitcode})"
                    )
                if deadline is not None and time.monotonic() >= deadline:
                    raise ServiceTimeoutError(f"{child.name}: {self.command!r} not answered within {timeout} s")
        except (EOFError, BrokenPipeError, ConnectionResetError) as exc:
            raise PeerFailureError(f"the {child.name} process died during {self.command!r}") from exc
        if kind == "error":
            raise value
        return value


def _child_entry(main: Callable[..., Any], conn, args: tuple) -> None:
    # Ctrl-C reaches the whole process group; the parent decides when its services stop (and flush).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        served = main(*args)
    except BaseException as exc:  # the parent raises it at start()
        try:
            conn.send(("error", RemoteError.from_exception(exc)))
        finally:
            conn.close()
        return
    stop = threading.Event()

    def control() -> None:
        while not stop.is_set():
            try:
                command, payload = conn.recv()
            except (EOFError, OSError):  # the parent died or closed: stop serving
                stop.set()
                return
            if command == "stop":
                stop.set()
                return
            try:
                reply = ("ok", served.handle(command, payload))
            except BaseException as exc:  # noqa: BLE001 - every error goes back to the caller
                reply = ("error", RemoteError.from_exception(exc))
            try:
                conn.send(reply)
            except (OSError, ValueError):
                stop.set()
                return

    conn.send(("ready", os.getpid()))
    thread = threading.Thread(target=control, name="control", daemon=True)
    thread.start()
    try:
        served.run(stop)
    except BaseException:
        traceback.print_exc()
        raise
    finally:
        stop.set()
        served.close()
