"""The replay buffer's place in the compatibility table: extend / sample / priority updates."""

from __future__ import annotations

from typing import Any, Mapping

from transports.resolver import TransportContext

from ..declaration import DIRECT, DISTRIBUTED, MONARCH, RAY, THREAD, Calls, Cell, Declaration, N, S, require

SAMPLERS = ("uniform", "without_replacement", "prioritized")
STORAGES = ("memory", "memmap")


def _process_auto(ctx: TransportContext) -> tuple[str, str]:
    if ctx.layouts_known:
        return "shared_memory", "process owner with known layouts: storage in shared memory, samples without pickling"
    return "queue", "process owner without fixed layouts: pickled payloads over a local socket per client"


def check(options: Mapping[str, Any], *, inline: bool = False) -> None:
    """Capacity, sampler, batch size and storage (the same checks as :class:`ReplayBuffer`)."""
    c = "replay"
    if "capacity" in options:
        require(c, "capacity", options["capacity"], options["capacity"] >= 1, ">= 1")
    if "batch_size" in options:
        require(c, "batch_size", options["batch_size"], options["batch_size"] >= 1, ">= 1")
    if "sampler" in options:
        require(c, "sampler", options["sampler"], options["sampler"] in SAMPLERS, f"one of {', '.join(SAMPLERS)}")
    if "storage" in options:
        require(c, "storage", options["storage"], options["storage"] in STORAGES, f"one of {', '.join(STORAGES)}")
        require(c, "scratch_dir", options.get("scratch_dir"),
                options["storage"] != "memmap" or bool(options.get("scratch_dir")), "a directory for storage 'memmap'")
    for name in ("alpha", "beta"):
        if options.get(name) is not None:
            require(c, name, options[name], options[name] >= 0, ">= 0")
    if options.get("max_policy_lag") is not None:
        require(c, "max_policy_lag", options["max_policy_lag"], options["max_policy_lag"] >= 0, ">= 0")


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
    check=check,
)
