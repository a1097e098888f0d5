"""A batch system's warning signals: Slurm's ``--signal`` before the time limit, submitit's preemption signal,
``scancel --signal=USR2``. Slurm sends them to every process of the job step; the driver acts on them (it writes its
checkpoint, then stops its services, `launcher.requeue`), and to every other process they are fatal by default.
So service processes ignore them, and the helper processes a placement starts (a forkserver and its resource
tracker, a local Ray cluster's daemons and workers) start with them blocked.

A local Ray cluster's daemons and workers start with SIGTERM blocked too (`CLUSTER_SIGNALS`): a SIGTERM to the
whole process group (a terminal, ``kill -- -pgid``) or to every process of a Slurm job step would otherwise end the
control store and the raylet in the middle of the driver's orderly shutdown, and the actors with them.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator

WARNING_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)

CLUSTER_SIGNALS = (*WARNING_SIGNALS, signal.SIGTERM)
"""Blocked in a local Ray cluster's daemons and workers: only the driver that started them stops them."""


@contextlib.contextmanager
def signals_blocked(signals: tuple[signal.Signals, ...] = WARNING_SIGNALS) -> Iterator[None]:
    """Block ``signals`` in this thread for the block: the processes it starts inherit the blocked mask, through
    ``exec`` too (a signal stays pending there, harmless), and so do the threads it starts. A signal that arrives
    for this process meanwhile waits until the block ends."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def warning_signals_blocked() -> contextlib.AbstractContextManager[None]:
    """`signals_blocked` for the batch system's warning signals."""
    return signals_blocked(WARNING_SIGNALS)
