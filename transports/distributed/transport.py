"""``distributed``: fixed-layout TensorDict payloads over standalone torch.distributed point-to-point groups.

Rules:

- The owner's side holds a rendezvous store (``torch.distributed.TCPStore``) listening on ``host`` (127.0.0.1
  unless configured) and nothing else; the application's default process group is never created, changed or
  destroyed.
- A client is picklable anywhere (it carries the store's address, the endpoint generation, an operation name
  and its layouts) and connects the first time it is used in a process: it takes an endpoint number from the
  store, announces its layouts there as JSON, and once the server accepts, both build two two-rank groups, one
  per direction (gloo for CPU tensors; NCCL for CUDA tensors, with gloo control groups beside them). Creating a
  client never waits for the owner.
- With NCCL each side keeps its payload on one CUDA device, the one its own layouts name, and the two sides of an
  endpoint are on different GPUs (one device per rank; `transports.distributed.devices` says what is refused).
- Each message is a 32-byte binary header and the payload's leaves in the layout's key order, through buffers
  allocated once per endpoint; errors are JSON text. Nothing received from the store or the network is
  unpickled: a malformed announcement is refused with a reason, a malformed header drops its channel.
- Layouts are fixed per endpoint: extra keys are not sent; a missing key or a wrong shape, dtype or device raises
  `LayoutError` in the caller, before anything is sent. A server built with layouts
  accepts only clients announcing the same; one built without (a Ray owner discovering them) accepts what each
  client announces.
- Shutdown is a message each way; a peer that dies closes its connections, and whoever waits on it gets
  `PeerFailureError` at once. A restarted owner is a new store and a new generation.

Security: on loopback the store listens on ``host`` itself. Off loopback it stays on 127.0.0.1 behind a relay on
``host:port`` that admits only peers proving the run's key (``RLSVC_KEY``, an HMAC challenge each way; see
`transports.distributed.relay`), so only they can read or write its keys. Payloads travel unencrypted, and gloo's
own pair connections, whose addresses only the store publishes, are not challenged: keep such runs on networks you
trust.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from tensordict import TensorDict, TensorDictBase

from . import gloo
from .devices import check_apart, check_layout_device, gpu_uuid, matches, on_device, side_device
from .framing import ASKS, BYE, ERROR, REPLY, REQUEST, SEND_TIMEOUT_S, SHUTDOWN, Connection, MalformedMessage, Wire
from .gloo import POLL_S, Gap, check_backend, check_options, connect_store, groups, open_store, wait_answer
from ..base import Batch, RequestReplyTransport, ServerEndpoint, drain
from ..descriptor import DISTRIBUTED, DistributedOptions
from ..kernel.errors import LayoutError, PeerFailureError, TransportError, error_from_text, error_to_text
from ..layout import Layout
from ..local import LocalFuture

log = logging.getLogger(__name__)

CALL = "call"
"""The operation of a plain request/reply endpoint (inference)."""


@dataclass(frozen=True)
class Address:
    """Where an endpoint's owner listens, and which generation of it (what every client carries)."""

    host: str
    port: int
    generation: str
    backend: str
    name: str
    connect_timeout: float
    max_bytes: int


class DistributedTransport(RequestReplyTransport):
    """Request/reply over standalone point-to-point process groups.

    Args:
        request_layout: layout of one request (``None``: announced by each client, for owners that discover it).
        response_layout: layout of one response.
        backend: ``gloo`` (CPU tensors) or ``nccl`` (CUDA tensors).
        host: the address the store and the groups listen on.
        port: the store's port (0: a free one).
        connect_timeout: seconds a client waits for the server to accept it.
        max_payload_mb: the largest payload an announced layout may describe.
        name: names the endpoint in messages.
        operations: ``{operation: (request layout, response layout)}`` the server insists on for those operations
            (a replay buffer's explicit ``extend`` / ``sample`` / ``update_priority`` layouts).
    """

    descriptor = DISTRIBUTED

    def __init__(self, request_layout=None, response_layout=None, backend: str = DistributedOptions.backend,
                 host: str = DistributedOptions.host, port: int = DistributedOptions.port,
                 connect_timeout: float = DistributedOptions.connect_timeout,
                 max_payload_mb: float = DistributedOptions.max_payload_mb, name: str = "service",
                 operations: Mapping[str, tuple] | None = None):
        super().__init__()
        check_backend(backend)
        self.request_layout = _as_layout(request_layout)
        self.response_layout = _as_layout(response_layout)
        self.operations = {op: (_as_layout(req), _as_layout(resp)) for op, (req, resp) in (operations or {}).items()}
        own = (self.request_layout, self.response_layout, *(l for pair in self.operations.values() for l in pair))
        side_device(own, backend, "the server")  # nccl: all on one CUDA device
        self.options = DistributedOptions(backend, host, port, connect_timeout, max_payload_mb)
        self._store, port, self._relay = open_store(host, port, connect_timeout, name)
        self.address = Address(host, port, os.urandom(8).hex(), backend, name, float(connect_timeout),
                               int(max_payload_mb * (1 << 20)))

    check_options = staticmethod(check_options)  # what a range cannot say (nccl needs CUDA), checked while planning

    def server_side(self) -> "ServerSpec":
        return ServerSpec(self.address, self.request_layout, self.response_layout, dict(self.operations))

    def server(self) -> "DistributedServer":
        return self.server_side().server()

    def client(self, op: str = CALL, request_layout=None, response_layout=None) -> "DistributedClient":
        """A client endpoint of operation ``op`` (layouts default to the transport's)."""
        request = _as_layout(request_layout) or self.request_layout
        response = _as_layout(response_layout) or self.response_layout
        side_device((request, response), self.address.backend, "the client")
        return DistributedClient(self.address, op, request, response)

    def mark_serving(self, pid: int) -> None:
        if self._store is not None:
            self._store.set("status", "serving")

    def mark_dead(self, *, stopped: bool) -> None:
        if self._store is not None:
            self._store.set("status", "the server was shut down" if stopped else "the server died")

    def _close(self) -> None:
        if self._relay is not None:
            self._relay.close()
        self._store = None  # the store stops listening; connected channels are ended by their own messages


def _as_layout(value) -> Layout | None:
    return value if value is None or isinstance(value, Layout) else Layout.from_tensordict(value)


@dataclass(frozen=True)
class ServerSpec:
    """What the serving process needs (picklable): the address and the layouts the server insists on."""

    address: Address
    request_layout: Layout | None = None
    response_layout: Layout | None = None
    operations: Mapping[str, tuple] = field(default_factory=dict)

    def server(self) -> "DistributedServer":
        """Build the serving endpoint; call it in the serving process."""
        return DistributedServer(self)


class _Channel:
    """One accepted endpoint on the server: its operation, its wire and its receiving thread."""

    def __init__(self, number: int, op: str, wire: Wire | None, pid: int, request: Layout, response: Layout):
        self.number, self.op, self.wire, self.pid = number, op, wire, pid
        self.request, self.response = request, response
        self.connecting: threading.Thread | None = None  # builds the groups, then starts ``thread``
        self.thread: threading.Thread | None = None
        self.open = True


class DistributedServer(ServerEndpoint):
    """The serving side: accepts endpoints announced in the store, receives on one thread per endpoint, answers
    from the serving loop. Batches hold one request TensorDict per caller (each a private copy); each handle
    is ``(channel, request id)`` and ``handle[0].op`` says which operation it asked for."""

    private_copies = True

    def __init__(self, spec: ServerSpec):
        self.spec, self.address = spec, spec.address
        a = self.address
        self._store = connect_store(a.host, a.port, a.connect_timeout, f"the {a.name} server")
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()  # C: put and wake-up cost less than queue.Queue
        self.channels: dict[int, _Channel] = {}
        self.device, self._gpu = serving_device(spec)  # nccl: this side's CUDA device and its GPU's UUID
        self._stop, self._reason = threading.Event(), "the server was shut down"
        self._accepting = threading.Thread(target=self._accept, name=f"{a.name}-accept", daemon=True)
        self._accepting.start()

    # ------------------------------------------------------------------ accepting
    def _accept(self) -> None:
        n, pause, gap = 0, POLL_S[0], Gap(self.address.connect_timeout / 3)
        while not self._stop.is_set():
            try:
                if self._store.check([f"hello/{n}"]):
                    pause = POLL_S[0]
                    self._admit(n, self._store.get(f"hello/{n}"))
                elif gap.skips(n, self._store):
                    log.warning("%s: endpoint %d was never announced (its process ended after taking the number); "
                                "accepting the ones after it", self.address.name, n)
                else:
                    self._stop.wait(pause)
                    pause = min(pause * 2, POLL_S[1])
                    continue
            except Exception as exc:  # noqa: BLE001 - one bad endpoint never stops the others
                if self._stop.is_set():
                    return
                log.warning("%s: endpoint %d dropped: %s", self.address.name, n, exc)
            n += 1

    def _admit(self, n: int, text: bytes) -> None:
        try:
            op, request, response, pid = read_hello(text, self.spec, self.device, self._gpu)
        except (LayoutError, ValueError, KeyError, TypeError, TransportError) as exc:
            reason = exc if isinstance(exc, (LayoutError, TransportError)) else \
                TransportError(f"malformed announcement ({exc})")
            self._store.set(f"answer/{n}", "reject " + error_to_text(reason))
            log.warning("%s: endpoint %d refused: %s", self.address.name, n, reason)
            return
        self._store.set(f"answer/{n}", "ok")
        channel = _Channel(n, op, None, pid, request, response)
        channel.connecting = threading.Thread(target=self._connect, args=(channel,),
                                              name=f"{self.address.name}-connect{n}", daemon=False)
        self.channels[n] = channel
        channel.connecting.start()  # a peer that never builds its side delays nobody else

    def _connect(self, channel: _Channel) -> None:
        """Build the endpoint's groups, then receive on a daemon thread. This thread is not a daemon: a process
        that ends while it waits in gloo's rendezvous waits for it (at most ``gloo.CONNECT_S``) instead of
        aborting (a daemon thread inside gloo when the interpreter finalizes kills the process)."""
        a = self.address
        try:
            store = connect_store(a.host, a.port, a.connect_timeout, f"the {a.name} server")
            out, inp = groups(store, f"{a.generation}/{channel.number}/", 0, a.host, a.backend)
        except Exception as exc:  # noqa: BLE001 - the client's process ended before it connected
            channel.open = False
            self.channels.pop(channel.number, None)
            if not self._stop.is_set():
                log.warning("%s: endpoint %d (pid %d) never connected: %s", a.name, channel.number, channel.pid,
                            str(exc).splitlines()[0][:200])
            return
        channel.wire = Wire(out, inp, channel.response, channel.request, peer=1)
        channel.thread = threading.Thread(target=self._receive, args=(channel,), name=f"{a.name}-rx{channel.number}",
                                          daemon=True)
        channel.thread.start()

    def _receive(self, channel: _Channel) -> None:
        try:
            if self._stop.is_set():  # closed while this endpoint connected: it missed the SHUTDOWN of close()
                self._send(channel, SHUTDOWN, 0, text=self._reason, timeout=1.0)
            while True:
                kind, rid, payload = channel.wire.recv(ASKS)
                if kind == BYE:  # the client closes (its process exits), or answers this server's SHUTDOWN
                    if not self._stop.is_set():
                        self._send(channel, BYE, 0, timeout=1.0)  # ends the client's receiving thread
                    return
                self.inbox.put(((channel, rid), payload, time.monotonic()))
        except MalformedMessage as exc:
            log.warning("%s: endpoint %d (pid %d) dropped: %s", self.address.name, channel.number, channel.pid, exc)
        except Exception:  # noqa: BLE001 - the client's process ended: its connection closed
            pass
        finally:
            channel.open = False
            self.channels.pop(channel.number, None)

    # ------------------------------------------------------------------ serving
    def collect(self, max_n: int, min_n: int, timeout: float, poll: float) -> Batch | None:
        items = drain(self.inbox, max_n, min_n, timeout, poll)
        if not items:
            return None
        return Batch(handles=[h for h, _, _ in items], requests=[td for _, td, _ in items],
                     enqueued=[t for _, _, t in items])

    def reply(self, batch: Batch, out: Any) -> None:
        # one batched answer (row i for request i), or a list of answers
        rows = type(out) is TensorDict or isinstance(out, TensorDictBase)
        for i, (channel, rid) in enumerate(batch.handles):
            try:
                self._send(channel, REPLY, rid, out if rows else out[i], row=i if rows else None)
            except LayoutError as exc:  # the answer does not fit this endpoint's response layout
                self._send(channel, ERROR, rid, text=error_to_text(exc))

    def fail(self, batch: Batch, error: BaseException) -> None:
        text = error_to_text(error)
        for channel, rid in batch.handles:
            self._send(channel, ERROR, rid, text=text)

    def _send(self, channel: _Channel, kind: int, rid: int, values: Any = None, row: int | None = None,
              text: str = "", timeout: float = SEND_TIMEOUT_S):
        if not channel.open or channel.wire is None:
            return  # its caller is gone (or never connected)
        try:
            channel.wire.send(kind, rid, values, row, text, timeout)
        except LayoutError:
            raise
        except Exception as exc:  # noqa: BLE001 - the caller's process died: nobody waits for this answer
            log.debug("%s: endpoint %d gone: %s", self.address.name, channel.number, exc)
            channel.open = False

    def close(self, reason: str = "the server was shut down", timeout: float = 2.0) -> None:
        """Stop accepting, tell every connected client (which answers BYE), and wait for the channels to end (an
        endpoint still building its groups is waited for as long as the others; it ends on its own within
        ``gloo.CONNECT_S``, and the process, if it ends first, waits for it: no thread is left inside gloo)."""
        self._reason = reason
        self._stop.set()
        self._accepting.join(timeout)
        channels = list(self.channels.values())
        for channel in channels:
            self._send(channel, SHUTDOWN, 0, text=reason, timeout=1.0)
        deadline = time.monotonic() + timeout
        for channel in channels:
            if channel.connecting is not None:  # gives up within CONNECT_S when its peer never connects
                channel.connecting.join(max(0.0, deadline - time.monotonic()) + gloo.CONNECT_S)
            if channel.thread is not None:
                channel.thread.join(max(0.0, deadline - time.monotonic()))
        if any(channel.connecting is not None and channel.wire is None for channel in channels):
            # what a failed rendezvous left (a half-built gloo context) is freed now, while the interpreter runs:
            # freed during its finalization, it aborted the process about half the time
            gc.collect()
        self._store = None


def serving_device(spec: ServerSpec) -> tuple[str | None, str | None]:
    """The CUDA device a server keeps its nccl payloads on, and its GPU's UUID (``(None, None)`` with gloo): the one
    its own layouts name, else this process's current CUDA device (a server discovering its layouts)."""
    if spec.address.backend != "nccl":
        return None, None
    layouts = (spec.request_layout, spec.response_layout, *(l for pair in spec.operations.values() for l in pair))
    device = side_device(layouts, "nccl", "the server")
    if device is None:
        import torch

        device = f"cuda:{torch.cuda.current_device()}"
    return device, gpu_uuid(device)


def read_hello(text: bytes, spec: ServerSpec, device: str | None = None, gpu: str | None = None
               ) -> tuple[str, Layout, Layout, int]:
    """An endpoint's announcement, checked: ``(operation, request layout, response layout, pid)``, the layouts as
    the server keeps them (with nccl, on its own ``device``, whose GPU's UUID is ``gpu``).

    Raises:
        ValueError, KeyError, TypeError: a malformed announcement (another generation, a bad operation or pid).
        LayoutError: a layout that is unreadable, too large, not the server's own, or on a device the backend
            does not move.
        TransportError: with nccl, the client's payload is on the server's GPU (one device per rank).
    """
    a = spec.address
    hello = json.loads(text)
    if hello["generation"] != a.generation:
        raise ValueError("an endpoint of another generation of this owner (it was restarted)")
    op, pid = hello["op"], hello["pid"]
    if not isinstance(op, str) or not 0 < len(op) <= 64 or type(pid) is not int:
        raise ValueError("bad operation or pid")
    request = Layout.from_text(hello["request"], max_bytes=a.max_bytes)
    response = Layout.from_text(hello["response"], max_bytes=a.max_bytes)
    mine_request, mine_response = spec.operations.get(op, (spec.request_layout, spec.response_layout))
    for mine, theirs, what in ((mine_request, request, "request"), (mine_response, response, "response")):
        check_layout_device(theirs, a.backend, f"the {what}")
        if mine is not None and not matches(mine, theirs):
            raise LayoutError((), f"the server's {what} layout ({mine.describe()})", theirs.describe())
    if a.backend == "nccl":
        theirs = hello.get("device")
        if not isinstance(theirs, str) or not isinstance(hello.get("gpu"), str):
            raise ValueError("an nccl endpoint announces its device and its GPU's UUID")
        check_apart(gpu, hello["gpu"], device, theirs)
    here = device or "cpu"  # where a layout the server discovers lands: its CUDA device (nccl), else the CPU
    request = on_device(request, here) if mine_request is None else mine_request
    response = on_device(response, here) if mine_response is None else mine_response
    return op, request, response, pid


class DistributedClient:
    """A client endpoint of a `DistributedTransport`: ``submit(td)`` returns a future.

    Picklable to any process that reaches the owner's host; each process connects its own endpoint the first
    time it submits (several threads may submit at once; answers may complete out of order).
    """

    def __init__(self, address: Address, op: str = CALL, request_layout: Layout | None = None,
                 response_layout: Layout | None = None):
        self.address, self.op = address, op
        self.request_layout, self.response_layout = request_layout, response_layout
        self._connection: Connection | None = None
        self._pid = None
        self._lock = threading.Lock()

    def __reduce__(self):
        return (DistributedClient, (self.address, self.op, self.request_layout, self.response_layout))

    def bind(self, op: str, request_layout, response_layout) -> "DistributedClient":
        """An endpoint of operation ``op`` to the same owner with these layouts (layouts or representative
        TensorDicts; discovered through the owner's control channel)."""
        request, response = _as_layout(request_layout), _as_layout(response_layout)
        side_device((request, response), self.address.backend, "the client")
        return DistributedClient(self.address, op, request, response)

    @property
    def connected(self) -> bool:
        """Whether this process holds an open connection to the server (a forked copy does not)."""
        return self._connection is not None and self._pid == os.getpid()

    def submit(self, td: TensorDictBase) -> LocalFuture:
        """Send ``td`` to the server over this process's connection (connecting on first use).

        Returns:
            The future of the answer.

        Raises:
            TransportError: no layouts are bound to this endpoint yet.
            LayoutError: ``td`` does not match the request layout (raised before anything is sent).
            PeerFailureError: the server is gone or unreachable.
        """
        if self.request_layout is None or self.response_layout is None:
            raise TransportError(f"the {self.address.name} {self.op!r} endpoint has no layouts bound yet")
        if type(td) is not TensorDict and not isinstance(td, TensorDictBase):  # the exact type first: no ABC check
            raise LayoutError((), "a TensorDict", type(td).__name__)
        connection = self._connect()
        future = LocalFuture()
        with connection.lock:
            if connection.problem is not None:
                raise PeerFailureError(connection.problem)
            rid = next(connection.ids)
            connection.pending[rid] = future
        try:
            connection.wire.send(REQUEST, rid, td)  # checks every leaf: LayoutError here, before anything is sent
        except Exception as exc:  # noqa: BLE001 - the connection closed under us
            with connection.lock:
                connection.pending.pop(rid, None)
            if isinstance(exc, LayoutError):
                raise
            raise PeerFailureError(connection.problem or f"the {self.address.name} server is unreachable "
                                   f"({type(exc).__name__})") from None
        return future

    def _connect(self) -> Connection:
        if self._connection is not None and self._pid == os.getpid():
            return self._connection
        with self._lock:
            if self._connection is None or self._pid != os.getpid():
                self._connection, self._pid = self._open_to_the_end(), os.getpid()
            return self._connection

    def _open_to_the_end(self) -> Connection:
        """`_open` on a thread of its own, waited for: where the caller is interrupted meanwhile (a signal's
        exception in the main thread: Ctrl-C, the launcher's SIGTERM), the endpoint is still built to the end and
        kept, so the server, which admitted it, is not left waiting for its side of the groups (up to
        ``gloo.CONNECT_S``) as it shuts down. Not a daemon thread, as the server's: no thread is left inside gloo."""
        box: list = []

        def open_it() -> None:
            try:
                box.append(self._open())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                box.append(exc)
                return
            self._connection, self._pid = box[0], os.getpid()  # kept for the next call, should the caller leave

        thread = threading.Thread(target=open_it, name=f"{self.address.name}-connect", daemon=False)
        thread.start()
        thread.join()
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def _open(self) -> Connection:
        a = self.address
        what = f"the {a.name} {self.op!r} endpoint"
        store = connect_store(a.host, a.port, a.connect_timeout, what)
        n = store.add("endpoints", 1) - 1
        device = side_device((self.request_layout, self.response_layout), a.backend, "the client")
        store.set(f"hello/{n}", json.dumps({
            "generation": a.generation, "op": self.op, "pid": os.getpid(),
            "request": self.request_layout.to_text(), "response": self.response_layout.to_text(),
            **({"device": device, "gpu": gpu_uuid(device)} if device is not None else {})}))
        answer = wait_answer(store, n, a.connect_timeout, what)
        if answer != b"ok":
            error = error_from_text(answer[len(b"reject "):])
            if isinstance(error, LayoutError):
                raise error
            raise TransportError(f"{what} was refused: {error}")
        out, inp = groups(store, f"{a.generation}/{n}/", 1, a.host, a.backend)
        return Connection(Wire(out, inp, self.request_layout, self.response_layout, peer=0), a.name)
