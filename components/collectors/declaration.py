"""Collectors' place in the compatibility table. They take no transport of their own: policy calls and replay
writes use the inference and replay endpoints' transports."""

from __future__ import annotations

from transports.kernel.errors import ConfigurationError

from ..declaration import Calls, Cell, Declaration, S
from .config import CollectorConfig


def check(config: CollectorConfig, *, inline: bool = False) -> None:
    """What the config's own ranges and rules cannot say: a collector in the caller's thread has one worker."""
    if inline and config.num_collectors != 1:
        raise ConfigurationError(f"{config.path}.num_collectors must be 1 for a collector in the caller's thread (use "
                                 f"thread, process or ray placement for more workers), got {config.num_collectors!r}",
                                 path=f"{config.path}.num_collectors")


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
    config=CollectorConfig,
)
