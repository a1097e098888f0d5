"""The compatibility table: the single source of truth for what runs where, assembled from what each
component declares next to its code (``components/<service>/declaration.py``).

Validation, the plan, ``python -m launcher.matrix``, the README table and the tests all read this table;
nothing else decides whether a combination is valid. A combination outside the table is rejected everywhere
(the dry run included) with an `IncompatibleCombinationError` naming the component, placement,
transport, config path and the supported alternatives. A combination inside the table that is not built yet
plans and prints (marked), and fails before anything starts when run, with `NotImplementedYetError`.
"""

from __future__ import annotations

import importlib
from typing import Mapping

from transports.config import TransportConfig
from transports.kernel.errors import IncompatibleCombinationError, NotImplementedYetError
from transports.kinds import transport_kinds
from transports.resolver import Resolution, TransportContext

from .hosts import HOSTS
from .declaration import NOT_YET, SUPPORTED, Cell, Declaration

DECLARING_MODULES: tuple[str, ...] = (
    "components.logger.declaration",
    "components.weight_sync.declaration",
    "components.replay.declaration",
    "components.inference.declaration",
    "components.collectors.declaration",
    "components.evaluator.declaration",
)
"""Where the table is read from: one declaration module per service (a new service adds its line here). Their
order is the table's, and breaks ties in the start order."""

NO_TRANSPORT = "-"
"""Shown as the transport of components that take none (collectors use their endpoints' transports)."""


def _assemble() -> dict[str, Declaration]:
    declarations = {}
    for module in DECLARING_MODULES:
        declaration = importlib.import_module(module).DECLARATION
        declarations[declaration.component] = declaration
    return declarations


DECLARATIONS: dict[str, Declaration] = _assemble()
"""component -> its `Declaration`, in table order."""
COMPONENTS: tuple[str, ...] = tuple(DECLARATIONS)


class _Table(Mapping):
    """``(component, placement) -> Cell``, read from `DECLARATIONS` on every lookup (so the table is always
    what the declarations say)."""

    def __getitem__(self, key: tuple[str, str]) -> Cell:
        declared = DECLARATIONS.get(key[0])
        found = [cell for cell in (declared.cells if declared is not None else ()) if (cell.component, cell.placement) == key]
        if not found:
            raise KeyError(key)
        return found[0]

    def __iter__(self):
        return ((c.component, c.placement) for d in DECLARATIONS.values() for c in d.cells)

    def __len__(self) -> int:
        return sum(len(d.cells) for d in DECLARATIONS.values())


TABLE: Mapping[tuple[str, str], Cell] = _Table()
"""The compatibility table: every declared cell."""


def declaration(component: str) -> Declaration:
    """The `Declaration` of ``component``.

    Raises:
        IncompatibleCombinationError: no such component.
    """
    try:
        return DECLARATIONS[component]
    except KeyError:
        raise IncompatibleCombinationError(f"unknown component {component!r}", alternatives=COMPONENTS) from None


def placements_of(component: str) -> tuple[str, ...]:
    """Placements the table lists for ``component`` (built or not)."""
    declaration(component)
    return tuple(p for p in HOSTS if (component, p) in TABLE)


def transports_of(component: str) -> tuple[str, ...]:
    """Every transport kind ``component`` takes in some placement (its transport vocabulary)."""
    kinds = {k for cell in declaration(component).cells for k in cell.transports}
    return tuple(k for k in transport_kinds() if k in kinds)


def get_cell(component: str, placement: str, *, path: str | None = None, origin: str | None = None) -> Cell:
    """The table entry for ``component`` at ``placement``.

    Raises:
        IncompatibleCombinationError: the component has no such placement.
    """
    declaration(component)
    cell = TABLE.get((component, placement))
    if cell is None:
        planned = [p for p in placements_of(component) if not TABLE[(component, p)].built]
        raise IncompatibleCombinationError(
            f"{component} cannot be placed on {placement!r}{_from(origin)}"
            + (f" (planned, not built yet: {', '.join(planned)})" if planned else ""),
            path=path,
            alternatives=built_placements(component),
        )
    return cell


def built_placements(component: str) -> tuple[str, ...]:
    """Placements where ``component`` runs today (a built cell)."""
    return tuple(p for p in placements_of(component) if TABLE[(component, p)].built)


def _from(origin: str | None) -> str:
    return f" (the value came from {origin})" if origin and origin not in ("explicit", "default") else ""


def resolve(
    component: str,
    requested: str | TransportConfig | None,
    context: TransportContext,
    *,
    placement_explicit: bool = True,
) -> Resolution:
    """Resolve the transport of ``component`` at ``context.placement``.

    An explicit choice (``context.origin`` is ``None`` or ``"explicit"``) must fit. A broad default (a
    ``transport_backend`` scope, or ``transport=X`` for the whole plan; ``context.origin`` names it) applies to
    the components that take it: a kind the component never takes, or (when the component's placement was
    chosen explicitly, so the default was not meant for it) a kind this placement does not take, resolves
    ``auto`` and the reason says so; a kind it takes elsewhere but not at a placement that came from the same
    broad defaults is an error.

    Raises:
        IncompatibleCombinationError: the combination is outside the table.
    """
    config = requested if isinstance(requested, TransportConfig) else TransportConfig(requested or "auto")
    broad = context.origin not in (None, "explicit", "default")
    cell = get_cell(component, context.placement)
    if not cell.takes_transport:
        if config.kind != "auto" and not broad:
            raise IncompatibleCombinationError(
                f"{component} takes no transport (got {config.kind!r}): its policy calls and replay writes use the "
                "inference and replay endpoints' transports",
                path=context.path,
                alternatives=("auto",),
            )
        return Resolution(NO_TRANSPORT, {}, "collectors use their endpoints' transports")
    if config.kind == "auto":
        kind, reason = cell.auto(context)
        return Resolution(kind, dict(config.options), f"auto: {reason}")
    if config.kind not in cell.transports:
        if broad and config.kind not in transports_of(component):
            kind, reason = cell.auto(context)
            return Resolution(kind, {}, f"auto ({component} never uses {config.kind!r}): {reason}")
        if broad and placement_explicit:
            kind, reason = cell.auto(context)
            return Resolution(kind, {}, f"auto ({config.kind!r} does not apply on {context.placement!r}): {reason}")
        raise IncompatibleCombinationError(
            f"{component} placed on {context.placement!r} does not support transport {config.kind!r}"
            f"{_from(context.origin)}",
            path=context.path,
            alternatives=("auto", *cell.transports),
        )
    if broad and cell.transports[config.kind] != SUPPORTED:  # the plan-wide default is not built here: say so
        kind, reason = cell.auto(context)
        return Resolution(kind, {}, f"auto ({config.kind!r} is not built yet for {component} on "
                                    f"{context.placement!r}): {reason}")
    return Resolution(config.kind, dict(config.options), f"from {context.origin}" if broad else "explicit")


def status(component: str, placement: str, kind: str) -> str:
    """`SUPPORTED` or `NOT_YET` for a resolved combination (``kind`` may be ``-``)."""
    cell = get_cell(component, placement)
    if not cell.takes_transport:
        return cell.note
    return cell.transports[kind]


def ensure_built(component: str, placement: str, kind: str, *, path: str | None = None) -> None:
    """Raise `NotImplementedYetError` when the resolved combination is not built yet, naming ``path`` and
    the placements built for the component."""
    if status(component, placement, kind) != SUPPORTED:
        over = "" if kind == NO_TRANSPORT else f" over transport {kind!r}"
        raise NotImplementedYetError(f"{component} placed on {placement!r}{over} is not implemented yet",
                                     path=path, alternatives=built_placements(component))


# ---------------------------------------------------------------------------------------------- rendering
def matrix_rows() -> list[tuple[str, str, str, str]]:
    """(component, placement, transports with status, auto) for every cell, in table order."""
    rows = []
    for component in COMPONENTS:
        for placement in HOSTS:
            cell = TABLE.get((component, placement))
            if cell is None:
                rows.append((component, placement, "rejected", ""))
                continue
            if not cell.takes_transport:
                mark = "" if cell.note == SUPPORTED else " (not yet)"
                rows.append((component, placement, f"none: uses its endpoints' transports{mark}", NO_TRANSPORT))
                continue
            kinds = ", ".join(k if s == SUPPORTED else f"{k} (not yet)" for k, s in cell.transports.items())
            rows.append((component, placement, kinds, _auto_text(cell)))
    return rows


_AUTO_CASES = (("layouts known", {"layouts_known": True}),
               ("one request in flight per worker", {"layouts_known": True, "one_request_per_worker": True}))
"""What may change ``auto``'s answer, least specific first."""


def _auto_text(cell: Cell) -> str:
    """What ``auto`` resolves to in each case that changes its answer, most specific first
    (``process_slot (one request in flight per worker), shared_memory (layouts known), else queue``)."""
    plain = previous = cell.auto(TransportContext(cell.placement))[0]
    parts = []
    for condition, context in _AUTO_CASES:
        kind = cell.auto(TransportContext(cell.placement, **context))[0]
        if kind != previous:
            parts.insert(0, f"{kind} ({condition})")
            previous = kind
    return ", ".join([*parts, f"else {plain}"]) if parts else plain


def render_markdown() -> str:
    """The table as Markdown: the README holds exactly this between its matrix markers."""
    lines = [
        "| component | placement | transports | auto resolves to |",
        "|---|---|---|---|",
    ]
    for component, placement, kinds, auto in matrix_rows():
        lines.append(f"| {component} | {placement} | {kinds} | {auto or '-'} |")
    return "\n".join(lines)


__all__ = ["COMPONENTS", "DECLARATIONS", "NOT_YET", "NO_TRANSPORT", "SUPPORTED", "TABLE", "Cell", "Declaration",
           "declaration", "ensure_built", "get_cell", "matrix_rows", "placements_of", "render_markdown", "resolve",
           "status", "transports_of"]
