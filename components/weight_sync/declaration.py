"""Weight sync's place in the compatibility table: versioned state from the learner to inference owners."""

from __future__ import annotations

from ..declaration import DISTRIBUTED, Cell, Declaration, S, fixed

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
)
