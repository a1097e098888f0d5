"""The pieces of the ``rpc`` placement that run in its workers (and the few the driver shares with them): joining
a world on the configured interface, running control calls in the order they were sent, leaving the world.
See `components.hosts.rpc`."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import threading
import warnings
from typing import Any, Iterator

LEAVE_S = 2.0
"""Seconds the ranks of a world wait for each other when it ends (everyone leaves together: no rank sees another's
connection drop). Where a rank died the others wait this long at most, then leave alone."""

# torch's rpc builds its own gloo group through an API it deprecated itself: nothing a user can act on
warnings.filterwarnings("ignore", message="You are using a Backend .* as a ProcessGroup", category=UserWarning)


@contextlib.contextmanager
def on_interface(name: str) -> Iterator[None]:
    """Point TensorPipe and gloo at interface ``name`` while an rpc agent is made in this process."""
    keys = ("TP_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
    before = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: name for k in keys})
    try:
        yield
    finally:
        for k, v in before.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def backend_options(init_method: str, threads: int, timeout: float):
    from torch.distributed import rpc

    return rpc.TensorPipeRpcBackendOptions(init_method=init_method, num_worker_threads=threads, rpc_timeout=timeout)


def leave_world(together: bool = True) -> None:
    """This rank leaves its rpc world; ``together``: with the others (every rank waits for the rest, at most
    `LEAVE_S`, then leaves alone)."""
    from torch.distributed import rpc

    quiet = logging.getLogger("torch.distributed.rpc.api")  # logs a failed barrier with a traceback: expected here
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        with _agent_reports_dropped():
            if together:
                try:
                    rpc.api._wait_all_workers(LEAVE_S)  # the barrier of torch's graceful shutdown, without its join
                    # (which hangs in a process that ran a world before)
                except Exception:  # noqa: BLE001 - a rank died or did not come: leave alone
                    pass
            rpc.shutdown(graceful=False)
    finally:
        quiet.setLevel(level)


_AGENT_REPORT = re.compile(r"tensorpipe_agent\.cpp:\d+\] RPC agent for .* (encountered error when|won't send response)")


@contextlib.contextmanager
def _agent_reports_dropped() -> Iterator[None]:
    """While a world ends, every agent reports each connection that closes (its own and its peers') as a warning on
    stderr. stderr goes to a file meanwhile; what else was written there is written back afterwards."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True)
                    if not _AGENT_REPORT.search(line.decode("utf-8", "replace"))]
            if kept:
                os.write(2, b"".join(kept))


class _Served:
    """The worker's target and the order its control calls run in."""

    target: Any = None
    next_call = 0
    turn = threading.Condition()


def as_rpc_worker(factory, name: str, rank: int, size: int, init_method: str, counter: int,
                   settings: Any, timeout: float) -> Any:
    """In the child: join the rpc world as ``name`` (rank ``rank``) with the run's ``settings``
    (`RpcSettings`), then build the target; its ``close`` leaves the world."""
    from torch.distributed import rpc

    rpc._init_counter = counter
    with on_interface(settings.interface):
        rpc.init_rpc(name, rank=rank, world_size=size,
                     rpc_backend_options=backend_options(init_method, settings.threads, timeout))
    try:
        _Served.target = factory()
    except BaseException:
        leave_world(together=False)
        raise
    return _Leaving(_Served.target)


class _Leaving:
    """The target as the child's serving loop sees it: ``close`` closes it, then leaves the rpc world."""

    def __init__(self, target: Any):
        self.target = target
        if hasattr(target, "serve"):
            self.serve = target.serve

    def close(self) -> None:
        from .base import close_target

        try:
            close_target(self.target)
        finally:
            leave_world()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


def run_call(number: int, method: str, args: tuple) -> tuple[str, Any]:
    """Run on the worker (an rpc thread): ``method(*args)`` on the target, in the order the driver sent the calls."""
    from transports.kernel.errors import RemoteError

    with _Served.turn:
        _Served.turn.wait_for(lambda: _Served.next_call == number)
        try:
            return "ok", getattr(_Served.target, method)(*args)
        except BaseException as exc:  # noqa: BLE001 - every error goes back to the caller
            return "error", RemoteError.from_exception(exc)
        finally:
            _Served.next_call += 1
            _Served.turn.notify_all()
