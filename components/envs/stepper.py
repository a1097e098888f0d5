"""A collector's stepping of a vector env: each step's ``next`` written into arrays the caller owns, with the
episode return and length tracked per env."""

from __future__ import annotations

from typing import Any, Mapping

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from .spec import NEXT_KEYS, next_storage, spec_from_spaces


class VectorEnvStepper:
    """Steps a gymnasium vector env, writing each step's ``next`` into arrays the caller owns (no per-step objects).

    The current observations and the running episode statistics live here as numpy arrays; `step_into` writes
    one step at an index of preallocated ``[time, env]`` arrays (see `next_storage`), `step` is the
    convenience form that fills ``td["next"]``.

    Args:
        env: a vector env using same-step autoreset (see `components.envs.make.make_vector_env`).
        seed: seeds env ``i`` with ``seed + i`` so every env (and every worker given its own ``seed``) differs.
    """

    def __init__(self, env: gym.vector.VectorEnv, seed: int):
        self.env = env
        env_id = env.spec.id if env.spec is not None else type(env).__name__
        self.spec = spec_from_spaces(env_id, env.single_observation_space, env.single_action_space)
        self.num_envs = env.num_envs
        obs, _ = env.reset(seed=[seed + i for i in range(self.num_envs)])
        env.action_space.seed(seed)
        np_dtype = torch.empty((), dtype=self.spec.observation_dtype).numpy().dtype
        self.obs = np.array(obs, dtype=np_dtype)  # our own copy: vector envs may reuse their buffers
        self._episode_return = np.zeros(self.num_envs, dtype=np.float32)
        self._episode_length = np.zeros(self.num_envs, dtype=np.int64)
        self._clip = None
        if not self.spec.discrete:
            self._clip = (np.asarray(self.spec.action_low, dtype=np.float32).reshape(self.spec.action_shape),
                          np.asarray(self.spec.action_high, dtype=np.float32).reshape(self.spec.action_shape))

    def observation(self) -> TensorDict:
        """A copy of the current observations as a ``[num_envs]`` TensorDict."""
        return TensorDict({"observation": torch.from_numpy(self.obs.copy())}, batch_size=[self.num_envs])

    def step_into(self, action: np.ndarray, nxt: Mapping[str, np.ndarray], index: Any) -> None:
        """Apply ``action`` (``[num_envs, ...]``) and write the step's ``next`` leaves at ``index`` of each array of
        ``nxt`` (keyed by `NEXT_KEYS`; ``index`` selects ``num_envs`` rows, e.g. ``(t, slice(a, b))``).

        ``observation`` is the final one where an episode ended (the env itself carries on from its reset
        observation, see `obs`); ``episode_return`` / ``episode_length`` are complete where ``done``.
        """
        if self._clip is not None:
            action = np.clip(action, *self._clip)
        obs, reward, terminated, truncated, info = self.env.step(action)
        nxt["reward"][index] = reward
        nxt["terminated"][index] = terminated
        nxt["truncated"][index] = truncated
        done = np.logical_or(terminated, truncated, out=nxt["done"][index])
        next_obs = nxt["observation"][index]  # a view: the rows of this step
        next_obs[...] = obs
        self._episode_return += reward
        self._episode_length += 1
        nxt["episode_return"][index] = self._episode_return
        nxt["episode_length"][index] = self._episode_length
        self.obs[...] = obs
        if done.any():
            for i in np.flatnonzero(info["_final_obs"]):
                next_obs[i] = info["final_obs"][i]
            self._episode_return[done] = 0.0
            self._episode_length[done] = 0

    def step(self, td: TensorDict) -> TensorDict:
        """Apply ``td["action"]``; fill ``td["next", ...]`` (see `step_into`) and return ``td``."""
        nxt = next_storage(self.spec, (self.num_envs,))
        self.step_into(td.get("action").numpy(force=True), {k: nxt.get(k).numpy() for k in NEXT_KEYS}, slice(None))
        td.set("next", nxt)
        return td

    def close(self) -> None:
        """Close the vector env."""
        self.env.close()
