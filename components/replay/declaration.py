"""The replay buffer's place in the compatibility table: extend / sample / priority updates."""

from __future__ import annotations

from transports.resolver import TransportContext

from ..declaration import COMMANDS, DIRECT, DISTRIBUTED, MONARCH, RAY, THREAD, Binding, Calls, Cell, Declaration, N, S
from .config import ReplayConfig


def _process_auto(ctx: TransportContext) -> tuple[str, str]:
    if ctx.layouts_known:
        return "shared_memory", "process owner with known layouts: storage in shared memory, samples without pickling"
    return "queue", "process owner without fixed layouts: pickled payloads over a local socket per client"


DECLARATION = Declaration(
    component="replay",
    cells=(
        Cell("replay", "direct", {"direct": S}, DIRECT),
        Cell("replay", "thread", {"thread": S}, THREAD),
        Cell("replay", "process", {"queue": S, "shared_memory": S, "distributed": S}, _process_auto),
        Cell("replay", "ray", {"ray": S, "distributed": S}, RAY),
        Cell("replay", "distributed", {"distributed": N}, DISTRIBUTED),
        Cell("replay", "monarch", {"monarch": S}, MONARCH),
    ),
    depends_on=("weight_sync",),
    calls=(Calls("weight_sync", when="max_policy_lag"),),
    config=ReplayConfig,
    bindings={
        # commands over a local socket; the storage itself in shared memory, so samples come back without pickling
        "shared_memory": Binding(endpoint="queue", shared_state=True),
        # commands over the placement's own channel, the tensors of extend / sample / update_priority over gloo
        "distributed": Binding(endpoint=COMMANDS, payload=True),
    },
)
