"""What runs where a collector worker lives: one rollout loop over one vector env."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from transports.errors import ConfigurationError

from ..envs import VectorEnvStepper


class Worker:
    """Steps one vector env with ``policy`` and hands back ``[time, env]`` rollouts (or writes them to replay).

    Args:
        create_env_fn: picklable callable returning a vector env with same-step autoreset.
        policy: a callable TensorDict policy (an inference client...).
        frames: frames per rollout (a multiple of the env's ``num_envs``).
        seed: seeds env ``i`` with ``seed + i``.
        replay_buffer: a replay client; rollouts are written there and :meth:`collect` returns the count.
    """

    def __init__(self, create_env_fn, policy, frames: int, seed: int, replay_buffer=None):
        env = create_env_fn()
        if frames % env.num_envs:
            env.close()
            raise ConfigurationError(
                f"frames per worker ({frames}) is not a multiple of num_envs={env.num_envs}",
                path="components.collector",
            )
        self.stepper = VectorEnvStepper(env, seed)
        self.policy, self.steps, self.replay = policy, frames // env.num_envs, replay_buffer

    def rollout(self) -> TensorDict:
        stepper, steps = self.stepper, []
        for _ in range(self.steps):
            steps.append(stepper.step(self.policy(stepper.observation())))
        return torch.stack(steps, dim=0)

    def collect(self) -> TensorDict | int:
        """One rollout, or (with a replay buffer) the number of frames written there."""
        batch = self.rollout()
        return batch if self.replay is None else len(self.replay.extend(batch.reshape(-1)))

    def spec(self):
        """The environment's :class:`~components.envs.EnvSpec`."""
        return self.stepper.spec

    def close(self) -> None:
        self.stepper.close()
