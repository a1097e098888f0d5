"""Code a user would write in their own package and name in YAML by ``_target_`` (importable by child processes)."""

from __future__ import annotations

import json
import os

import gymnasium as gym
import numpy as np
from torch import nn


def two_layer_net(in_features: int, out_features: int, width: int = 8) -> nn.Module:
    """A network factory with the signature recipes call: ``(in_features, out_features, **kwargs)``."""
    return nn.Sequential(nn.Linear(in_features, width), nn.ReLU(), nn.Linear(width, out_features))


def not_a_module(in_features: int, out_features: int) -> dict:
    return {"in": in_features, "out": out_features}


class Corridor(gym.Env):
    """Walk right for ``length`` steps: reward 1 per step, the episode ends after exactly ``length`` steps.

    Its observation (three features) differs from every built-in env's, so a plan shows whether it was used.
    """

    observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(3,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int = 5):
        self.length = length
        self._t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self._t, self.length - self._t, 1.0], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        return self._obs(), 1.0, self._t >= self.length, False, {}


def make_corridor(length: int = 5) -> gym.Env:
    """An env factory as a user writes one: a plain function returning a single gymnasium env."""
    return Corridor(length)


class NotALogger:
    def __init__(self, log_dir: str = ".", **kwargs):
        self.log_dir = log_dir


class JsonLinesLogger:
    """A logger backend of one's own, with an option of its own: one JSON object per scalar in ``filename``."""

    def __init__(self, log_dir: str = ".", filename: str = "scalars.jsonl"):
        self.log_dir, self.filename = log_dir, filename
        self._file = None

    def open(self) -> None:
        self._file = open(os.path.join(self.log_dir, self.filename), "a")

    def close(self) -> None:
        self._file.close()

    def write_scalar(self, name: str, value: float, step) -> None:
        self._file.write(json.dumps({"name": name, "value": value, "step": step}) + "\n")

    def write_hparams(self, hparams) -> None:
        self._file.write(json.dumps({"hparams": dict(hparams)}) + "\n")

    def flush(self) -> None:
        self._file.flush()


OWN_RECIPE = '''
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from recipes import Loop, Recipe, RecipeConfig


@dataclass
class TinyConfig(RecipeConfig):
    num_steps: int = 8
    total_frames: int = 64
    target_return: Optional[float] = None


class FirstAction(nn.Module):
    """Always the first action, through a weight the learner pushes."""

    def __init__(self, n_actions):
        super().__init__()
        self.logits = nn.Parameter(torch.zeros(n_actions))

    def forward(self, td):
        obs = td.get("observation")
        td.set("action", self.logits.expand(*obs.shape[:-1], -1).argmax(-1))
        return td


def make_policy(cfg, spec):
    return FirstAction(spec.n_actions)


def services(cfg, spec):
    frames = cfg.num_envs * cfg.num_steps
    return {"collector": {"num_envs": cfg.num_envs, "frames_per_batch": frames, "total_frames": cfg.total_frames},
            "replay": {"capacity": frames, "batch_size": frames}}


def run(cfg, clients):
    loop = Loop(cfg, clients)
    policy = make_policy(cfg, clients.env_spec)
    loop.start(policy, policy=policy)
    for batch in loop.batches():
        clients.replay.extend(batch.reshape(-1).select("observation", "action"))
        loop.push(policy)
        if loop.end_batch({"own/rows": len(clients.replay)}):
            break
    return loop.result()


RECIPE = Recipe(name="tiny", config=TinyConfig, make_policy=make_policy, services=services, run=run)


def register():
    return RECIPE


NOT_A_RECIPE = 3
'''
"""The source of a recipe module of one's own (``RECIPE``, also returned by ``register()``), written outside the
repository and named ``+recipe=<module>:RECIPE``."""
