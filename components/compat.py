"""The compatibility table: the single source of truth for what runs where.

Every component declares, per placement, which transports it supports, the status of each (built, or
"not implemented yet"), and what ``auto`` resolves to. Validation, the plan, ``python -m launcher.matrix``,
the README table and the tests all read this table; nothing else decides whether a combination is valid.

A combination outside the table is rejected everywhere (the dry run included) with an
:class:`IncompatibleCombinationError` naming the component, placement, transport, config path and the
supported alternatives. A combination inside the table that is not built yet plans and prints (marked),
and fails before anything starts when run, with :class:`NotImplementedYetError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from transports.config import TransportConfig
from transports.errors import IncompatibleCombinationError, NotImplementedYetError
from transports.kinds import PLACEMENTS, TRANSPORT_KINDS
from transports.resolver import Resolution, TransportContext, register_transport_resolver

SUPPORTED = "supported"
NOT_YET = "not implemented yet"

COMPONENTS: tuple[str, ...] = ("inference", "replay", "logger", "collector", "weight_sync")
NO_TRANSPORT = "-"
"""Shown as the transport of components that take none (collectors use their endpoints' transports)."""

AutoRule = Callable[[TransportContext], "tuple[str, str]"]


@dataclass(frozen=True)
class Cell:
    """One (component, placement) entry: the transports it takes, their status, and the ``auto`` rule."""

    component: str
    placement: str
    transports: Mapping[str, str]
    auto: AutoRule | None
    note: str = ""

    @property
    def takes_transport(self) -> bool:
        return self.auto is not None

    @property
    def built(self) -> bool:
        """Whether this placement is built for at least one transport (or, without transports, at all)."""
        if not self.takes_transport:
            return self.note != NOT_YET
        return any(status == SUPPORTED for status in self.transports.values())


def _fixed(kind: str, reason: str) -> AutoRule:
    return lambda ctx: (kind, reason)


def _process_payloads(ctx: TransportContext) -> tuple[str, str]:
    if ctx.layouts_known and ctx.one_request_per_worker:
        return "process_slot", "process owner, known layouts, one request in flight per worker: one fixed slot each"
    if ctx.layouts_known:
        return "shared_memory", "process owner with known layouts: preallocated shared-memory slots, only indices travel"
    return "queue", "process owner without fixed layouts: pickled payloads over a local socket per client"


def _process_replay(ctx: TransportContext) -> tuple[str, str]:
    if ctx.layouts_known:
        return "shared_memory", "process owner with known layouts: storage in shared memory, samples without pickling"
    return "queue", "process owner without fixed layouts: pickled payloads over a local socket per client"


_DIRECT = _fixed("direct", "owner in the caller's process: plain calls, no serialization")
_THREAD = _fixed("thread", "owner on a thread: in-process queue and condition")
_RAY = _fixed("ray", "Ray owner: Ray calls and the object store (distributed is opt-in)")
_DIST = _fixed("distributed", "torch.distributed owner: point-to-point gloo/NCCL groups")

S, N = SUPPORTED, NOT_YET


def _cells() -> dict[tuple[str, str], Cell]:
    rows = [
        # inference: batched request/reply
        Cell("inference", "direct", {"direct": S}, _DIRECT),
        Cell("inference", "thread", {"thread": S, "direct": S}, _THREAD),
        Cell(
            "inference",
            "process",
            {"queue": S, "shared_memory": S, "process_slot": S, "distributed": N},
            _process_payloads,
        ),
        Cell("inference", "ray", {"ray": S, "distributed": N}, _RAY),
        Cell("inference", "distributed", {"distributed": N}, _DIST),
        # replay: extend / sample / priority updates
        Cell("replay", "direct", {"direct": S}, _DIRECT),
        Cell("replay", "thread", {"thread": S}, _THREAD),
        Cell("replay", "process", {"queue": S, "shared_memory": S, "distributed": N}, _process_replay),
        Cell("replay", "ray", {"ray": S, "distributed": N}, _RAY),
        Cell("replay", "distributed", {"distributed": N}, _DIST),
        # logger: acknowledged commands, possibly carrying videos
        Cell("logger", "direct", {"direct": S}, _DIRECT),
        Cell("logger", "thread", {"thread": S}, _THREAD),
        Cell("logger", "process", {"queue": S}, _fixed("queue", "commands and videos of any shape: pickled over local sockets")),
        Cell("logger", "ray", {"ray": S}, _RAY),
        Cell("logger", "distributed", {"distributed": N}, _fixed("distributed", "rank-0 logger; commands as text over gloo")),
        # collectors take no transport: policy calls and replay writes use those endpoints' transports
        Cell("collector", "direct", {}, None, SUPPORTED),
        Cell("collector", "thread", {}, None, S),
        Cell("collector", "process", {}, None, S),
        Cell("collector", "ray", {}, None, S),
        Cell("collector", "distributed", {}, None, N),
        Cell("collector", "submitit", {}, None, N),
        # weight sync: versioned state from the learner to inference owners and collectors
        Cell("weight_sync", "direct", {"direct": S}, _fixed("direct", "same process: in-place copies, no serialization")),
        Cell("weight_sync", "thread", {"direct": S}, _fixed("direct", "same process: snapshots, copied in place by receivers")),
        Cell(
            "weight_sync",
            "process",
            {"shared_memory": S},
            _fixed("shared_memory", "a shared-memory state dict and a version counter"),
        ),
        Cell("weight_sync", "ray", {"ray": S, "distributed": N}, _fixed("ray", "versions through the Ray object store")),
        Cell("weight_sync", "distributed", {"distributed": N}, _DIST),
    ]
    return {(c.component, c.placement): c for c in rows}


TABLE: Mapping[tuple[str, str], Cell] = _cells()


def _check_component(component: str) -> None:
    if component not in COMPONENTS:
        raise IncompatibleCombinationError(f"unknown component {component!r}", alternatives=COMPONENTS)


def placements_of(component: str) -> tuple[str, ...]:
    """Placements the table lists for ``component`` (built or not)."""
    _check_component(component)
    return tuple(p for p in PLACEMENTS if (component, p) in TABLE)


def transports_of(component: str) -> tuple[str, ...]:
    """Every transport kind ``component`` takes in some placement (its transport vocabulary)."""
    _check_component(component)
    kinds = {k for (c, _), cell in TABLE.items() if c == component for k in cell.transports}
    return tuple(k for k in TRANSPORT_KINDS if k in kinds)


def get_cell(component: str, placement: str, *, path: str | None = None, origin: str | None = None) -> Cell:
    """The table entry for ``component`` at ``placement``.

    Raises:
        IncompatibleCombinationError: the component has no such placement.
    """
    _check_component(component)
    cell = TABLE.get((component, placement))
    if cell is None:
        raise IncompatibleCombinationError(
            f"{component} cannot be placed on {placement!r}{_from(origin)}",
            path=path,
            alternatives=placements_of(component),
        )
    return cell


def _from(origin: str | None) -> str:
    return f" (the value came from {origin})" if origin and origin not in ("explicit", "default") else ""


def resolve(
    component: str,
    requested: str | TransportConfig | None,
    context: TransportContext,
    *,
    strict: bool = True,
    lenient: bool = False,
) -> Resolution:
    """Resolve the transport of ``component`` at ``context.placement``.

    Args:
        component: a name from :data:`COMPONENTS`.
        requested: a kind, a :class:`TransportConfig`, or ``None``/``"auto"``.
        context: placement and what is known about payloads; ``path``/``origin`` go into messages.
        strict: an explicit choice must be valid. With ``strict=False`` (a broad default such as
            ``transport=shared_memory`` for the whole plan), a kind the component never takes falls back to
            ``auto`` and the reason says so; a kind it takes elsewhere but not here is still an error.
        lenient: with ``strict=False``, fall back to ``auto`` for any kind this cell does not take (used when
            the component's placement was set explicitly, so a plan-wide transport must not break it).

    Raises:
        IncompatibleCombinationError: the combination is outside the table.
    """
    config = requested if isinstance(requested, TransportConfig) else TransportConfig(requested or "auto")
    cell = get_cell(component, context.placement, origin=None)
    if not cell.takes_transport:
        if config.kind != "auto" and strict:
            raise IncompatibleCombinationError(
                f"{component} takes no transport (got {config.kind!r}{_from(context.origin)}): its policy calls and "
                "replay writes use the inference and replay endpoints' transports",
                path=context.path,
                alternatives=("auto",),
            )
        return Resolution(NO_TRANSPORT, {}, "collectors use their endpoints' transports")
    if config.kind == "auto":
        kind, reason = cell.auto(context)
        return Resolution(kind, dict(config.options), f"auto: {reason}")
    if config.kind not in cell.transports:
        if not strict and config.kind not in transports_of(component):
            kind, reason = cell.auto(context)
            return Resolution(kind, {}, f"auto ({component} never uses {config.kind!r}): {reason}")
        if not strict and lenient:
            kind, reason = cell.auto(context)
            return Resolution(kind, {}, f"auto ({config.kind!r} does not apply on {context.placement!r}): {reason}")
        raise IncompatibleCombinationError(
            f"{component} placed on {context.placement!r} does not support transport {config.kind!r}"
            f"{_from(context.origin)}",
            path=context.path,
            alternatives=("auto", *cell.transports),
        )
    return Resolution(config.kind, dict(config.options), "explicit" if strict else f"from {context.origin}")


def status(component: str, placement: str, kind: str) -> str:
    """:data:`SUPPORTED` or :data:`NOT_YET` for a resolved combination (``kind`` may be ``-``)."""
    cell = get_cell(component, placement)
    if not cell.takes_transport:
        return cell.note
    return cell.transports[kind]


def ensure_built(component: str, placement: str, kind: str) -> None:
    """Raise :class:`NotImplementedYetError` when the resolved combination is not built yet."""
    if status(component, placement, kind) != SUPPORTED:
        over = "" if kind == NO_TRANSPORT else f" over transport {kind!r}"
        raise NotImplementedYetError(f"{component} placed on {placement!r}{over} is not implemented yet")


def _register() -> None:
    for component in COMPONENTS:
        if component == "collector":
            continue

        def resolver(config: TransportConfig, context: TransportContext, _c=component) -> Resolution:
            return resolve(_c, config, context)

        register_transport_resolver(component, resolver, replace=True)


_register()


# ---------------------------------------------------------------------------------------------- rendering


def matrix_rows() -> list[tuple[str, str, str, str]]:
    """(component, placement, transports with status, auto) for every cell, in table order."""
    rows = []
    for component in COMPONENTS:
        for placement in PLACEMENTS:
            cell = TABLE.get((component, placement))
            if cell is None:
                rows.append((component, placement, "rejected", ""))
                continue
            if not cell.takes_transport:
                mark = "" if cell.note == SUPPORTED else " (not yet)"
                rows.append((component, placement, f"none: uses its endpoints' transports{mark}", NO_TRANSPORT))
                continue
            kinds = ", ".join(k if s == SUPPORTED else f"{k} (not yet)" for k, s in cell.transports.items())
            layouts = TransportContext(placement, layouts_known=True)
            plain = TransportContext(placement, layouts_known=False)
            auto_known, auto_plain = cell.auto(layouts), cell.auto(plain)
            auto = auto_known[0] if auto_known[0] == auto_plain[0] else f"{auto_known[0]} (layouts known), else {auto_plain[0]}"
            rows.append((component, placement, kinds, auto))
    return rows


def render_markdown() -> str:
    """The table as Markdown: the README holds exactly this between its matrix markers."""
    lines = [
        "| component | placement | transports | auto resolves to |",
        "|---|---|---|---|",
    ]
    for component, placement, kinds, auto in matrix_rows():
        lines.append(f"| {component} | {placement} | {kinds} | {auto or '-'} |")
    return "\n".join(lines)
