"""A batch system's warning signals: Slurm's ``--signal`` before the time limit, submitit's preemption signal,
``scancel --signal=USR2``. Slurm sends them to every process of the job step; the driver acts on them (it writes its
checkpoint, then stops its services, :mod:`launcher.requeue`), and to every other process they are fatal by default.
So service processes ignore them, and the helper processes a placement starts (a forkserver and its resource
tracker, a local Ray cluster's daemons and workers) start with them blocked.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Iterator

WARNING_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


@contextlib.contextmanager
def warning_signals_blocked() -> Iterator[None]:
    """Block the warning signals in this thread for the block: the processes it starts inherit the blocked mask,
    through ``exec`` too (a signal stays pending there, harmless), and so do the threads it starts."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, WARNING_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
