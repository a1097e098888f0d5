"""Weight sync's place in the compatibility table: versioned state from the learner to inference owners."""

from __future__ import annotations

from .config import WeightSyncConfig
from ..declaration import COMMANDS, DISTRIBUTED, Binding, Cell, Declaration, S, fixed

DECLARATION = Declaration(
    component="weight_sync",
    cells=(
        Cell("weight_sync", "direct", {"direct": S}, fixed("direct", "same process: in-place copies, no serialization")),
        Cell("weight_sync", "thread", {"direct": S}, fixed("direct", "same process: snapshots, copied in place by receivers")),
        Cell("weight_sync", "process", {"shared_memory": S, "distributed": S},
             fixed("shared_memory", "a shared-memory state dict and a version counter")),
        Cell("weight_sync", "ray", {"ray": S, "distributed": S}, fixed("ray", "versions through the Ray object store")),
        Cell("weight_sync", "distributed", {"distributed": S}, DISTRIBUTED),
        Cell("weight_sync", "monarch", {"monarch": S}, fixed("monarch", "versions kept in a Monarch actor")),
    ),
    bindings={
        "direct": Binding(endpoint=None),  # a board in the owner: receivers of its process read it directly
        "shared_memory": Binding(endpoint=None, shared_state=True),  # one segment laid out from a template
        "ray": Binding(endpoint=COMMANDS),  # versions kept in the hosting actor, pushed and polled by calls
        "monarch": Binding(endpoint=COMMANDS),
        "distributed": Binding(endpoint=COMMANDS, payload=True),  # versions over gloo, subscriptions answered
    },
    config=WeightSyncConfig,
)
