"""The inference server's place in the compatibility table: batched request/reply."""

from __future__ import annotations

from transports.resolver import TransportContext

from ..declaration import DIRECT, DISTRIBUTED, MONARCH, RAY, THREAD, Calls, Cell, Declaration, N, S
from .config import InferenceServerConfig


def _process_auto(ctx: TransportContext) -> tuple[str, str]:
    if ctx.layouts_known and ctx.one_request_per_worker:
        return "process_slot", "process owner, known layouts, one request in flight per worker: one fixed slot each"
    if ctx.layouts_known:
        return "shared_memory", "process owner with known layouts: preallocated shared-memory slots, only indices travel"
    return "queue", "process owner without fixed layouts: pickled payloads over a local socket per client"


def check(config: InferenceServerConfig, *, inline: bool = False) -> None:
    """What the config's own rules cannot say: static batches need a serving loop (an inline owner, `direct`, has
    none)."""
    config.check_placement("direct", inline=inline)


DECLARATION = Declaration(
    component="inference",
    cells=(
        Cell("inference", "direct", {"direct": S}, DIRECT),
        Cell("inference", "thread", {"thread": S, "direct": S, "distributed": S}, THREAD),
        Cell("inference", "process", {"queue": S, "shared_memory": S, "process_slot": S, "distributed": S}, _process_auto),
        Cell("inference", "ray", {"ray": S, "distributed": S}, RAY, discovers_layouts=True),
        Cell("inference", "distributed", {"distributed": N}, DISTRIBUTED),
        Cell("inference", "monarch", {"monarch": S}, MONARCH),
    ),
    depends_on=("weight_sync",),
    calls=(Calls("weight_sync"),),
    layouts_up_front=True,
    config=InferenceServerConfig,
    check=check,
)
