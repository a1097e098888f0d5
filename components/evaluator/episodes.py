"""Playing whole episodes with a policy: the returns, lengths and (on request) the frames of the first.

What is measured is the game: rewards as the env gives them (a recipe's ``clip_rewards`` is the learner's business),
episodes to their real end (Atari's ``terminal_on_life_loss`` is turned off for evaluation: a game, not a life).
The policy runs in an interaction mode (`components.inference.modes`): ``deterministic`` by default.
"""

from __future__ import annotations

import copy
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import torch
from tensordict import TensorDict

from ..inference.modes import serving


OFF_SCREEN = {"MUJOCO_GL": "egl", "SDL_VIDEODRIVER": "dummy", "SDL_AUDIODRIVER": "dummy"}
"""How envs render without a display when frames are recorded: MuJoCo through EGL (Mesa's software renderer on a
machine without a GPU), pygame (classic control) to memory. Set only where the environment sets none."""


@dataclass
class Evaluation:
    """What an evaluation measured.

    Attributes:
        returns: each episode's return (the sum of the env's own rewards).
        lengths: each episode's steps.
        policy_version: the version of the weights played (``None``: not known).
        frames: the run's frame count the evaluation was asked at (``None``: outside a run).
        seconds: wall-clock seconds it took.
        video: the first episode's frames, ``T x H x W x C`` uint8, where recorded.
        truncated_by_limit: episodes ended by ``max_episode_steps`` rather than by the env.
    """

    returns: list
    lengths: list
    policy_version: int | None = None
    frames: int | None = None
    seconds: float = 0.0
    video: Any = None
    truncated_by_limit: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def mean_return(self) -> float:
        """The mean of the episodes' returns."""
        return float(statistics.fmean(self.returns))

    @property
    def return_std(self) -> float:
        """The population standard deviation of the returns (0 for one episode)."""
        return float(statistics.pstdev(self.returns)) if len(self.returns) > 1 else 0.0

    def metrics(self) -> dict:
        """``eval/...`` scalars as a logger takes them."""
        out = {"eval/mean_return": self.mean_return, "eval/return_std": self.return_std,
               "eval/min_return": float(min(self.returns)), "eval/max_return": float(max(self.returns)),
               "eval/mean_length": float(statistics.fmean(self.lengths)), "eval/episodes": float(len(self.returns))}
        if self.policy_version is not None:
            out["eval/policy_version"] = float(self.policy_version)
        return out

    def summary(self) -> dict:
        """Plain data for JSON: the metrics, the returns and lengths, and where it was taken."""
        return {"frames": self.frames, "policy_version": self.policy_version, "seconds": round(self.seconds, 3),
                "mean_return": self.mean_return, "return_std": self.return_std,
                "returns": [float(r) for r in self.returns], "lengths": [int(n) for n in self.lengths],
                "truncated_by_limit": self.truncated_by_limit}


def evaluation_env_node(env: Mapping[str, Any], render: bool = False) -> dict:
    """The run's ``env`` config as evaluation plays it: whole games (Atari's ``terminal_on_life_loss`` off), on the
    ``gymnasium`` backend (one env, which can render), rendering ``rgb_array`` frames where ``render``."""
    node = copy.deepcopy(dict(env))
    if isinstance(node.get("atari"), Mapping):
        node["atari"] = {**node["atari"], "terminal_on_life_loss": False}
    node["backend"] = "gymnasium"
    if render:
        node["kwargs"] = {**(node.get("kwargs") or {}), "render_mode": "rgb_array"}
        for name, value in OFF_SCREEN.items():  # no display: where the user set none of their own
            os.environ.setdefault(name, value)
    return node


def play(make_env: Callable[[], Any], policy: Callable, episodes: int, seed: int, *, mode: str = "deterministic",
         video: bool = False, max_episode_steps: int | None = None,
         should_stop: Callable[[], bool] | None = None) -> Evaluation:
    """Play ``episodes`` episodes with ``policy`` (a TensorDict policy: ``observation`` -> ``action``).

    Args:
        make_env: returns one gymnasium env (made with ``render_mode="rgb_array"`` where ``video``).
        policy: the policy, called on a TensorDict of one row.
        episodes: how many episodes.
        seed: episode ``i`` resets with ``seed + i``.
        mode: the interaction mode the policy runs in.
        video: record the first episode's frames (the env's ``render()`` after each step).
        max_episode_steps: end an episode after this many steps (``None``: only the env ends it).
        should_stop: polled every step; ``True`` abandons the evaluation (returns what is complete).

    Returns:
        The `Evaluation` (its ``video`` where recorded).
    """
    started = time.monotonic()
    returns, lengths, frames, limited = [], [], None, 0
    env = make_env()
    try:
        for episode in range(episodes):
            result = _episode(env, policy, seed + episode, mode, video and episode == 0, max_episode_steps, should_stop)
            if result is None:
                break
            total, steps, shots, hit_limit = result
            returns.append(total)
            lengths.append(steps)
            limited += hit_limit
            if shots:
                frames = np.stack(shots)
    finally:
        env.close()
    return Evaluation(returns, lengths, seconds=time.monotonic() - started, video=frames, truncated_by_limit=limited)


def _episode(env: Any, policy: Callable, seed: int, mode: str, record: bool, max_steps: int | None,
             should_stop: Callable[[], bool] | None):
    """One episode: ``(return, steps, frames, ended by the limit)``, or ``None`` when ``should_stop`` said so."""
    obs, _ = env.reset(seed=seed)
    space = env.action_space
    low_high = (space.low, space.high) if hasattr(space, "low") and not np.issubdtype(space.dtype, np.integer) else None
    total, steps, shots = 0.0, 0, []
    if record:
        shots.append(_frame(env))
    limit = max_steps if max_steps is not None else math.inf
    with torch.no_grad(), serving(mode):
        while True:
            if should_stop is not None and should_stop():
                return None
            observation = torch.as_tensor(np.asarray(obs))
            if observation.dtype == torch.float64:  # as collectors hand them over (EnvSpec: float32)
                observation = observation.float()
            td = TensorDict({"observation": observation.unsqueeze(0)}, batch_size=[1])
            action = policy(td)["action"][0].cpu().numpy()
            if low_high is not None:
                action = np.clip(action, *low_high)
            elif action.shape == ():
                action = action.item()
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            steps += 1
            if record:
                shots.append(_frame(env))
            if terminated or truncated:
                return total, steps, shots, False
            if steps >= limit:
                return total, steps, shots, True


def _frame(env: Any) -> np.ndarray:
    """The env's current picture as ``H x W x 3`` uint8.

    Raises:
        RuntimeError: the env renders nothing (it was not made with ``render_mode="rgb_array"``).
    """
    frame = env.render()
    if frame is None:
        raise RuntimeError("the evaluation env rendered no frame: it needs render_mode='rgb_array'")
    frame = np.asarray(frame, dtype=np.uint8)
    return frame if frame.ndim == 3 else np.repeat(frame[..., None], 3, axis=-1)
