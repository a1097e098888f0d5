"""Pieces the benchmark scripts share: starting an owner (remembering its child's pid for the leak check)
and stopping a helper process politely, then firmly."""

from __future__ import annotations

import time
from typing import Any, Callable


def start_owner(owner: Any, pids: set) -> float:
    """Start ``owner``; add the pid of its child process (if it has one) to ``pids``; return seconds taken."""
    t0 = time.perf_counter()
    owner.start()
    if owner.host is not None and not owner.host.same_process:
        pids.add(owner.host.pid)
    return time.perf_counter() - t0


def stop_child(proc, stop: Callable[[], Any]) -> None:
    """Call ``stop`` (a message asking ``proc`` to exit), then join; terminate if it does not exit in time."""
    try:
        stop()
    except (OSError, ValueError):
        pass
    proc.join(10)
    if proc.is_alive():
        proc.terminate()
        proc.join(5)
