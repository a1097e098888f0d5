"""What a recipe is: a config dataclass, a policy factory, the services it needs, and ``run``.

A recipe never starts, stops or chooses anything about placement or transport: the launcher reads its
:class:`Recipe` declaration, builds the services, and calls ``run(config, clients)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol


class Progress(Protocol):
    """A live progress display the launcher hands to recipes."""

    def update(self, frames: int, **metrics: float) -> None: ...


@dataclass
class Clients:
    """Everything a recipe gets: clients of the running services and the facts it needs.

    Attributes:
        policy: the inference client: a callable TensorDict policy (``observation`` -> ``action``, ...).
        collector: iterable of ``[time, env]`` batches collected with ``policy``.
        replay: the replay-buffer client (``extend``, ``sample``, ``len``...).
        logger: the logger client (``log_scalar``, ``log_metrics``, ``log_hparams``).
        weight_sync: the weight-sync client (``push``), wired to the inference server.
        env_spec: the environment's spaces as data (:class:`components.envs.EnvSpec`).
        progress: the live progress line.
        seed: the run's seed.
    """

    policy: Callable
    collector: Iterable
    replay: Any
    logger: Any
    weight_sync: Any
    env_spec: Any
    progress: Progress
    seed: int = 0


@dataclass(frozen=True)
class Recipe:
    """A recipe's declaration.

    Attributes:
        name: the recipe's name (``conf/recipe/<name>.yaml``).
        config: its config dataclass (every field documented).
        make_policy: ``make_policy(config, env_spec) -> nn.Module``, the behaviour policy the inference
            server owns (built where the server lives).
        services: ``services(config, env_spec) -> {component: options}``: what the recipe needs of each service
            (collector frames per batch, replay capacity and sampler...).
        run: ``run(config, clients) -> dict`` trains and returns the result (see :func:`result`).
    """

    name: str
    config: type
    make_policy: Callable
    services: Callable[[Any, Any], Mapping[str, Mapping[str, Any]]]
    run: Callable[[Any, Clients], Mapping[str, Any]]
    needs: tuple[str, ...] = field(default=("logger", "weight_sync", "replay", "inference", "collector"))
