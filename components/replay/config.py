"""The replay buffer's config (``components.replay`` in YAML): where the buffer lives, its storage and its sampler.
A recipe states what it needs of the buffer (PPO: one batch, sampled without replacement; DQN: a prioritized buffer
of ``buffer_size``), and the plan sets those fields; constructing one checks its values."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, List, Optional

from transports.kernel.options import bounded, one_of

from ..config import ComponentConfig

SAMPLERS = ("uniform", "without_replacement", "prioritized", "fifo")
STORAGES = ("memory", "memmap")


@dataclass
class ReplayConfig(ComponentConfig):
    """Where the buffer lives, what it holds and how it samples.

    Attributes:
        capacity: most transitions held; the oldest are overwritten first.
        sampler: ``uniform``, ``without_replacement`` (each stored transition once per epoch), ``prioritized``, or
            ``fifo`` (a learner queue: each item once, oldest first; ``len`` counts those not sampled yet).
        batch_size: the default ``sample()`` size.
        storage: ``memory``, or ``memmap`` (files under ``scratch_dir``).
        scratch_dir: directory of the memory-mapped storage (``memmap`` only).
        alpha: prioritized sampling exponent.
        beta: importance-weight exponent.
        max_policy_lag: drop transitions acted by a policy more than this many versions behind the live one, at
            sampling time (``None``: keep every one).
        frames: keys (``next.observation`` for nested ones) whose values are frame stacks ``[stack, *frame]``,
            stored one frame at a time and rebuilt at sampling (`components.replay.frames`); DQN on pixels
            sets ``[observation, next.observation]``. Empty: every leaf is stored as it is.

    Examples:
        >>> ReplayConfig(capacity=100_000, sampler="prioritized", batch_size=256)
    """

    component: ClassVar[str] = "replay"

    capacity: int = bounded(100_000, ge=1)  # most transitions held; the oldest are overwritten first
    sampler: str = one_of("uniform", SAMPLERS)  # uniform | without_replacement | prioritized | fifo
    batch_size: int = bounded(256, ge=1)  # the default sample() size
    storage: str = one_of("memory", STORAGES)  # memory | memmap (files under scratch_dir)
    scratch_dir: Optional[str] = None  # directory of a memmap storage
    alpha: float = bounded(0.6, ge=0)  # prioritized sampling exponent
    beta: float = bounded(0.4, ge=0)  # importance-weight exponent
    max_policy_lag: Optional[int] = bounded(None, ge=0)  # drop transitions of policies this many versions behind
    frames: List[str] = field(default_factory=list)  # frame-stack keys stored frame by frame (next.observation...)

    def rules(self) -> tuple[tuple[str, bool, str], ...]:
        return (("scratch_dir", self.storage != "memmap" or bool(self.scratch_dir),
                 f"{self.path}.scratch_dir must be a directory for storage 'memmap', got {self.scratch_dir!r}"),)
