"""Collectors: environment instances and the rollout loop.

A collector steps vector environments against a policy (usually an inference client) and yields batches
shaped ``[time, env]``. Collectors take no transport of their own: policy calls go over the inference
endpoint's transport and, with a replay buffer attached, writes go over the replay endpoint's transport.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import gymnasium as gym
import torch
from tensordict import TensorDict, TensorDictBase

from transports.errors import ConfigurationError

from .envs import VectorEnvStepper
from .service import Owner


class Collector(Owner["Collector"]):
    """Steps vector envs with a policy and yields ``[frames_per_batch // num_envs, num_envs]`` batches.

    Args:
        create_env_fn: a picklable callable returning a vector env with same-step autoreset
            (see :func:`components.envs.make_vector_env`); called where the collector lives.
        policy: a callable TensorDict policy (an inference client, a ``PolicyClientModule``...).
        frames_per_batch: environment steps (summed over envs) per yielded batch.
        total_frames: stop after this many frames; ``-1`` iterates until shut down.
        placement: where the collector lives; ``None`` takes the ``service_backend`` context, else ``direct``.
        replay_buffer: a replay client; when given, batches are written there and iteration yields
            the number of frames written instead.
        seed: base seed; env ``i`` gets ``seed + i``.

    Example:
        >>> collector = Collector(partial(make_vector_env, "CartPole-v1", 8), policy, 256, 10_000).start()
        >>> for batch in collector:
        ...     batch.batch_size
        torch.Size([32, 8])
    """

    component = "collector"

    def __init__(
        self,
        create_env_fn: Callable[[], gym.vector.VectorEnv],
        policy: Callable[[TensorDictBase], TensorDictBase],
        frames_per_batch: int,
        total_frames: int = -1,
        *,
        placement: str | None = None,
        replay_buffer: Any = None,
        seed: int = 0,
    ):
        super().__init__(placement=placement)
        if frames_per_batch < 1:
            raise ConfigurationError(f"frames_per_batch must be >= 1, got {frames_per_batch!r}")
        self.create_env_fn = create_env_fn
        self.policy = policy
        self.frames_per_batch = frames_per_batch
        self.total_frames = total_frames
        self.replay_buffer = replay_buffer
        self.seed = seed
        self.frames = 0
        self._stepper: VectorEnvStepper | None = None

    def _start(self) -> None:
        env = self.create_env_fn()
        if self.frames_per_batch % env.num_envs:
            env.close()
            raise ConfigurationError(
                f"frames_per_batch={self.frames_per_batch} is not a multiple of num_envs={env.num_envs}"
            )
        self._stepper = VectorEnvStepper(env, self.seed)

    def _shutdown(self, timeout: float | None) -> None:
        if self._stepper is not None:
            self._stepper.close()
            self._stepper = None

    @property
    def env_spec(self):
        self._require_running()
        return self._stepper.spec

    # ------------------------------------------------------------------ domain operations
    def rollout(self) -> TensorDict:
        """Collect one batch of ``frames_per_batch`` frames, shaped ``[time, env]``."""
        self._require_running()
        stepper = self._stepper
        steps = []
        for _ in range(self.frames_per_batch // stepper.num_envs):
            td = self.policy(stepper.observation())
            steps.append(stepper.step(td))
        batch = torch.stack(steps, dim=0)
        self.frames += self.frames_per_batch
        return batch

    def __iter__(self) -> Iterator[TensorDict | int]:
        while self.total_frames < 0 or self.frames < self.total_frames:
            batch = self.rollout()
            if self.replay_buffer is not None:
                yield self.replay_buffer.extend(batch.reshape(-1))
            else:
                yield batch
