"""The small bases every payload transport implements.

A transport connects clients to one owner. It is created on the owner side, hands out client endpoints
with `Transport.client`, and releases what it holds with `Transport.close` (idempotent).

`RequestReplyTransport` is the shape inference uses (and replay's commands later): clients
``submit`` TensorDicts and get futures; the serving side, wherever it runs, ``collect`` s a batch of requests,
then ``reply`` s with one output row per request or ``fail`` s the whole batch. The transport knows nothing
of policies; batching policy (sizes, timeouts) belongs to the caller of ``collect``.
"""

from __future__ import annotations

import dataclasses
import queue
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from .config import TransportConfig
from .descriptor import TransportDescriptor

if TYPE_CHECKING:
    from tensordict import TensorDictBase

    from .layout import Layout


class Transport(ABC):
    """Base class of payload transports.

    Subclasses set `descriptor` (what the transport is: its kind, reach, layouts, options; see
    `transports.descriptor`), state their rules in the class docstring, and implement `client` and
    `_close`. `kind` follows from the descriptor.

    Attributes:
        descriptor: the transport's `TransportDescriptor`.
        kind: its kind (``descriptor.kind``).
        options: the instance's options, an instance of ``descriptor.options`` (set by subclasses that take any).
    """

    descriptor: ClassVar[TransportDescriptor | None] = None
    kind: ClassVar[str] = "custom"
    options: Any = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "descriptor" in cls.__dict__ and cls.descriptor is not None:
            cls.kind = cls.descriptor.kind

    def __init__(self) -> None:
        self._closed = False

    @abstractmethod
    def client(self) -> Any:
        """Return a new client endpoint."""

    def close(self) -> None:
        """Release every resource of the transport. Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        self._close()

    def _close(self) -> None:
        """Release resources; called once by `close`."""

    @property
    def closed(self) -> bool:
        """Whether `close` was called."""
        return self._closed

    @property
    def config(self) -> TransportConfig:
        """The transport as a value (its kind and options), for plans and messages."""
        options = {} if self.options is None else dataclasses.asdict(self.options)
        return TransportConfig(self.kind, options)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass(slots=True)
class Batch:
    """Requests collected for one serving pass.

    Attributes:
        handles: opaque per-request handles, in collection order (each producer's requests keep their order).
        requests: the request TensorDicts (dynamic-layout transports), or ``None``.
        stacked: the requests already gathered into one TensorDict with a leading request dimension
            (fixed-layout transports), or ``None``.
        enqueued: ``time.monotonic()`` of each submission (for queue-wait statistics).
        version: the ``policy_version`` that served the batch, set by the serving loop before `reply`
            (an endpoint that ``stamps_version`` writes it into each answer itself).
    """

    handles: list
    requests: list | None = None
    stacked: TensorDictBase | None = None
    enqueued: list = field(default_factory=list)
    version: int = 0

    def __len__(self) -> int:
        return len(self.handles)


def drain(q, max_n: int, min_n: int, timeout: float, poll: float) -> list:
    """Take items from a ``queue.Queue`` or ``multiprocessing.Queue``: wait up to ``poll`` s for a first one, take
    what is there up to ``max_n``, and while fewer than ``min_n`` wait up to ``timeout`` s for more."""
    try:
        items = [q.get(timeout=poll)]
    except queue.Empty:
        return []
    deadline = time.monotonic() + timeout
    while len(items) < max_n:
        try:
            items.append(q.get_nowait())
            continue
        except queue.Empty:
            pass
        remaining = deadline - time.monotonic()
        if len(items) >= min_n or remaining <= 0:
            break
        try:
            items.append(q.get(timeout=remaining))
        except queue.Empty:
            break
    return items


class ServerEndpoint(ABC):
    """The serving side of a request/reply transport; used in the process (and thread) that serves.

    Attributes:
        fixed_keys: ``(request keys, response keys)`` for an endpoint of fixed layouts whose stacked batches are
            fresh copies holding exactly the request keys and whose `reply` copies exactly the response keys
            out of ``out`` (so ``out`` itself never reaches a caller); ``None`` otherwise. The serving loop uses it
            to skip work.
        private_copies: ``True`` for an endpoint whose requests are fresh copies nobody else holds (decoded from
            bytes) and whose `reply` copies the answers out (encodes them): the serving loop may then use
            the requests' tensors in the batch without copying, and share a version tensor between batches.
        stamps_version: ``True`` for an endpoint whose `reply` writes ``batch.version`` as every answer's
            ``policy_version`` itself (a slot transport writes one integer into shared memory): the serving loop
            then leaves ``policy_version`` out of ``out``.
    """

    fixed_keys: tuple[frozenset, frozenset] | None = None
    private_copies: bool = False
    stamps_version: bool = False

    @abstractmethod
    def collect(self, max_n: int, min_n: int, timeout: float, poll: float) -> Batch | None:
        """Wait up to ``poll`` seconds for a first request, then gather up to ``max_n``; once one is there, wait
        up to ``timeout`` seconds for ``min_n``. ``None`` when nothing came."""

    @abstractmethod
    def reply(self, batch: Batch, out: TensorDictBase) -> None:
        """Answer every request of ``batch``; ``out[i]`` is the answer to request ``i``."""

    @abstractmethod
    def fail(self, batch: Batch, error: BaseException) -> None:
        """Answer every request of ``batch`` with ``error`` (raised again at each call site)."""

    def close(self, reason: str = "the server was shut down") -> None:
        """Fail what is still pending with `PeerFailureError`; stop accepting."""

    def gather_into(self, buffers: dict) -> bool:
        """Gather later batches into ``buffers`` (leaf key -> a tensor of ``rows`` rows, e.g. pinned host memory for
        a CUDA policy), so a stacked batch's leaves are views of their first rows, valid until the next
        `collect`. An endpoint of fixed layouts may do so; the default declines.

        Returns:
            Whether the endpoint will.
        """
        return False


class ResponseFuture(ABC):
    """The answer to one submitted request. ``result()`` waits; a dead server raises
    `PeerFailureError`, a deadline
    `ServiceTimeoutError`."""

    @abstractmethod
    def result(self, timeout: float | None = None) -> TensorDictBase:
        """Wait for the answer and return it.

        Args:
            timeout: most seconds to wait; ``None`` waits as long as the server lives.

        Raises:
            PeerFailureError: the server died or was shut down before answering.
            ServiceTimeoutError: no answer within ``timeout``.
        """

    @abstractmethod
    def done(self) -> bool:
        """Whether the answer (or its error) has arrived, without waiting."""

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error `result` would raise, or ``None`` once it answers; waits as `result` does."""
        try:
            self.result(timeout)
        except BaseException as exc:  # noqa: BLE001 - reported, not handled
            return exc
        return None


class RequestReplyTransport(Transport):
    """A transport that carries TensorDict requests to one server and answers back.

    Whether requests and responses must match layouts bound at construction, and how far clients reach, are the
    descriptor's (``descriptor.fixed_layout``, ``descriptor.reach``).
    """

    request_layout: Layout | None = None
    response_layout: Layout | None = None

    @abstractmethod
    def server(self) -> ServerEndpoint:
        """The serving endpoint; call it where the server runs (after the transport reached that process)."""

    @classmethod
    def shared_memory_bytes(cls, request_layout: Layout, response_layout: Layout, options: Any) -> int:
        """Bytes of the shared-memory segments a transport of these layouts and options (a mapping of its keyword
        options) makes, for the plan to check against the segment directory's room. By default: none."""
        return 0

    def server_side(self) -> Any:
        """What the serving process needs (an object with ``server()``), without the clients' ends: this is
        what travels to a server process."""
        return self

    def mark_serving(self, pid: int) -> None:
        """Tell clients a server (in process ``pid``) is answering."""

    def bind(self, host: Any) -> None:
        """Tell clients where the server runs once its host started it (anything with ``pid`` and ``handle``, such
        as a `components.hosts.base.Host`); by default: `mark_serving` with the host's pid."""
        import os

        self.mark_serving(host.pid if host.pid is not None else os.getpid())

    def mark_dead(self, *, stopped: bool) -> None:
        """Tell clients nothing will answer any more (``stopped``: an orderly shutdown)."""

