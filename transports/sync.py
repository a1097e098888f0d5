"""Semaphores and locks that any process of this machine can reattach by name, like shared-memory segments.

multiprocessing's own refuse to be pickled except while a child process is being started ("should only be
shared between processes through inheritance"), so a client holding one could not travel to a worker pool, a
process started by ``spawn`` later, a Ray task or a Slurm job step on the same machine. These are the same POSIX
named semaphores (``sem_open``, mode 0600: this user only); pickling one carries its name and unpickling opens
it again. The creating process unlinks the name when it collects the object or exits, as multiprocessing does:
copies already open keep working, and a copy unpickled after that fails to open (the owner is gone).
"""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing import synchronize

import _multiprocessing


def _reopen(cls: type, kind: int, maxvalue: int, name: str):
    obj = cls.__new__(cls)
    try:
        obj._semlock = _multiprocessing.SemLock._rebuild(0, kind, maxvalue, name)
    except FileNotFoundError:
        from .kernel.errors import PeerFailureError

        raise PeerFailureError(f"the process that made semaphore {name} is gone (so is the service it belonged to)") \
            from None
    obj._is_fork_ctx = False
    obj._make_methods()
    return obj


class _ByName:
    """Pickles as its name (any time, to any process of this machine), reopened on the other side."""

    def __reduce__(self):
        sl = self._semlock
        if sl.name is None:  # made in a fork context: unlinked at once, it has no name to travel by
            raise TypeError(f"{type(self).__name__} made in a 'fork' context cannot travel by name")
        return (_reopen, (type(self), sl.kind, sl.maxvalue, sl.name))


class Semaphore(_ByName, synchronize.Semaphore):
    """A counting semaphore (``acquire`` / ``release``) that travels by name."""

    def __init__(self, value: int = 1, context: str = "spawn"):
        synchronize.Semaphore.__init__(self, value, ctx=mp.get_context(context))


class Lock(_ByName, synchronize.Lock):
    """A non-recursive lock that travels by name."""

    def __init__(self, context: str = "spawn"):
        synchronize.Lock.__init__(self, ctx=mp.get_context(context))
