"""What a component declares next to its code: its placements and transports (with their status and the
``auto`` rule), how it uses each transport (`Binding`), what it depends on, whose clients it calls, and how
its options are checked.

Each service package has a ``declaration.py`` holding one `Declaration`; `components.compat`
assembles them into the one compatibility table. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping

from transports.resolver import TransportContext

from .config import ComponentConfig

SUPPORTED = "supported"
NOT_YET = "not implemented yet"
S, N = SUPPORTED, NOT_YET

AutoRule = Callable[[TransportContext], "tuple[str, str]"]


def fixed(kind: str, reason: str) -> AutoRule:
    """An ``auto`` rule that always picks ``kind``."""
    return lambda ctx: (kind, reason)


DIRECT = fixed("direct", "owner in the caller's process: plain calls, no serialization")
THREAD = fixed("thread", "owner on a thread: in-process queue and condition")
RAY = fixed("ray", "Ray owner: Ray calls and the object store (distributed is opt-in)")
DISTRIBUTED = fixed("distributed", "torch.distributed owner: point-to-point gloo/NCCL groups")
MONARCH = fixed("monarch", "Monarch owner: actor endpoint calls, answered through response ports")


@dataclass(frozen=True)
class Cell:
    """One (component, placement) entry: the transports it takes, their status, and the ``auto`` rule.

    A component that takes no transport of its own (collectors) has no transports and no rule; ``note`` then
    holds its status. ``discovers_layouts``: the placement has a control channel through which fixed layouts are
    discovered on first use, so they need not be known before the owner starts.
    """

    component: str
    placement: str
    transports: Mapping[str, str]
    auto: AutoRule | None
    note: str = ""
    discovers_layouts: bool = False

    @property
    def takes_transport(self) -> bool:
        """Whether the component takes a transport of its own in this placement (it has an ``auto`` rule)."""
        return self.auto is not None

    @property
    def built(self) -> bool:
        """Whether this placement is built for at least one transport (or, without transports, at all)."""
        if not self.takes_transport:
            return self.note != NOT_YET
        return any(status == SUPPORTED for status in self.transports.values())


SELF = "self"
"""A `Binding` endpoint: requests travel over a request/reply transport of the resolved kind itself."""
COMMANDS = "commands"
"""A `Binding` endpoint: requests travel as commands over the hosting placement's own command transport
(``Host.command_transport``), while bulk payloads ride the resolved kind beside it (``payload``)."""


@dataclass(frozen=True)
class Binding:
    """How a component uses one transport kind: declared beside its cells, read by its owner instead of the kind.

    Attributes:
        endpoint: what carries the component's requests: `SELF` (a request/reply transport of the resolved
            kind), `COMMANDS` (the host's command transport), another kind by name (``queue``), or ``None``
            (no endpoint: clients reach the resource itself, in this process or in shared memory).
        payload: bulk payloads ride a transport of the resolved kind beside the endpoint (replay's tensors, weight
            versions), built from the resolved options.
        shared_state: the resource's state lives in shared memory that clients attach to by name (a replay storage,
            a weight-sync state dict laid out from a template).
    """

    endpoint: str | None = SELF
    payload: bool = False
    shared_state: bool = False


DEFAULT_BINDING = Binding()
"""A kind a component declares nothing about: its requests ride a request/reply transport of that kind."""


@dataclass(frozen=True)
class Calls:
    """An edge: this component's owner (or its workers) calls the client of ``service``, so ``service``'s
    transport must reach where this component is placed. ``when``: only if this option is set (neither ``None`` nor
    ``False``).
    ``one_request_per_worker``: each worker keeps one request in flight (steers ``service``'s ``auto``)."""

    service: str
    when: str | None = None
    one_request_per_worker: bool = False


@dataclass(frozen=True)
class Declaration:
    """Everything the table and the plan know about one component.

    Attributes:
        component: its name (``components.<name>`` in YAML).
        cells: one `Cell` per placement it can take.
        depends_on: components whose clients it is built with: started (ready) before it, stopped after it.
        calls: components whose clients it calls from where it is placed.
        first: started before (and so stopped after) every other component, whatever the dependencies: a logger
            records the others' teardown.
        layouts_up_front: its fixed-layout transports need request and response layouts before it starts (a
            replay buffer's layout, by contrast, is bound by its first write).
        check: ``check(config, inline=...)`` raises `ConfigurationError` naming
            ``components.<name>.<option>``, the value and what is allowed, for what the config's own ranges and
            rules cannot say (``inline``: the owner lives in the caller's thread); the owner's constructor runs the
            same.
        default_placement: where it lives when nothing says otherwise.
        bindings: how it uses each transport kind that is not `DEFAULT_BINDING` (see `binding`).
        config: its config dataclass (`components.config.ComponentConfig` or a subclass): ``components.<name>``
            in YAML and what its owner is built from.
    """

    component: str
    cells: tuple[Cell, ...]
    depends_on: tuple[str, ...] = ()
    calls: tuple[Calls, ...] = ()
    first: bool = False
    layouts_up_front: bool = False
    check: Callable[..., None] | None = None
    default_placement: str = "direct"
    bindings: Mapping[str, Binding] = field(default_factory=dict)
    config: type = ComponentConfig

    def binding(self, kind: str) -> Binding:
        """How this component uses transport ``kind`` (`DEFAULT_BINDING` unless declared otherwise)."""
        return self.bindings.get(kind, DEFAULT_BINDING)
