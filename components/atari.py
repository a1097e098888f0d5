"""Atari from pixels: the DeepMind preprocessing as one config, built the same way on every env backend.

``env=atari`` sets ``env.atari`` (an :class:`AtariConfig`); each backend then builds its envs from it with its own
library's implementation of the same steps:

- ``gymnasium``: ``gymnasium.make(id, frameskip=1, ...)`` wrapped in gymnasium's ``AtariPreprocessing`` (no-op
  starts, frame skip with max-pooling of the last two frames, 84x84 grey) and ``FrameStackObservation``;
- ``ale_vector``: ale-py's ``AtariVectorEnv``, a threaded C++ vector env doing the same preprocessing;
- ``envpool``: EnvPool's Atari pool, likewise.

Every backend gives observations of ``(stack, screen_size, screen_size)`` uint8 and the game's own rewards: an
episode's return is the game score, and a recipe that learns from clipped rewards clips them itself
(``recipe.clip_rewards``). No backend presses FIRE at reset or ends an episode on a lost life unless
``terminal_on_life_loss`` says so, so all three play the same game.

The dataclass is plain data (the schema imports it); the builders import gymnasium and ale-py when called.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from transports.kernel.errors import ConfigurationError
from transports.kernel.options import bounded


@dataclass
class AtariConfig:
    """The DeepMind preprocessing of Atari frames (Mnih et al. 2015; Machado et al. 2018 for sticky actions).

    Attributes:
        noop_max: at most this many no-op actions after a reset (a random number of them), so starts differ.
        frame_skip: emulator frames per agent step (the action repeats; the observation is the max of the last two).
        screen_size: observations are resized to ``screen_size x screen_size`` grey.
        stack: the observation is the last ``stack`` frames.
        repeat_action_probability: sticky actions: the emulator repeats the previous action with this probability
            at each frame (0.25 is ALE v5's default).
        terminal_on_life_loss: end an episode on every lost life (returns are then per life, not per game).
        max_episode_frames: an episode is truncated after this many emulator frames (108,000: 30 minutes of play).
    """

    noop_max: int = bounded(30, ge=0)
    frame_skip: int = bounded(4, ge=1)
    screen_size: int = bounded(84, ge=8)
    stack: int = bounded(4, ge=1)
    repeat_action_probability: float = bounded(0.25, ge=0, le=1)
    terminal_on_life_loss: bool = False
    max_episode_frames: int = bounded(108_000, ge=1, unit="frames")

    @classmethod
    def of(cls, value: "AtariConfig | Mapping[str, Any] | None") -> "AtariConfig | None":
        if value is None or isinstance(value, cls):
            return value
        return cls(**dict(value))


def game_of(env_id: str) -> str:
    """The ROM name of an ALE id: ``ALE/MsPacman-v5`` -> ``ms_pacman`` (what ``AtariVectorEnv`` takes)."""
    match = re.fullmatch(r"(?:ALE/)?([A-Za-z0-9]+?)(?:NoFrameskip)?-v\d+", env_id)
    if match is None:
        raise ConfigurationError(f"env.id={env_id!r} is not an Atari id (ALE/<Game>-v5, e.g. ALE/Breakout-v5)",
                                 path="env.id")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", match[1]).lower()


def envpool_id(env_id: str) -> str:
    """EnvPool's id of an ALE id: ``ALE/Breakout-v5`` -> ``Breakout-v5``."""
    camel = "".join(part.title() for part in game_of(env_id).split("_"))
    return f"{camel}-v5"


PREPROCESSING: dict[str, dict[str, str | None]] = {
    "gymnasium": {"frameskip": "frame_skip", "repeat_action_probability": "repeat_action_probability",
                  "max_num_frames_per_episode": "max_episode_frames"},
    "ale_vector": {"frameskip": "frame_skip", "stack_num": "stack", "img_height": "screen_size",
                   "img_width": "screen_size", "noop_max": "noop_max", "maxpool": None, "grayscale": None,
                   "repeat_action_probability": "repeat_action_probability", "episodic_life": "terminal_on_life_loss",
                   "reward_clipping": None, "use_fire_reset": None, "max_num_frames_per_episode": "max_episode_frames"},
    "envpool": {"frame_skip": "frame_skip", "stack_num": "stack", "img_height": "screen_size",
                "img_width": "screen_size", "noop_max": "noop_max", "gray_scale": None,
                "repeat_action_probability": "repeat_action_probability", "episodic_life": "terminal_on_life_loss",
                "reward_clip": None, "use_fire_reset": None, "max_episode_steps": "max_episode_frames"},
}
"""Each backend's keyword arguments that the preprocessing sets itself, and the :class:`AtariConfig` field each comes
from (``None``: fixed, so that every backend plays the same game): ``env.kwargs`` may not set them
(:func:`components.env_backends.check_kwargs`). On ``gymnasium`` these go to the ALE env, whose own frame skip is 1
(``AtariPreprocessing`` skips ``frame_skip`` frames)."""


def ale_kwargs(atari: AtariConfig) -> dict[str, Any]:
    """The ALE env's keyword arguments on the gymnasium backend (``gymnasium.make``), before its wrappers."""
    return {"frameskip": 1, "repeat_action_probability": atari.repeat_action_probability,
            "max_num_frames_per_episode": atari.max_episode_frames}


def make_one(env_id: str, atari: AtariConfig, kwargs: Mapping[str, Any]):
    """One preprocessed env on the gymnasium backend: the ALE env without its own frame skip, then gymnasium's
    ``AtariPreprocessing`` and ``FrameStackObservation``."""
    import gymnasium as gym

    from .envs import make_env

    env = make_env(env_id, **ale_kwargs(atari), **kwargs)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=atari.noop_max, frame_skip=atari.frame_skip,
                                          screen_size=atari.screen_size, terminal_on_life_loss=atari.terminal_on_life_loss,
                                          grayscale_obs=True, scale_obs=False)
    return gym.wrappers.FrameStackObservation(env, atari.stack)


def vector_kwargs(env_id: str, atari: AtariConfig, backend: str) -> tuple[str, dict[str, Any]]:
    """``(id, keyword arguments)`` for a fast backend's own Atari vector env doing :class:`AtariConfig`'s steps."""
    if backend == "ale_vector":
        return game_of(env_id), {
            "frameskip": atari.frame_skip, "stack_num": atari.stack, "img_height": atari.screen_size,
            "img_width": atari.screen_size, "noop_max": atari.noop_max, "maxpool": True, "grayscale": True,
            "repeat_action_probability": atari.repeat_action_probability,
            "episodic_life": atari.terminal_on_life_loss, "reward_clipping": False, "use_fire_reset": False,
            "max_num_frames_per_episode": atari.max_episode_frames}
    if backend == "envpool":
        return envpool_id(env_id), {
            "frame_skip": atari.frame_skip, "stack_num": atari.stack, "img_height": atari.screen_size,
            "img_width": atari.screen_size, "noop_max": atari.noop_max, "gray_scale": True,
            "repeat_action_probability": atari.repeat_action_probability,
            "episodic_life": atari.terminal_on_life_loss, "reward_clip": False, "use_fire_reset": False,
            "max_episode_steps": atari.max_episode_frames // atari.frame_skip}
    raise ConfigurationError(f"env.atari has no preprocessing on env.backend={backend}: use gymnasium, ale_vector or "
                             "envpool", path="env.backend", alternatives=("gymnasium", "ale_vector", "envpool"))

