"""The mechanics under the ``distributed`` transport: a rendezvous store bound where we say and standalone
point-to-point process groups (the framing of a message on a pair of them: `transports.distributed.framing`).

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
from torch.distributed import Store

from ..kernel.errors import ConfigurationError, PeerFailureError
from ..kernel.secret import is_loopback, shared_key
from ..descriptor import DistributedOptions
from .relay import Relay, entry

IDLE = datetime.timedelta(days=30)
"""How long a receive waits (passed to every receive). An idle gloo receive that times out closes its pair, and a channel waits for
requests as long as its peer lives: peers end channels with messages (SHUTDOWN / BYE) or by dying, which gloo
reports at once (the connection closes)."""
CONNECT_S = 60.0
"""Seconds both sides of an accepted endpoint have to build its groups. It is the groups' own timeout (every
receive passes `IDLE` explicitly), so a peer that dies between its announcement and its groups costs the
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
    this machine; ``host`` is an address peers can dial, and off loopback the run's key is set."""
    check_backend(options.get("backend", DEFAULT_BACKEND), path=f"{path}.backend")
    host = str(options.get("host", DistributedOptions.host))
    if host in WILDCARDS:
        raise ConfigurationError(f"host {host!r} is every address of the machine, not one that peers can dial: give "
                                 "the address of the interface they reach (127.0.0.1 when they all run here)",
                                 path=f"{path}.host")
    if not is_loopback(host):
        shared_key(f"the distributed transport listens on {host}, off loopback", f"{path}.host")


WILDCARDS = ("", "0.0.0.0", "::", "*")
"""Hosts that mean every interface: refused, the store would listen where nobody asked."""


def open_store(host: str, port: int, timeout: float, name: str = "service") -> tuple[Any, int, Relay | None]:
    """A store server for an endpoint whose clients dial ``host:port`` (``port`` 0: a free one): the store, the port
    to dial, and the relay in front of it (``None`` on loopback).

    On loopback the store itself listens on ``host:port``. Elsewhere it listens on 127.0.0.1 only, and a
    `Relay` on ``host:port`` admits only peers proving the run's key. torch's
    own TCPStore server listens on every interface; handing it a bound socket keeps it where we say.

    Raises:
        ConfigurationError: nothing can listen there (an address of another machine, a port in use), or the key is
            missing off loopback.
    """
    from torch.distributed import TCPStore

    key = None if is_loopback(host) else shared_key(f"the {name} endpoint listens on {host}", "transport_options.host")
    listen_host, listen_port = (host, port) if key is None else ("127.0.0.1", 0)
    sock = socket.socket(socket.AF_INET6 if ":" in listen_host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((listen_host, listen_port))
        sock.listen(512)
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"the distributed transport cannot listen on {host}:{port} ({exc})",
                                 path="transport_options.host") from None
    store_port = sock.getsockname()[1]
    store = TCPStore(listen_host, store_port, None, True, timeout=datetime.timedelta(seconds=timeout),
                     wait_for_workers=False, master_listen_fd=sock.detach(), use_libuv=True)
    if key is None:
        return store, store_port, None
    try:
        relay = Relay(host, port, store_port, key, name)
    except OSError as exc:
        raise ConfigurationError(f"the distributed transport cannot listen on {host}:{port} ({exc})",
                                 path="transport_options.host") from None
    return store, relay.port, relay


def connect_store(host: str, port: int, timeout: float, what: str):
    """A client connection to the store at ``host:port`` (off loopback: through this process's entry to its relay,
    proving the run's key).

    Raises:
        PeerFailureError: nothing answers there (the owner is gone), or it does not admit our key.
        ConfigurationError: off loopback, ``RLSVC_KEY`` is not set in this process.
    """
    from torch.distributed import TCPStore

    dial_host, dial_port = host, port
    if not is_loopback(host):
        key = shared_key(f"{what} at {host}:{port} is off loopback", "transport_options.host")
        dial_host, dial_port = "127.0.0.1", entry(host, port, key, timeout, what)
    try:
        return TCPStore(dial_host, dial_port, None, False, timeout=datetime.timedelta(seconds=timeout))
    except Exception as exc:  # noqa: BLE001 - torch raises several types for a refused connection
        raise PeerFailureError(f"{what}: no rendezvous store answers at {host}:{port} ({type(exc).__name__})") from None


def local_address(host: str) -> str:
    """This process's own address on the way to ``host``: where its gloo pairs listen for that peer (``host`` itself
    on loopback). Asks the routing table; sends nothing."""
    if is_loopback(host):
        return host
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((host, 9))
        return probe.getsockname()[0]
    except OSError as exc:
        raise PeerFailureError(f"no route from this host to {host} ({exc})") from None
    finally:
        probe.close()


def pair(store, prefix: str, rank: int, host: str, backend: str = "gloo") -> Any:
    """A standalone two-rank group through ``store`` under ``prefix`` (both ranks call it with the same prefix);
    ``host`` is the store's, this side's gloo device listens on its own address towards it."""
    from torch.distributed import PrefixStore

    scoped = PrefixStore(prefix, store)
    if backend == "gloo":
        host = local_address(host)
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


class Lease(Store):
    """A store lent to gloo groups while they are built, then released: the groups keep a reference to their store
    for their whole life but use it only in their rendezvous, so once they are built the connection under it can
    close (off loopback, a connection through the relay: two of its threads and two of this process's entry's).
    A use after `release` raises (none was seen: tests/transports/test_distributed.py builds many endpoints
    through leases and serves them).

    Args:
        store: the store the rendezvous goes through.
    """

    def __init__(self, store):
        super().__init__()
        self._store = store

    def release(self) -> None:
        """Drop the store: its connection closes once nothing else holds it."""
        self._store = None

    def _lent(self):
        if self._store is None:
            raise RuntimeError("the store of this endpoint's groups was released once they were built")
        return self._store

    def set(self, key, value):
        """As `torch.distributed.Store.set`."""
        return self._lent().set(key, value)

    def get(self, key):
        """As `torch.distributed.Store.get`."""
        return self._lent().get(key)

    def add(self, key, amount):
        """As `torch.distributed.Store.add`."""
        return self._lent().add(key, amount)

    def check(self, keys):
        """As `torch.distributed.Store.check`."""
        return self._lent().check(keys)

    def wait(self, keys, timeout=None):
        """As `torch.distributed.Store.wait`."""
        return self._lent().wait(keys) if timeout is None else self._lent().wait(keys, timeout)

    def compare_set(self, key, expected, desired):
        """As `torch.distributed.Store.compare_set`."""
        return self._lent().compare_set(key, expected, desired)

    def delete_key(self, key):
        """As `torch.distributed.Store.delete_key`."""
        return self._lent().delete_key(key)

    def num_keys(self):
        """As `torch.distributed.Store.num_keys`."""
        return self._lent().num_keys()


def groups(store, prefix: str, rank: int, host: str, backend: str) -> tuple[tuple, tuple]:
    """Both directions' groups of one endpoint, built in the same order on both sides: ``(out, inp)`` for
    ``rank`` (0: the server). NCCL payload groups get gloo control groups beside them.

    gloo groups hold ``store`` only while they are built (through a `Lease`): once this returns, the
    caller's connection is theirs to close. NCCL groups keep it (NCCL builds its communicator at the first
    operation, through the store)."""
    lease = Lease(store) if backend == "gloo" else store
    try:
        made = [(pair(lease, f"{prefix}{d}/", rank, host),
                 pair(lease, f"{prefix}{d}/data/", rank, host, backend) if backend != "gloo" else None)
                for d in ("request", "response")]
    finally:
        if backend == "gloo":
            lease.release()
    return (made[1], made[0]) if rank == 0 else (made[0], made[1])


