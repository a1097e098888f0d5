"""The collector's config (``components.collector`` in YAML): where its workers run, how many, and how they split
the recipe's envs. The recipe states the batch it needs (``num_envs``, ``frames_per_batch``, ``total_frames``) and
the plan sets those fields; constructing one checks its values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from transports.kernel.options import bounded

from ..config import ComponentConfig


@dataclass
class CollectorConfig(ComponentConfig):
    """Where collector workers run and what each collects. Collectors take no transport of their own: their
    payloads use the inference and replay endpoints' transports, so ``transport`` stays unset.

    Attributes:
        num_collectors: workers; each collects ``frames_per_batch / num_collectors`` frames of every batch.
        sync: ``True``: every batch is collected after the weights the learner pushed before asking for it;
            ``False``: workers collect the next batch while the learner trains on this one (policy lag <= 1).
        env_groups: vector envs per worker, stepped in turn: with 2, one group's policy request is in flight while
            the other group steps (faster beside a server process; the server then batches half-size requests
            together or apart, so a seeded run is no longer bit-reproducible across placements).
        local_policy: each worker runs its own copy of the policy (weights from weight sync before each step) and
            no inference server starts; workers then scale with cores like a raw env loop, without batching
            across workers.
        prefetch: with ``sync: false``, rollouts in flight per worker, the one the driver asked for included. Where
            the worker runs apart from the driver (thread, process, Ray...) the driver asks for the next rollout as
            it takes one: with 1 a worker collects its next rollout while the learner trains on this one, with
            ``k`` (on a thread of its own) up to ``k``, so a learner whose update takes ``k`` rounds of every
            worker's rollouts finds them all waiting, at up to ``k - 1`` more versions of policy lag. On the
            ``direct`` placement the driver asks when it needs the next: ``k`` collects ``k - 1`` while it trains.
        frames_per_batch: environment steps per batch, summed over every env of every worker (set by the recipe).
        total_frames: stop after this many frames; ``-1`` iterates until shut down (set by the recipe).
        num_envs: environments over all workers, split evenly between them (set by the recipe).

    Examples:
        >>> CollectorConfig(placement="process", num_collectors=2, frames_per_batch=512, total_frames=100_000)
    """

    component: ClassVar[str] = "collector"

    num_collectors: int = bounded(1, ge=1)  # collector workers (one or more vector envs each)
    sync: bool = True  # false: workers collect the next batch while the learner trains on this one (policy lag <= 1)
    env_groups: int = bounded(1, ge=1)  # vector envs per worker, stepped in turn (2: double buffering)
    local_policy: bool = False  # true: a policy replica in each worker, no inference server
    prefetch: int = bounded(1, ge=1)  # sync false: rollouts in flight per worker (collected ahead)
    frames_per_batch: Optional[int] = bounded(None, ge=1)  # frames per batch over all workers (set by the recipe)
    total_frames: int = bounded(-1, ge=-1)  # stop after this many frames; -1: until shut down (set by the recipe)
    num_envs: Optional[int] = bounded(None, ge=1)  # envs over all workers (set by the recipe)

    def rules(self) -> tuple[tuple[str, bool, str], ...]:
        rules = []
        workers, groups, frames, envs = self.num_collectors, self.env_groups, self.frames_per_batch, self.num_envs
        rules.append(("prefetch", not self.sync or self.prefetch == 1,
                      f"{self.path}.prefetch={self.prefetch} needs sync: false (a synchronous collector collects each "
                      "batch after the weights pushed before it, so nothing ahead)"))
        if frames is not None:
            rules.append(("num_collectors", frames % workers == 0,
                          f"{self.path}.num_collectors must be a divisor of frames_per_batch={frames} (each worker "
                          f"collects an equal share), got {workers!r}"))
        if envs is not None:
            rules.append(("num_collectors", envs % workers == 0,
                          f"{self.path}.num_collectors must be a divisor of the recipe's num_envs={envs} (envs are "
                          f"split over workers), got {workers!r}"))
            if envs % workers == 0:
                rules.append(("env_groups", envs % (workers * groups) == 0,
                              f"{self.path}.env_groups must be a divisor of the {envs // workers} envs of each worker "
                              f"(the recipe's num_envs={envs} split over num_collectors={workers}), got {groups!r}"))
        return tuple(rules)
