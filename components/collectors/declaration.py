"""Collectors' place in the compatibility table. They take no transport of their own: policy calls and replay
writes use the inference and replay endpoints' transports."""

from __future__ import annotations

from typing import Any, Mapping

from ..declaration import Calls, Cell, Declaration, S, require


def check(options: Mapping[str, Any], *, inline: bool = False) -> None:
    """Frames per batch, workers, and how envs split over them (the same checks as :class:`Collector`)."""
    c = "collector"
    frames, workers = options.get("frames_per_batch"), options.get("num_collectors", 1)
    require(c, "num_collectors", workers, isinstance(workers, int) and workers >= 1, ">= 1")
    if frames is not None:
        require(c, "frames_per_batch", frames, frames >= 1, ">= 1")
        require(c, "num_collectors", workers, frames % workers == 0,
                f"a divisor of frames_per_batch={frames} (each worker collects an equal share)")
    envs, groups = options.get("num_envs"), options.get("env_groups", 1)
    require(c, "env_groups", groups, isinstance(groups, int) and groups >= 1, ">= 1")
    if envs is not None:
        require(c, "num_collectors", workers, envs % workers == 0,
                f"a divisor of the recipe's num_envs={envs} (envs are split over workers)")
        require(c, "env_groups", groups, envs % (workers * groups) == 0,
                f"a divisor of the {envs // workers} envs of each worker (the recipe's num_envs={envs} split over "
                f"num_collectors={workers})")
    if inline and workers != 1:
        require(c, "num_collectors", workers, False, "1 for a collector in the caller's thread (use thread, process "
                                                      "or ray placement for more workers)")


DECLARATION = Declaration(
    component="collector",
    cells=(
        Cell("collector", "direct", {}, None, S),
        Cell("collector", "thread", {}, None, S),
        Cell("collector", "process", {}, None, S),
        Cell("collector", "ray", {}, None, S),
        Cell("collector", "distributed", {}, None, S),
        Cell("collector", "submitit", {}, None, S),
        Cell("collector", "rpc", {}, None, S),
        Cell("collector", "monarch", {}, None, S),
    ),
    depends_on=("inference", "replay", "weight_sync"),
    # with local_policy the plan has no inference server: each worker runs a replica fed by weight sync
    calls=(Calls("inference", one_request_per_worker=True), Calls("weight_sync", when="local_policy")),
    check=check,
)
