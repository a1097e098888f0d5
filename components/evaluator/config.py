"""``components.evaluator``: where the evaluator lives and what it plays (`EvaluatorConfig`). Plain data:
nothing heavy is imported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from transports.kernel.options import bounded, one_of

from ..config import ComponentConfig


@dataclass
class EvaluatorConfig(ComponentConfig):
    """Evaluation while training: episodes of the newest policy in envs of the evaluator's own, off the learner's path.

    Attributes:
        eval_every: evaluate whenever the run has collected this many more frames (``None``: no evaluator).
        episodes: episodes per evaluation.
        mode: the policy's interaction mode: ``deterministic`` (its most likely actions) or ``random`` (sampled).
        video: record the first episode of each evaluation as a video, logged through the logger.
        video_fps: frames per second of the video.
        max_episode_steps: most steps of an episode (``None``: the env's own limit), so a policy that never ends an
            episode cannot stall evaluation.
        seed: the seed of the first episode's env (episode ``i`` gets ``seed + i``): every evaluation plays the same
            starts.

    Examples:
        >>> EvaluatorConfig(placement="process", eval_every=50_000, episodes=10, video=True)
    """

    component: ClassVar[str] = "evaluator"

    eval_every: Optional[int] = bounded(None, ge=1)  # frames between evaluations (None: off)
    episodes: int = bounded(10, ge=1)  # episodes per evaluation
    mode: str = one_of("deterministic", ("deterministic", "random"))  # the policy's interaction mode
    video: bool = False  # record the first episode of each evaluation
    video_fps: int = bounded(30, ge=1)  # frames per second of the video
    max_episode_steps: Optional[int] = bounded(None, ge=1)  # most steps of an episode (None: the env's limit)
    seed: int = bounded(1_000_000, ge=0)  # the first episode's env seed
