"""What each transport says about itself: one `TransportDescriptor` per transport class.

A descriptor is plain data and imports nothing heavy: its kind and aliases, how far its clients reach from the owner
(`Reach`), whether it needs fixed wire layouts before the server starts, which
option names the wire it rides, and the dataclass of its keyword options (their types, defaults and ranges). The
vocabulary of kinds (`transports.kinds`), the registry that builds a transport (`transports.registry`), the
option checks, the plan's reachability checks and the generated documentation all read descriptors, so a plan is checked
before any transport module, or torch, is imported.

The built-in transports' descriptors are declared here; each transport class points at its own
(``descriptor = descriptors.QUEUE``), and `transports.registry.register` adds one more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .kernel.options import bounded, check_fields, fields_of, one_of
from .kernel.placements import Reach


@dataclass(frozen=True)
class TransportDescriptor:
    """Everything the plan and the registry know about one transport, without importing it.

    Attributes:
        kind: the transport's name (``transport=<kind>`` in YAML, ``transports/<kind>.py``).
        implementation: ``module:Class`` of its `RequestReplyTransport`, imported on first
            use.
        reach: how far its clients reach from the owner.
        options: the dataclass of its keyword options (``transport_options``): each field is a keyword argument of
            the class, with its one default and its declared range.
        fixed_layout: it preallocates from request and response layouts, which must be known before the server
            starts (or discovered, where a placement has a control channel for it).
        wire: the option that names the wire it rides (``distributed``: ``backend``, gloo or NCCL), shown by plans.
        aliases: other spellings accepted for ``kind``.
        summary: one line for tables and the documentation.
        checks_more: the transport class checks option values beyond their declared ranges too (its
            ``check_options(options, path=...)``, which may import it: ``distributed`` refuses ``nccl`` without CUDA).
    """

    kind: str
    implementation: str
    reach: Reach
    options: type
    fixed_layout: bool = False
    wire: str | None = None
    aliases: tuple[str, ...] = ()
    summary: str = ""
    checks_more: bool = False

    def __post_init__(self):
        if self.wire is not None and self.wire not in fields_of(self.options):
            raise ValueError(f"transport {self.kind!r}: wire option {self.wire!r} is not a field of "
                             f"{self.options.__name__}")

    @property
    def option_names(self) -> tuple[str, ...]:
        """The names of the transport's keyword options, in declaration order."""
        return tuple(fields_of(self.options))

    def defaults(self) -> dict[str, Any]:
        """Every option's default."""
        return {name: f.default for name, f in fields_of(self.options).items()}

    def check(self, options: Mapping[str, Any], *, path: str = "transport_options") -> None:
        """Check ``options`` against `options`: known names, declared ranges.

        Raises:
            ConfigurationError: naming ``<path>.<option>``, the value and what is allowed.
        """
        check_fields(self.options, options, path=path, what=f"transport {self.kind!r}")

    def label(self, options: Mapping[str, Any] | None = None) -> str:
        """The kind as plans print it: with the wire it rides where there is a choice (``distributed (gloo)``)."""
        if self.wire is None:
            return self.kind
        return f"{self.kind} ({(options or {}).get(self.wire, self.defaults()[self.wire])})"


# ---------------------------------------------------------------------------------------------- built-in options
START_METHODS = ("spawn", "forkserver", "fork")


@dataclass(frozen=True)
class DirectOptions:
    """``direct`` takes no options: one slot per client thread, swept by the server thread."""


@dataclass(frozen=True)
class ThreadOptions:
    """Options of ``thread``."""

    max_queue_size: int = bounded(1024, ge=1)  # most pending requests before producers block


@dataclass(frozen=True)
class QueueOptions:
    """Options of ``queue``."""

    max_queue_size: int = bounded(1024, ge=1)  # most requests in flight per client; submit waits beyond it
    context: str = one_of("spawn", START_METHODS)  # multiprocessing start method of the processes involved


@dataclass(frozen=True)
class SlotOptions:
    """Options of the slot transports, ``shared_memory`` and ``process_slot``."""

    num_slots: int = bounded(64, ge=1)  # requests in flight at most (process_slot: client endpoints, one per worker)
    context: str = one_of("spawn", START_METHODS)  # multiprocessing start method of the processes involved


@dataclass(frozen=True)
class ActorCallOptions:
    """Options of the actor-call transports, ``ray`` and ``monarch``."""

    max_queue_size: int = bounded(1024, ge=1)  # most requests waiting inside the hosting actor


@dataclass(frozen=True)
class DistributedOptions:
    """Options of ``distributed``."""

    backend: str = one_of("gloo", ("gloo", "nccl"))  # gloo for CPU tensors, nccl for CUDA tensors
    host: str = "127.0.0.1"  # the address the store and the groups listen on (loopback unless configured)
    port: int = bounded(0, ge=0, le=65535)  # the store's port (0: a free one)
    connect_timeout: float = bounded(30.0, gt=0, unit="seconds")  # a client waits this long for the server to accept
    max_payload_mb: float = bounded(1024.0, gt=0, unit="MiB")  # the largest payload an announced layout may describe


# ---------------------------------------------------------------------------------------------- built-in descriptors
DIRECT = TransportDescriptor(
    "direct", "transports.direct:DirectSlotTransport", Reach.PROCESS, DirectOptions,
    summary="one slot per client thread, swept by a server thread of the same process")
THREAD = TransportDescriptor(
    "thread", "transports.thread:ThreadTransport", Reach.PROCESS, ThreadOptions, aliases=("threading",),
    summary="a bounded in-process queue and one future per request")
QUEUE = TransportDescriptor(
    "queue", "transports.queue.transport:QueueTransport", Reach.MACHINE, QueueOptions,
    aliases=("multiprocessing", "process"),
    summary="pickled payloads of any layout over one local socket per client process")
SHARED_MEMORY = TransportDescriptor(
    "shared_memory", "transports.slots.shared_memory:SharedMemoryTransport", Reach.MACHINE, SlotOptions,
    fixed_layout=True, aliases=("shm",),
    summary="preallocated request/response slots in shared memory; only slot states move")
PROCESS_SLOT = TransportDescriptor(
    "process_slot", "transports.slots.process_slot:ProcessSlotTransport", Reach.MACHINE, SlotOptions, fixed_layout=True,
    summary="one fixed shared-memory slot per worker process, a doorbell, batched sweeps")
RAY = TransportDescriptor(
    "ray", "transports.ray:RayTransport", Reach.NETWORK, ActorCallOptions,
    summary="Ray actor calls to the hosting actor; tensors through the object store")
DISTRIBUTED = TransportDescriptor(
    "distributed", "transports.distributed.transport:DistributedTransport", Reach.NETWORK, DistributedOptions,
    fixed_layout=True, wire="backend", checks_more=True,
    summary="fixed-layout tensors over standalone torch.distributed point-to-point groups (gloo or NCCL)")
MONARCH = TransportDescriptor(
    "monarch", "transports.monarch:MonarchTransport", Reach.NETWORK, ActorCallOptions,
    summary="Monarch actor endpoint calls, answered through response ports")

BUILT_IN: tuple[TransportDescriptor, ...] = (DIRECT, THREAD, QUEUE, SHARED_MEMORY, PROCESS_SLOT, RAY, DISTRIBUTED,
                                             MONARCH)
"""The transports this package ships, in the order tables list them."""
