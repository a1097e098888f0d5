"""The gymnasium adapter: vector environments stepped into TensorDicts, and env specs as plain data.

Steps use gymnasium's same-step autoreset: when an episode ends, ``("next", "observation")`` holds the
episode's final observation (for bootstrapping on truncation) while the observation carried into the next
step is already the reset one. Episode return and length are tracked per env.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from transports.errors import ConfigurationError
from transports.layout import Layout

from .targets import instantiate_target


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
    """

    env_id: str
    observation_shape: tuple[int, ...]
    observation_dtype: torch.dtype
    discrete: bool
    n_actions: int
    action_shape: tuple[int, ...]
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()

    @property
    def action_dtype(self) -> torch.dtype:
        return torch.long if self.discrete else torch.float32

    def request_layout(self, num_envs: int) -> Layout:
        """The policy request one vector step sends: observations of ``num_envs`` envs."""
        return Layout.from_tensordict(
            TensorDict(
                {"observation": torch.zeros((num_envs, *self.observation_shape), dtype=self.observation_dtype)},
                batch_size=[num_envs],
            )
        )


_TORCH_DTYPES = {np.dtype("float32"): torch.float32, np.dtype("float64"): torch.float32, np.dtype("uint8"): torch.uint8}


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """``gymnasium.make`` with a config-friendly error for unknown ids."""
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.Error as exc:
        raise ConfigurationError(f"cannot make gymnasium env {env_id!r}: {exc}", path="env.id") from exc


def spec_of(env_id: str, **kwargs: Any) -> EnvSpec:
    """Read an :class:`EnvSpec` from a throwaway instance of the env (closed before returning).

    Raises:
        ConfigurationError: the env id is unknown, or its spaces are not Box/Discrete.
    """
    env = make_env(env_id, **kwargs)
    try:
        return spec_from_spaces(env_id, env.observation_space, env.action_space)
    finally:
        env.close()


def spec_from_spaces(env_id: str, obs_space: gym.Space, act_space: gym.Space, *, path: str = "env.id") -> EnvSpec:
    """Build an :class:`EnvSpec` from one env's observation and action spaces (``path``: the config that named it)."""
    if not isinstance(obs_space, gym.spaces.Box):
        raise ConfigurationError(f"env {env_id!r}: only Box observation spaces are supported, got {obs_space}",
                                 path=path)
    obs_dtype = _TORCH_DTYPES.get(np.dtype(obs_space.dtype), torch.float32)
    if isinstance(act_space, gym.spaces.Discrete):
        return EnvSpec(env_id, tuple(obs_space.shape), obs_dtype, True, int(act_space.n), ())
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
        )
    raise ConfigurationError(f"env {env_id!r}: only Discrete or Box action spaces are supported, got {act_space}",
                             path=path)


def make_vector_env(env_id: str, num_envs: int, **kwargs: Any) -> gym.vector.VectorEnv:
    """A synchronous vector env with same-step autoreset."""
    return gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        **kwargs,
    )


class EnvMaker:
    """Makes one environment as the ``env`` config says: ``gymnasium.make(id, **kwargs)``, or your own callable
    ``_target_(**kwargs) -> gymnasium.Env``. Plain data, so it pickles: collectors make their envs where they run.

    Args:
        id: a registered gymnasium id (``CartPole-v1``).
        _target_: instead of ``id``, the dotted name of a callable that returns one gymnasium env.
        kwargs: keyword arguments of ``gymnasium.make``, or of the ``_target_`` callable.

    Raises:
        ConfigurationError: neither or both of ``id`` and ``_target_`` are set.

    Example:
        >>> EnvMaker(_target_="my_envs.make_maze", kwargs={"size": 5}).vector(8)   # a SyncVectorEnv of 8 mazes
    """

    def __init__(self, id: str | None = None, _target_: str | None = None, kwargs: Mapping[str, Any] | None = None):
        if id is not None and _target_ is not None:
            raise ConfigurationError(f"env.id={id!r} and env._target_={_target_!r} both name an environment: keep one "
                                     "(e.g. env.id=null)", path="env")
        if id is None and _target_ is None:
            raise ConfigurationError("no environment: set env.id (a gymnasium id) or env._target_ (a callable that "
                                     "returns one gymnasium env)", path="env.id")
        self.id, self.target, self.kwargs = id, _target_, dict(kwargs or {})

    @classmethod
    def from_config(cls, node: Any) -> "EnvMaker":
        """From the ``env`` config node (a DictConfig or a mapping of ``id``, ``_target_``, ``kwargs``).

        Raises:
            ConfigurationError: the node holds other keys, or neither or both of ``id`` and ``_target_``.
        """
        from omegaconf import OmegaConf

        data = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
        unknown = sorted(set(data) - {"id", "_target_", "kwargs"})
        if unknown:
            raise ConfigurationError(f"env: unknown keys {unknown}; the callable's arguments go under env.kwargs",
                                     path=f"env.{unknown[0]}", alternatives=("id", "_target_", "kwargs"))
        return cls(**data)

    @property
    def name(self) -> str:
        """The gymnasium id, or the callable's dotted name."""
        return self.id if self.id is not None else self.target

    def __call__(self) -> gym.Env:
        """One environment."""
        if self.id is not None:
            return make_env(self.id, **self.kwargs)
        return instantiate_target({"_target_": self.target, **self.kwargs}, "env", expect=gym.Env)

    def spec(self) -> EnvSpec:
        """The :class:`EnvSpec`, read from a throwaway instance (closed before returning)."""
        env = self()
        try:
            return spec_from_spaces(self.name, env.observation_space, env.action_space,
                                    path="env.id" if self.id is not None else "env._target_")
        finally:
            env.close()

    def vector(self, num_envs: int) -> gym.vector.VectorEnv:
        """``num_envs`` environments in one synchronous vector env with same-step autoreset."""
        if self.id is not None:
            return make_vector_env(self.id, num_envs, **self.kwargs)
        return gym.vector.SyncVectorEnv([self] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)

    def __repr__(self) -> str:
        return f"EnvMaker({self.name!r}, kwargs={self.kwargs!r})"


class VectorEnvStepper:
    """Steps a gymnasium vector env with TensorDict actions and returns TensorDict transitions.

    Args:
        env: a vector env using same-step autoreset (see :func:`make_vector_env`).
        seed: seeds env ``i`` with ``seed + i`` so every env (and every worker given its own ``seed``) differs.
    """

    def __init__(self, env: gym.vector.VectorEnv, seed: int):
        self.env = env
        env_id = env.spec.id if env.spec is not None else type(env).__name__
        self.spec = spec_from_spaces(env_id, env.single_observation_space, env.single_action_space)
        self.num_envs = env.num_envs
        obs, _ = env.reset(seed=[seed + i for i in range(self.num_envs)])
        env.action_space.seed(seed)
        self._obs = self._to_tensor(obs)
        self._episode_return = torch.zeros(self.num_envs)
        self._episode_length = torch.zeros(self.num_envs, dtype=torch.long)

    def _to_tensor(self, obs: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(obs, dtype=self.spec.observation_dtype)

    def observation(self) -> TensorDict:
        """The current observations as a ``[num_envs]`` TensorDict."""
        return TensorDict({"observation": self._obs}, batch_size=[self.num_envs])

    def step(self, td: TensorDict) -> TensorDict:
        """Apply ``td["action"]``; fill ``td["next", ...]`` and return ``td``.

        ``next`` holds observation (the final one where an episode ended), reward, terminated, truncated, done,
        and the running episode_return / episode_length (complete where done is true).
        """
        action = td.get("action")
        np_action = action.numpy()
        if not self.spec.discrete:
            np_action = np.clip(np_action, self.spec.action_low, self.spec.action_high)
        obs, reward, terminated, truncated, info = self.env.step(np_action)
        reward_t = torch.as_tensor(reward, dtype=torch.float32)
        term_t = torch.as_tensor(terminated)
        trunc_t = torch.as_tensor(truncated)
        done_t = term_t | trunc_t
        next_obs = self._to_tensor(obs)
        final_obs = next_obs
        if done_t.any():
            final_obs = next_obs.clone()
            mask = info["_final_obs"]
            for i in np.flatnonzero(mask):
                final_obs[i] = self._to_tensor(info["final_obs"][i])
        self._episode_return += reward_t
        self._episode_length += 1
        td.set(
            "next",
            TensorDict(
                {
                    "observation": final_obs,
                    "reward": reward_t,
                    "terminated": term_t,
                    "truncated": trunc_t,
                    "done": done_t,
                    "episode_return": self._episode_return.clone(),
                    "episode_length": self._episode_length.clone(),
                },
                batch_size=[self.num_envs],
            ),
        )
        self._episode_return[done_t] = 0.0
        self._episode_length[done_t] = 0
        self._obs = next_obs
        return td

    def close(self) -> None:
        self.env.close()


EnvFactory = Callable[[], gym.vector.VectorEnv]
