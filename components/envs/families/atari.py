"""The Atari family: ``ALE/...`` ids (ale-py), and the DeepMind preprocessing as one config, built the same way on
every env backend.

``env=atari`` sets ``env.atari`` (an `AtariConfig`); each backend then builds its envs from it with its own
library's implementation of the same steps:

- ``gymnasium``: ``gymnasium.make(id, frameskip=1, ...)`` wrapped in gymnasium's ``AtariPreprocessing`` (no-op
  starts, frame skip with max-pooling of the last two frames, 84x84 grey) and ``FrameStackObservation``;
- ``ale_vector``: ale-py's ``AtariVectorEnv``, a threaded C++ vector env doing the same preprocessing;
- ``envpool``: EnvPool's Atari pool, likewise.

Every backend gives observations of ``(stack, screen_size, screen_size)`` uint8 and the game's own rewards: an
episode's return is the game score, and a recipe that learns from clipped rewards clips them itself
(``recipe.clip_rewards``). No backend presses FIRE at reset or ends an episode on a lost life unless
``terminal_on_life_loss`` says so, so all three play the same game.

The dataclass is plain data (the schema imports it); the builders import gymnasium and ale-py when called. The
frames go to the Nature CNN where ``recipe.encoder=auto`` (IMPALA's ResNet where they are too small for it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from transports.kernel.errors import ConfigurationError
from transports.kernel.options import bounded

from ..family import EnvFamily, register


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
"""Each backend's keyword arguments that the preprocessing sets itself, and the `AtariConfig` field each comes
from (``None``: fixed, so that every backend plays the same game): ``env.kwargs`` may not set them
(`components.envs.backends.check_kwargs`). On ``gymnasium`` these go to the ALE env, whose own frame skip is 1
(``AtariPreprocessing`` skips ``frame_skip`` frames)."""


def ale_kwargs(atari: AtariConfig) -> dict[str, Any]:
    """The ALE env's keyword arguments on the gymnasium backend (``gymnasium.make``), before its wrappers."""
    return {"frameskip": 1, "repeat_action_probability": atari.repeat_action_probability,
            "max_num_frames_per_episode": atari.max_episode_frames}


class Atari(EnvFamily):
    """ALE envs (``ALE/Breakout-v5``, registered by ale-py), preprocessed as `AtariConfig` says where
    ``env.atari`` is set."""

    name, config, namespace, package, extra = "atari", AtariConfig, "ALE", "ale_py", "atari"
    encoder, image_size, preprocessing = "nature_cnn", "screen_size", PREPROCESSING

    def register_envs(self, module: Any) -> None:
        """Register ale-py's envs with gymnasium, and quiet its banner."""
        import gymnasium as gym

        gym.register_envs(module)
        module.ALEInterface.setLoggerMode(module.LoggerMode.Error)  # no banner on stderr for every emulator

    def check_id(self, env_id: str) -> None:
        """Refuse ``env.atari`` for a registered id that is no ALE env (its preprocessing passes the ALE env's own
        arguments: CartPole would be blamed for a ``frameskip`` nobody set).

        Raises:
            ConfigurationError: naming ``env.id``.
        """
        import gymnasium as gym

        from ..make import prepare

        prepare(env_id)
        try:
            entry = gym.spec(env_id).entry_point
        except gym.error.Error:
            return  # making the env says what is wrong with the id
        if "ale_py" not in str(getattr(entry, "__module__", entry)):
            raise ConfigurationError(f"env.atari preprocesses an ALE env, and env.id={env_id!r} is not one: use an ALE "
                                     "id (ALE/Breakout-v5), or env.atari=null for the env as gymnasium.make gives it",
                                     path="env.id")

    def make_kwargs(self, config: AtariConfig) -> dict[str, Any]:
        """The ALE env's own arguments: no frame skip of its own (the wrapper skips), sticky actions, the frame cap."""
        return ale_kwargs(config)

    def wrap(self, env: Any, config: AtariConfig) -> Any:
        """Gymnasium's ``AtariPreprocessing`` (no-op starts, frame skip with max-pooling, grey resize), then
        ``FrameStackObservation``."""
        import gymnasium as gym

        env = gym.wrappers.AtariPreprocessing(env, noop_max=config.noop_max, frame_skip=config.frame_skip,
                                              screen_size=config.screen_size,
                                              terminal_on_life_loss=config.terminal_on_life_loss, grayscale_obs=True,
                                              scale_obs=False)
        return gym.wrappers.FrameStackObservation(env, config.stack)

    def vector_kwargs(self, env_id: str, config: AtariConfig, backend: str) -> tuple[str, dict[str, Any]]:
        """See `vector_kwargs`."""
        return vector_kwargs(env_id, config, backend)


def vector_kwargs(env_id: str, atari: AtariConfig, backend: str) -> tuple[str, dict[str, Any]]:
    """``(id, keyword arguments)`` for a fast backend's own Atari vector env doing `AtariConfig`'s steps."""
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


register(Atari())
