"""What runs where a collector worker lives: one rollout loop over one vector env."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from transports.errors import ConfigurationError

from ..envs import VectorEnvStepper
from ..inference.sampling import SAMPLE_SEED, env_streams, mix, step_seeds


class Worker:
    """Steps one vector env with ``policy`` and hands back ``[time, env]`` rollouts (or writes them to replay).

    Args:
        create_env_fn: picklable callable returning a vector env with same-step autoreset.
        policy: a callable TensorDict policy (an inference client...).
        frames: frames per rollout (a multiple of the env's ``num_envs``).
        seed: seeds env ``i`` with ``seed + i``; its policy requests carry sampling seeds from a stream keyed by
            ``seed + i`` too (see :mod:`components.inference.sampling`), so its actions do not depend on batching.
        replay_buffer: a replay client; rollouts are written there and :meth:`collect` returns the count.
        rollouts_done: rollouts this worker's place in the run made before it started (a resumed run, a restarted
            worker): the sampling streams continue from there, and the envs reset from a seed drawn from ``seed``
            and that count, so they do not replay the run's first episodes.
    """

    def __init__(self, create_env_fn, policy, frames: int, seed: int, replay_buffer=None, rollouts_done: int = 0):
        env = create_env_fn()
        if frames % env.num_envs:
            env.close()
            raise ConfigurationError(
                f"frames per worker ({frames}) is not a multiple of num_envs={env.num_envs}",
                path="components.collector",
            )
        self.policy, self.steps, self.replay = policy, frames // env.num_envs, replay_buffer
        self.stepper = VectorEnvStepper(env, reset_seed(seed, rollouts_done))
        self.streams = env_streams(range(seed, seed + env.num_envs))
        self.step_count = rollouts_done * self.steps

    def rollout(self) -> TensorDict:
        stepper, steps = self.stepper, []
        seeds = step_seeds(self.streams, self.step_count, self.steps)
        self.step_count += self.steps
        for t in range(self.steps):
            request = stepper.observation()
            request.set(SAMPLE_SEED, seeds[t].clone())  # its own storage: a view would carry the whole rollout's
            td = self.policy(request)
            td.pop(SAMPLE_SEED, None)  # the rollout holds what the policy and the env produced
            steps.append(stepper.step(td))
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


def reset_seed(seed: int, rollouts_done: int) -> int:
    """The seed a worker's envs reset from: ``seed`` on a fresh start, else one drawn from ``seed`` and the rollouts
    done (non-negative, as gymnasium wants)."""
    if not rollouts_done:
        return seed
    return int(mix(mix(torch.tensor(seed, dtype=torch.int64)) + rollouts_done)) & 0x7FFFFFFF
