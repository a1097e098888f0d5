"""``gymnasium.make`` for the env config: the id's family made ready first (its namespace registered), and every
way making an env can fail turned into a `ConfigurationError` naming the setting to change.

Steps use gymnasium's same-step autoreset: when an episode ends, ``("next", "observation")`` holds the episode's
final observation (for bootstrapping on truncation) while the observation carried into the next step is already
the reset one.
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym

from transports.kernel.errors import ConfigurationError

from .family import claiming, dependency_extras
from .spec import EnvSpec, spec_from_spaces


def prepare(env_id: str | None) -> None:
    """What making an env of ``env_id`` needs first: each family that claims it gets ready (its namespace
    registered with gymnasium, MuJoCo's warnings sent to the log).

    Raises:
        ConfigurationError: the package that provides the env is not installed (naming the extra that installs it).
    """
    for family in claiming(env_id):
        family.prepare(env_id)


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """``gymnasium.make`` with a config-friendly error for unknown ids and for envs whose package is missing.

    Args:
        env_id: a gymnasium id.
        **kwargs: the env's keyword arguments (``env.kwargs``).

    Raises:
        ConfigurationError: the id is unknown, a package is missing, or a keyword argument is not the env's.
    """
    prepare(env_id)
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as exc:
        extra = next((e for module, e in dependency_extras().items() if module in str(exc)), None)
        hint = f": pip install '.[{extra}]'" if extra else ""
        raise ConfigurationError(f"gymnasium env {env_id!r} needs a package that is not installed{hint} ({exc})",
                                 path="env.id") from exc
    except gym.error.Error as exc:
        raise ConfigurationError(f"cannot make gymnasium env {env_id!r}: {exc}", path="env.id") from exc
    except TypeError as exc:  # a keyword argument the env does not take (env.kwargs)
        named = re.search(r"unexpected keyword argument '(\w+)'", str(exc))
        if named is None or named[1] not in kwargs:
            raise
        raise ConfigurationError(f"{env_id} takes no keyword argument {named[1]!r} (env.kwargs sets it)",
                                 path=f"env.kwargs.{named[1]}") from None


def spec_of(env_id: str, **kwargs: Any) -> EnvSpec:
    """Read an `EnvSpec` from a throwaway instance of the env (closed before returning).

    Raises:
        ConfigurationError: the env id is unknown, or its spaces are not Box/Discrete.
    """
    env = make_env(env_id, **kwargs)
    try:
        return spec_from_spaces(env_id, env.observation_space, env.action_space)
    finally:
        env.close()


def make_vector_env(env_id: str, num_envs: int, **kwargs: Any) -> gym.vector.VectorEnv:
    """A synchronous vector env of ``num_envs`` envs of ``env_id`` with same-step autoreset.

    Args:
        env_id: a gymnasium id.
        num_envs: how many envs.
        **kwargs: each env's keyword arguments.
    """
    prepare(env_id)
    return gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        **kwargs,
    )
