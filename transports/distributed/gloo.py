"""The mechanics under the ``distributed`` transport: a rendezvous store bound where we say and standalone
point-to-point process groups (the framing of a message on a pair of them: :mod:`transports.distributed.framing`).

Nothing here touches the application's default process group: every group is built directly from a store of
its own (``ProcessGroupGloo(store, rank, 2, options)``), so ``init_process_group`` / ``destroy_process_group``
in user code are unaffected, before and after.
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
from typing import Any

import torch

from ..kernel.errors import ConfigurationError, PeerFailureError
from ..descriptor import DistributedOptions

IDLE = datetime.timedelta(days=30)
"""How long a receive waits (passed to every receive). An idle gloo receive that times out closes its pair, and a channel waits for
requests as long as its peer lives: peers end channels with messages (SHUTDOWN / BYE) or by dying, which gloo
reports at once (the connection closes)."""
CONNECT_S = 60.0
"""Seconds both sides of an accepted endpoint have to build its groups. It is the groups' own timeout (every
receive passes :data:`IDLE` explicitly), so a peer that dies between its announcement and its groups costs the
other side this long, never longer: no thread stays inside gloo's rendezvous when the process ends. Generous: 64
clients connecting at once to a server on 2 busy cores took more than 10 s (tests/components/test_load.py)."""
BACKENDS = DistributedOptions.__dataclass_fields__["backend"].metadata["choices"]
DEFAULT_BACKEND = DistributedOptions.backend
"""The backend when ``transport_options`` names none (the options' default, which the plan prints)."""
POLL_S = (0.0005, 0.02)
"""Store polling pauses: the first, and the longest (the pause doubles while nothing comes)."""


def check_backend(backend: str, path: str = "transport_options.backend") -> None:
    """Refuse an unknown backend, and ``nccl`` on a machine without CUDA (before anything starts)."""
    if backend not in BACKENDS:
        raise ConfigurationError(f"unknown distributed backend {backend!r}", path=path, alternatives=BACKENDS)
    if backend == "nccl" and not torch.cuda.is_available():
        raise ConfigurationError("backend 'nccl' moves CUDA tensors and this machine has no CUDA device; use "
                                 "backend 'gloo' for CPU tensors", path=path, alternatives=("gloo",))


def check_options(options, *, path: str = "transport_options") -> None:
    """What the distributed transport's declared ranges cannot say, checked while planning: ``nccl`` needs CUDA on
    this machine."""
    check_backend(options.get("backend", DEFAULT_BACKEND), path=f"{path}.backend")


def open_store(host: str, port: int, timeout: float):
    """A store server listening on ``host:port`` only (``port`` 0: a free one), and its port.

    torch's own TCPStore server listens on every interface; handing it a socket bound here keeps it where the
    configuration says (127.0.0.1 by default).
    """
    from torch.distributed import TCPStore

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
        sock.listen(512)
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"the distributed transport cannot listen on {host}:{port} ({exc})",
                                 path="transport_options.host") from None
    port = sock.getsockname()[1]
    store = TCPStore(host, port, None, True, timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False,
                     master_listen_fd=sock.detach(), use_libuv=True)
    return store, port


def connect_store(host: str, port: int, timeout: float, what: str):
    """A client connection to the store at ``host:port``.

    Raises:
        PeerFailureError: nothing answers there (the owner is gone).
    """
    from torch.distributed import TCPStore

    try:
        return TCPStore(host, port, None, False, timeout=datetime.timedelta(seconds=timeout))
    except Exception as exc:  # noqa: BLE001 - torch raises several types for a refused connection
        raise PeerFailureError(f"{what}: no rendezvous store answers at {host}:{port} ({type(exc).__name__})") from None


def pair(store, prefix: str, rank: int, host: str, backend: str = "gloo") -> Any:
    """A standalone two-rank group through ``store`` under ``prefix`` (both ranks call it with the same prefix)."""
    from torch.distributed import PrefixStore

    scoped = PrefixStore(prefix, store)
    if backend == "gloo":
        from torch._C._distributed_c10d import ProcessGroupGloo

        options = ProcessGroupGloo._Options()
        options._devices = [_device(host)]
        options._timeout = datetime.timedelta(seconds=CONNECT_S)
        options._threads = 1  # point-to-point only: one worker thread per group (the default is two)
        return ProcessGroupGloo(scoped, rank, 2, options)
    from torch._C._distributed_c10d import ProcessGroupNCCL  # pragma: no cover - needs CUDA

    options = ProcessGroupNCCL.Options()  # pragma: no cover
    options._timeout = IDLE  # pragma: no cover
    return ProcessGroupNCCL(scoped, rank, 2, options)  # pragma: no cover


_DEVICES: dict = {}
_DEVICES_LOCK = threading.Lock()


def _device(host: str):
    """One gloo device (one listening address and one event loop thread) per host address and process, shared by
    every group of this process."""
    from torch._C._distributed_c10d import ProcessGroupGloo

    with _DEVICES_LOCK:
        key = (os.getpid(), host)
        if key not in _DEVICES:
            _DEVICES[key] = ProcessGroupGloo.create_device(hostname=host)
        return _DEVICES[key]


def wait_answer(store, n: int, timeout: float, what: str) -> bytes:
    """The server's answer to announcement ``n`` (``ok`` or ``reject <error text>``), polled from the store.

    Raises:
        PeerFailureError: the owner marked the server dead, or no answer within ``timeout`` seconds.
    """
    deadline, pause = time.monotonic() + timeout, POLL_S[0]
    while not store.check([f"answer/{n}"]):
        if store.check(["status"]):
            status = store.get("status").decode("utf-8", errors="replace")
            if status != "serving":
                raise PeerFailureError(f"{what}: {status}")
        if time.monotonic() > deadline:
            raise PeerFailureError(f"{what}: the server did not accept the endpoint within {timeout} s")
        time.sleep(pause)
        pause = min(pause * 2, POLL_S[1])
    return store.get(f"answer/{n}")


class Gap:
    """Whether the server should give up waiting for endpoint ``n``'s announcement: a client takes its number and
    announces itself right after, so a number still silent ``grace`` seconds after a later one was taken belongs to
    a process that ended in between. The counter is read at most once a second (the server polls much faster)."""

    def __init__(self, grace: float):
        self.grace, self.number, self.since, self.read = grace, -1, 0.0, 0.0

    def skips(self, n: int, store) -> bool:
        """Whether announcement ``n`` is given up as lost; call it each time the server polls for ``n``."""
        now = time.monotonic()
        if n != self.number:
            self.number, self.since, self.read = n, now, 0.0
        if now - self.read < 1.0:
            return False
        self.read = now
        if int(store.add("endpoints", 0)) <= n + 1:  # no later number taken: n may still be on its way
            self.since = now
            return False
        return now - self.since > self.grace and not store.check([f"hello/{n}"])


def groups(store, prefix: str, rank: int, host: str, backend: str) -> tuple[tuple, tuple]:
    """Both directions' groups of one endpoint, built in the same order on both sides: ``(out, inp)`` for
    ``rank`` (0: the server). NCCL payload groups get gloo control groups beside them."""
    made = [(pair(store, f"{prefix}{d}/", rank, host),
             pair(store, f"{prefix}{d}/data/", rank, host, backend) if backend != "gloo" else None)
            for d in ("request", "response")]
    return (made[1], made[0]) if rank == 0 else (made[0], made[1])


