"""The child side of a host that runs its target in a process of its own: what such a process runs (build the
target, answer the ready handshake, serve control calls until told to stop), and the messages of the control pipe
between it and its host. `ProcessHost` starts it as a child process; the
``distributed`` ranks and ``submitit`` jobs run it once they have connected back to their host."""

from __future__ import annotations

import logging
import os
import pickle
import select
import signal
import socket
import sys
import threading
import traceback
from typing import Any

from transports.kernel.errors import RemoteError
from transports.segment_dir import VARIABLE as SEGMENT_DIR_VARIABLE

from .base import close_target, run_serving_loop
from .signals import WARNING_SIGNALS


ORPHAN_CLOSE_S = 15.0
"""Seconds a child whose parent is gone has to close its target before it leaves anyway."""
EXIT_ORPHANED = 70
"""The exit status of a child that lost its parent and left: closing its target outlasted `ORPHAN_CLOSE_S`,
or it is a rank or job (whose own launcher, torchrun or Slurm, then records a failure)."""


def watched(conn, stop: threading.Event) -> bool:
    """Wait until the connection ``conn`` ends (``True``: closed, reset, or timed out by keep-alive) or ``stop`` is
    set (``False``), without reading what it carries."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        while not stop.is_set():
            readable, _, _ = select.select([sock], [], [], 1.0)
            if not readable:
                continue
            try:
                if not sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                    return True
            except BlockingIOError:
                continue
            except OSError:
                return True
            stop.wait(0.05)  # a message the control thread has not read yet
        return False
    finally:
        sock.close()


def send(conn, message: Any) -> None:
    """Send ``message`` on a control pipe, pickled."""
    # plain pickle: tensors travel as bytes (multiprocessing's own pickler would move each tensor's storage into
    # a shared-memory file and pass descriptors, far slower for rollouts and answers)
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def receive(conn) -> Any:
    """The next message on a control pipe."""
    return pickle.loads(conn.recv_bytes())


def child_main(factory, conn, *, own_signals: bool = True, segments: str | None = None) -> bool:
    """Build the target, answer the ready handshake on ``conn``, serve control calls from it until told to stop (or
    until it closes), then close the target.

    Args:
        factory: builds the target (picklable: it travelled here).
        conn: the control pipe to the host that started this process (or connected to it).
        own_signals: ignore the signals the parent decides on (a child of ours); ``False`` where this process is a
            job or rank of its own, whose signals its launcher sends.
        segments: the parent's segment directory, made this process's own (a child of the forkserver inherits the
            environment the forkserver started with, not the parent's now).

    Returns:
        Whether the target was built (its error went to the parent otherwise).
    """
    if segments is not None:
        os.environ[SEGMENT_DIR_VARIABLE] = segments
    # Ctrl-C (and a SIGTERM or warning signal sent to the job) reaches the whole process group; the parent decides
    # when its services stop and flush, and a child whose parent is gone stops by itself (its control pipe closes).
    if own_signals:
        for signum in (signal.SIGINT, signal.SIGTERM, *WARNING_SIGNALS):
            signal.signal(signum, signal.SIG_IGN)
    import torch

    torch.set_num_threads(1)
    try:
        target = factory()
    except BaseException as exc:  # the parent raises it at start()
        try:
            send(conn, ("error", RemoteError.from_exception(exc)))
        finally:
            conn.close()
        return False
    stop = threading.Event()

    def control() -> None:
        while not stop.is_set():
            try:
                method, args = receive(conn)
            except (EOFError, OSError):  # the parent died or closed (or, on another host, fell silent): stop serving
                orphaned()
                stop.set()
                return
            if method == "stop":
                stop.set()
                return
            try:
                reply = ("ok", getattr(target, method)(*args))
            except BaseException as exc:  # noqa: BLE001 - every error goes back to the caller
                reply = ("error", RemoteError.from_exception(exc))
            try:
                try:
                    send(conn, reply)
                except (pickle.PicklingError, TypeError, AttributeError) as exc:  # an answer that cannot travel
                    send(conn, ("error", RemoteError.from_exception(exc)))
            except (OSError, ValueError):
                stop.set()
                return

    lost = threading.Event()

    def orphaned() -> None:
        # nobody waits for this process any more, and closing the target may wait on peers that are gone with the
        # parent (a link lost leaves their connections open, silent): it gets ORPHAN_CLOSE_S, then the process ends
        lost.set()
        timer = threading.Timer(ORPHAN_CLOSE_S, os._exit, (EXIT_ORPHANED,))
        timer.daemon = True
        timer.start()

    def watch() -> None:
        # the control thread may be inside a long call of the target when the connection ends: notice it here
        if watched(conn, stop):
            orphaned()
            stop.set()

    send(conn, ("ready", os.getpid()))
    thread = threading.Thread(target=control, name="control", daemon=True)
    thread.start()
    if not own_signals:  # a rank or job on another host: its connection to the driver may end in silence
        threading.Thread(target=watch, name="watch-driver", daemon=True).start()
    try:
        run_serving_loop(target, stop)
    except Exception:  # a signal turned into an exception (a rank torchrun ends) unwinds without a traceback
        traceback.print_exc()
        raise
    finally:
        stop.set()
        close_target(target)
    if lost.is_set() and not own_signals:  # a rank or job whose driver was lost: its launcher sees a failure
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(EXIT_ORPHANED)
    return True
