"""What the rest of the system knows about an environment, as plain data: its spaces (`EnvSpec`), read from
gymnasium's, and the leaves one step writes under ``next``."""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from transports.kernel.errors import ConfigurationError
from transports.layout import Layout


@dataclass(frozen=True)
class EnvSpec:
    """What the rest of the system needs to know about an environment, as picklable data.

    Attributes:
        env_id: the gymnasium id.
        observation_shape: shape of one observation.
        observation_dtype: torch dtype of observations.
        discrete: whether actions are integers in ``[0, n_actions)``.
        n_actions: number of discrete actions (0 when continuous).
        action_shape: shape of one action (``()`` when discrete).
        action_low: lower bounds of continuous actions.
        action_high: upper bounds of continuous actions.
        observation_scale: what one step of an integer observation is worth (``1 / 255`` for frames, 1 for
            byte grids and floats): networks multiply integer observations by it.
        encoder: the built-in encoder the env's family prefers for ``recipe.encoder=auto``
            (`components.envs.family.EnvFamily.encoder`); ``None``: chosen from the observation's shape.
    """

    env_id: str
    observation_shape: tuple[int, ...]
    observation_dtype: torch.dtype
    discrete: bool
    n_actions: int
    action_shape: tuple[int, ...]
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    observation_scale: float = 1.0
    encoder: str | None = None

    @property
    def action_dtype(self) -> torch.dtype:
        """``torch.long`` for discrete actions, ``torch.float32`` for continuous ones."""
        return torch.long if self.discrete else torch.float32

    def request_layout(self, num_envs: int) -> Layout:
        """The policy request one vector step sends: observations of ``num_envs`` envs."""
        return Layout.from_tensordict(
            TensorDict(
                {"observation": torch.zeros((num_envs, *self.observation_shape), dtype=self.observation_dtype)},
                batch_size=[num_envs],
            )
        )


_TORCH_DTYPES = {np.dtype("float32"): torch.float32, np.dtype("float64"): torch.float32, np.dtype("uint8"): torch.uint8,
                 np.dtype("bool"): torch.uint8}
"""Observation dtypes on the wire and in replay: pixels and MinAtar's boolean grids travel as one byte per value (the
policy scales them), everything else as float32."""


def spec_from_spaces(env_id: str, obs_space: gym.Space, act_space: gym.Space, *, path: str = "env.id") -> EnvSpec:
    """Build an `EnvSpec` from one env's observation and action spaces.

    Args:
        env_id: the name the spec carries.
        obs_space: the observation space (a Box).
        act_space: the action space (Discrete or Box).
        path: the config that named the env (errors name it).

    Raises:
        ConfigurationError: the spaces are not Box/Discrete.
    """
    if not isinstance(obs_space, gym.spaces.Box):
        raise ConfigurationError(f"env {env_id!r}: only Box observation spaces are supported, got {obs_space}",
                                 path=path)
    obs_dtype = _TORCH_DTYPES.get(np.dtype(obs_space.dtype), torch.float32)
    high = float(np.max(obs_space.high)) if obs_dtype == torch.uint8 and obs_space.shape else 1.0
    scale = 1.0 / high if high > 0 else 1.0
    if isinstance(act_space, gym.spaces.Discrete):
        return EnvSpec(env_id, tuple(obs_space.shape), obs_dtype, True, int(act_space.n), (), observation_scale=scale)
    if isinstance(act_space, gym.spaces.Box):
        return EnvSpec(
            env_id,
            tuple(obs_space.shape),
            obs_dtype,
            False,
            0,
            tuple(act_space.shape),
            tuple(float(x) for x in np.ravel(act_space.low)),
            tuple(float(x) for x in np.ravel(act_space.high)),
            observation_scale=scale,
        )
    raise ConfigurationError(f"env {env_id!r}: only Discrete or Box action spaces are supported, got {act_space}",
                             path=path)


NEXT_KEYS = ("observation", "reward", "terminated", "truncated", "done", "episode_return", "episode_length")
"""What one step writes under ``next``, in this order."""


def next_storage(spec: EnvSpec, shape: tuple[int, ...]) -> TensorDict:
    """Uninitialized ``next`` leaves for transitions of batch shape ``shape`` (a rollout's ``[time, env]``).

    Args:
        spec: the env's spec.
        shape: the batch shape.

    Returns:
        A TensorDict of `NEXT_KEYS`.
    """
    dtypes = (spec.observation_dtype, torch.float32, torch.bool, torch.bool, torch.bool, torch.float32, torch.long)
    return TensorDict({key: torch.empty((*shape, *(spec.observation_shape if key == "observation" else ())),
                                        dtype=dtype) for key, dtype in zip(NEXT_KEYS, dtypes)}, batch_size=shape)
