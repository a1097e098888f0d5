"""``process``: the target lives in a child process, started from a preloaded forkserver.

The child builds the target from the factory (an error while building surfaces at `ProcessHost.start`
with the child's traceback text), runs its serving loop on its main thread and control calls on a control
thread, fed by a pipe whose end-of-file also tells the child that its parent died (it then exits too). A
watcher thread in the parent notices the child's death at once and calls ``on_death``. ``stop`` asks, then
terminates, then kills, all within one deadline; shared-memory segments a killed child could not unlink are
removed. Children ignore Ctrl-C, SIGTERM and a batch system's warning signals: the driver decides when they stop
(and flush).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import tempfile
import threading
import time
from multiprocessing.connection import wait
from typing import Any, Mapping

from transports.peers import pid_runs
from transports.kernel.errors import ConfigurationError, PeerFailureError, ServiceTimeoutError
from transports.kernel.placements import Placement, Reach, register
from transports.segment_dir import segment_dir

from .base import DEFAULT_STOP_TIMEOUT, Host, Pending, exit_description
from .child import child_main, receive, send
from .signals import warning_signals_blocked

PRELOAD = ["transports", "torch", "tensordict", "components.hosts.process", "components.inference.target", "components.replay.storage",
           "components.commands"]
"""Imported once by the forkserver, so a child starts in tens of milliseconds instead of seconds (``transports`` first:
its import makes tensordict's lighter, see `transports._startup`)."""

_preloaded = False


def context():
    """The multiprocessing context children start from: a ``forkserver`` that imported torch, tensordict and our
    services once, so children are forked from a clean, single-threaded server, never from a driver that runs
    threads."""
    global _preloaded
    ctx = mp.get_context("forkserver")
    if not _preloaded:
        ctx.set_forkserver_preload(PRELOAD)
        _preloaded = True
    return ctx


def warm_up() -> None:
    """Start the forkserver now (it imports torch while the caller does other work); the first child then
    starts at once."""
    context()
    from multiprocessing import forkserver

    with warning_signals_blocked():  # a batch system's warning signal to the whole job must not end them
        try:
            forkserver.ensure_running()
        except OSError as exc:
            if "path too long" not in str(exc):
                raise
            # the forkserver listens on a Unix socket in a directory it makes under TMPDIR, and a socket's path holds
            # 107 bytes at most
            raise ConfigurationError(
                f"the process placement's forkserver cannot listen in a directory under {tempfile.gettempdir()!r}: a "
                f"Unix socket's path holds 107 bytes and this one would pass that; set TMPDIR to a shorter directory "
                f"(e.g. TMPDIR=/tmp)", path="TMPDIR") from exc


class _Reply(Pending):
    """The answer to one control call."""

    __slots__ = ("host", "method")

    def __init__(self, host: "ProcessHost", method: str):
        self.host, self.method = host, method

    def ready(self, timeout: float) -> bool:
        conn = self.host._conn
        return conn is None or conn.poll(timeout) or not self.host._peer_alive()

    def result(self, timeout: float | None = None) -> Any:
        host, conn = self.host, self.host._conn
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                step = 0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))
                if conn.poll(step):
                    kind, value = receive(conn)
                    break
                if not host._peer_alive():
                    raise PeerFailureError(f"{host._lost()} during {self.method!r}")
                if deadline is not None and time.monotonic() >= deadline:
                    raise ServiceTimeoutError(f"{host.name}: {self.method!r} not answered within {timeout} s")
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise PeerFailureError(f"{host._lost()} during {self.method!r}") from exc
        finally:
            host._busy.release()
        if kind == "error":
            raise value
        return value


class ProcessHost(Host):
    """Builds and serves the target in a child process."""

    placement = "process"
    process_memory_gb = 0.35  # measured: 0.24-0.31 GB RSS per CartPole owner forked from the preloaded forkserver
    shares_memory = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._process = None
        self._conn = None
        self._stopping = False
        self._busy = threading.Lock()  # one control call in flight: the pipe carries one answer at a time
        # multiprocessing's Popen.poll is not thread-safe: two threads reading a forkserver child's status at once (the
        # watcher and a caller describing the death) leave one of them an exit code of 255
        self._poll_lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self._wake_r = self._wake_w = None

    @classmethod
    def prepare(cls) -> None:
        """Start the forkserver now, so its one import of torch overlaps whatever the run does before the first
        child starts (planning, the driver's own imports)."""
        warm_up()

    @classmethod
    def session_memory_gb(cls, settings: Mapping[str, Any]) -> float:
        return 0.35  # the forkserver that imported torch (measured: 0.31 GB RSS) and its resource tracker

    def _launch(self) -> None:
        ctx = context()
        parent_conn, child_conn = ctx.Pipe()
        self._process = ctx.Process(target=child_main, args=(self.factory, child_conn), name=self.name, daemon=True,
                                    kwargs={"segments": segment_dir()})
        self._process.start()
        child_conn.close()
        self._conn = parent_conn

    def wait_ready(self) -> None:
        timeout = self.resources.startup_timeout
        deadline = time.monotonic() + timeout
        conn, process = self._conn, self._process
        while True:
            ready = wait([conn, process.sentinel], timeout=max(0.0, deadline - time.monotonic()))
            if conn in ready:
                try:
                    kind, value = receive(conn)
                except (EOFError, OSError):
                    kind, value = "died", None
                break
            if process.sentinel in ready:
                kind, value = "died", None
                break
            if time.monotonic() >= deadline:
                kind, value = "timeout", None
                break
        if kind == "ready":
            self._start_watcher()
            return
        self._force_stop(1.0)
        if kind == "error":
            raise value
        if kind == "timeout":
            raise ServiceTimeoutError(f"{self.name}: not ready within {timeout} s")
        raise PeerFailureError(f"{self.name}: the process died during startup "
                               f"({exit_description(self._exitcode(process))})")

    def _watch(self) -> None:
        ready = wait([self._process.sentinel, self._wake_r])
        while self._process.sentinel in ready and not self._stopping and self._runs():
            ready = wait([self._wake_r], timeout=0.2)  # the forkserver ended, the child runs: watch its pid
            ready = [] if ready else [self._process.sentinel]
        if self._process.sentinel in ready and not self._stopping:
            self._died(self._lost())

    def _start_watcher(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        self._watcher = threading.Thread(target=self._watch, name=f"{self.name}-watcher", daemon=True)
        self._watcher.start()

    def _stop_watcher(self) -> None:
        if self._wake_w is not None:
            os.write(self._wake_w, b"x")
            self._watcher.join(timeout=5)
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = None

    def _peer_alive(self) -> bool:
        """Whether the process the target lives in still runs (checked while a control call waits)."""
        return self._runs()

    def _runs(self) -> bool:
        """Whether the child process runs. Its sentinel says so while the forkserver that started it lives; a signal
        to the whole process group (a terminal's Ctrl-C, a batch system's SIGTERM) may end the forkserver first,
        which closes every child's sentinel at once: the child's pid decides then (a zombie has ended)."""
        process = self._process
        if process is None:
            return False
        return self._exitcode(process) is None or pid_runs(process.pid)

    def _lost(self) -> str:
        """How the target's process ended, in words (the start of a peer-failure message)."""
        return f"the {self.name} process died ({exit_description(self._exitcode())})"

    def _exitcode(self, process=None) -> int | None:
        """The child's exit code (``None`` while it runs, or when there is none), read by one thread at a time."""
        process = process or self._process
        if process is None:
            return None
        with self._poll_lock:
            return process.exitcode

    # ------------------------------------------------------------------ calls
    def submit(self, method: str, *args: Any) -> Pending:
        if not self.is_alive:
            raise PeerFailureError(self.death or f"{self.name} is not running")
        self._busy.acquire()
        try:
            send(self._conn, (method, args))
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            self._busy.release()
            raise PeerFailureError(f"the {self.name} process died before {method!r}") from exc
        return _Reply(self, method)

    # ------------------------------------------------------------------ stop
    def begin_shutdown(self) -> None:
        if self._process is None or self._stopping:
            return
        self._stopping = True
        if self._runs() and self._conn is not None:  # no connection yet: the start itself failed (pickling)
            try:
                send(self._conn, ("stop", None))
            except (OSError, ValueError):
                pass

    def shutdown(self, timeout: float | None = None) -> None:
        if self._process is None:
            return
        timeout = DEFAULT_STOP_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self.begin_shutdown()
        self._wait_ended(max(0.0, 0.6 * (deadline - time.monotonic())))
        self._force_stop(max(0.1, deadline - time.monotonic()))
        self._stop_watcher()
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        from transports.segments import remove_segments_of  # torch: imported once a child ran, never to warm up

        remove_segments_of(self._process.pid)  # what a killed child could not unlink itself
        self._process.close()
        self._process = None

    def _force_stop(self, budget: float) -> None:
        self._stopping = True
        for signum, wait_s in ((signal.SIGTERM, budget / 2), (signal.SIGKILL, budget / 2 + 1.0)):
            if not self._runs():
                return
            try:  # by pid: the Popen object may believe the child ended when only its forkserver did
                os.kill(self._process.pid, signum)
            except ProcessLookupError:
                return
            self._wait_ended(wait_s)

    def _wait_ended(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._runs() and time.monotonic() < deadline:
            with self._poll_lock:
                self._process.join(0.02)
            if self._exitcode() is not None:  # its sentinel is closed: join returns at once, so pace the checks
                time.sleep(0.02)

    @staticmethod
    def make_queue(maxsize: int):
        """A bounded queue its targets can put into and the owner can read (it travels to children by
        inheritance, inside the target's factory)."""
        return context().Queue(maxsize=maxsize)

    # ------------------------------------------------------------------ introspection
    @property
    def is_alive(self) -> bool:
        return self._process is not None and self._runs() and self.death is None and not self._stopping

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid


PLACEMENT = register(Placement("process", ProcessHost, Reach.MACHINE, aliases=("multiprocessing",),
                                summary="a process of its own on this machine"))
