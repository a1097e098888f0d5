"""How a collector's envs are vectorized: ``env.backend`` picks one, and every one steps with same-step autoreset.

- ``gymnasium`` (the default): gymnasium's ``SyncVectorEnv`` over ``gymnasium.make(id)``, one Python env object per
  env (works for every env, and for ``env._target_`` callables).
- ``vector``: the env's own array-vectorized implementation, gymnasium's ``vectorization_mode="vector_entry_point"``
  (CartPole's ``CartPoleVectorEnv`` steps all its envs in a few numpy expressions).
- ``ale_vector``: ale-py's ``AtariVectorEnv`` (``pip install '.[atari]'``), C++ Atari emulators stepped on threads with
  the DeepMind preprocessing done in C++; for ``env=atari`` (an ``ALE/...`` id with ``env.atari`` set).

A family's preprocessing (``env.atari``) is built on each fast backend by the family itself
(`components.envs.family.EnvFamily.vector_kwargs`); an array-vectorized env that resets on the next step is
reset by rows as its family says (`components.envs.family.EnvFamily.row_resets`).
- ``envpool``: EnvPool's C++ environments (``pip install '.[envpool]'``), for the ids EnvPool implements; with
  ``env.atari`` set, its Atari pool with that preprocessing (``ALE/Breakout-v5`` is EnvPool's ``Breakout-v5``).

``vector`` and ``envpool`` reset an ended env on the *next* step natively (the action given then is ignored and a zero
reward returned). The adapters here reset ended envs within the step instead, as gymnasium's
``AutoresetMode.SAME_STEP`` does: the step returns the reset observation, the final one goes into
``info["final_obs"]`` where ``info["_final_obs"]`` is set. So recipes see the same kind of data on every backend:
every transition is a real one, and an episode's last transition carries its final observation.

``ale_vector`` resets within the step itself (its
``autoreset_mode="SameStep"``).

Seeds: the ``gymnasium`` and ``ale_vector`` backends seed env ``i`` with ``seed + i``; the other two take one seed for
the whole vector (the first of a list), so their episodes differ from the ``gymnasium`` backend's, reproducibly.
With ``env.atari`` set the three Atari backends play the same game with the same preprocessing; their emulators and
random draws differ, so their episodes do too.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable, Mapping

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from transports.kernel.errors import ConfigurationError

from .family import Preprocessing, row_resets
from .make import prepare

BACKENDS = ("gymnasium", "vector", "ale_vector", "envpool")
"""The values ``env.backend`` takes."""


def check_backend(backend: str, env_id: str | None, preprocessing: Preprocessing | None = None) -> None:
    """Refuse, before anything starts, a backend that cannot make ``env_id`` here.

    Args:
        backend: ``env.backend``.
        env_id: ``env.id`` (``None`` where ``env._target_`` names the env).
        preprocessing: the env family's preprocessing the config sets (``env.atari``), if any.

    Raises:
        ConfigurationError: an unknown backend; a fast backend without ``env.id``; ``vector`` for an env without a
            vector entry point or without a same-step adapter, or with ``env.atari``; ``ale_vector`` without
            ``env.atari`` or without ale-py; ``envpool`` not installed or not implementing the id; ``env.atari`` for
            an id that is no ALE env.
    """
    if backend not in BACKENDS:
        raise ConfigurationError(f"env.backend={backend!r} is not a backend", path="env.backend", alternatives=BACKENDS)
    if backend == "gymnasium":
        if preprocessing is not None and env_id is not None:
            preprocessing.family.check_id(env_id)
        return
    if env_id is None:
        raise ConfigurationError(f"env.backend={backend} makes envs by id; an env._target_ callable runs on the "
                                 "gymnasium backend (env.backend=gymnasium)", path="env.backend")
    # the backend's own id (vector_kwargs refuses a backend without that preprocessing)
    task = _task(backend, env_id, preprocessing)
    if backend == "ale_vector":
        if preprocessing is None:
            raise ConfigurationError(f"env.backend=ale_vector makes preprocessed Atari envs: use env=atari (env.atari "
                                     f"set), not env.id={env_id!r} alone", path="env.backend")
        _ale_roms(task)
        return
    if backend == "vector":
        try:
            entry = gym.spec(env_id).vector_entry_point
        except gym.error.Error as exc:
            raise ConfigurationError(f"cannot make gymnasium env {env_id!r}: {exc}", path="env.id") from exc
        if entry is None:
            raise ConfigurationError(f"env {env_id!r} has no array-vectorized implementation (no vector_entry_point "
                                     "in its gymnasium registration): use env.backend=gymnasium (or envpool)",
                                     path="env.backend")
    else:
        _envpool_ids(task)


SET_HERE: dict[str, dict[str, str]] = {
    "gymnasium": {"num_envs": "each collector worker's share of recipe.num_envs",
                  "vectorization_mode": "env.backend", "vector_kwargs": "same-step autoreset",
                  "wrappers": "the env family's preprocessing (env.atari)"},
    "vector": {"num_envs": "each collector worker's share of recipe.num_envs",
               "vectorization_mode": "env.backend", "vector_kwargs": "same-step autoreset",
               "wrappers": "the env family's preprocessing (env.atari)"},
    "ale_vector": {"game": "env.id", "num_envs": "each collector worker's share of recipe.num_envs",
                   "batch_size": "every env steps together", "autoreset_mode": "same-step autoreset"},
    "envpool": {"task_id": "env.id", "task": "env.id", "num_envs": "each collector worker's share of recipe.num_envs",
                "batch_size": "every env steps together", "seed": "seed"},
}
"""Each backend's keyword arguments that the collector sets itself, and from what: ``env.kwargs`` may not set them."""

_MAKE_KWARGS = ("max_episode_steps", "disable_env_checker")
"""What ``gymnasium.make`` takes besides the env's own arguments."""


def check_kwargs(backend: str, env_id: str, kwargs: Mapping[str, Any],
                 preprocessing: Preprocessing | None = None) -> None:
    """Refuse, before anything starts, an ``env.kwargs`` key that the backend's env does not take, or one that the
    collector (`SET_HERE`) or the env family's preprocessing (its
    `preprocessing`, e.g. `components.envs.families.atari.PREPROCESSING`)
    sets itself, where two values for it would clash (``+env.kwargs.frameskip=4`` with ``env=atari``) or one would
    silently win. What an env takes is read from its constructor's signature (``gymnasium.make``'s entry point, the
    vector entry point, ``AtariVectorEnv``, EnvPool's config); a constructor taking ``**kwargs`` takes anything here,
    and making the env then says more (`components.envs.EnvMaker.spec`).

    Args:
        backend: ``env.backend``.
        env_id: ``env.id``.
        kwargs: ``env.kwargs``.
        preprocessing: the env family's preprocessing the config sets, if any.

    Raises:
        ConfigurationError: naming ``env.kwargs.<key>``, the value, and what to set instead or the keys there are.
    """
    fixed = preprocessing.family.preprocessing.get(backend, {}) if preprocessing is not None else {}
    for key, value in kwargs.items():
        path = f"env.kwargs.{key}"
        if key in fixed:
            field = fixed[key]
            then = (f"set {preprocessing.path}.{field} instead" if field is not None else
                    "drop it (it is fixed, so that every backend plays the same game)")
            raise ConfigurationError(f"{path}={value!r} clashes with {preprocessing.path}, "
                                     f"whose preprocessing sets {key} itself on env.backend={backend}: {then}",
                                     path=path)
        if key in SET_HERE[backend]:
            raise ConfigurationError(f"{path}={value!r} clashes with the collector, which sets {key} itself on "
                                     f"env.backend={backend} (from {SET_HERE[backend][key]}): drop it", path=path)
    taken = _taken(backend, env_id, preprocessing)
    if taken is None:
        return
    what, names = taken
    names = sorted(set(names) - set(fixed) - set(SET_HERE[backend]))
    for key in kwargs:
        if key not in names:
            raise ConfigurationError(f"{what} takes no keyword argument {key!r} (env.kwargs sets it)",
                                     path=f"env.kwargs.{key}", alternatives=tuple(names))


def _task(backend: str, env_id: str, preprocessing: Preprocessing | None) -> str:
    """The backend's own id of ``env_id``: with a preprocessing, the id its own implementation of it takes."""
    return env_id if preprocessing is None else preprocessing.family.vector_kwargs(env_id, preprocessing.config,
                                                                                   backend)[0]


def _taken(backend: str, env_id: str, preprocessing: Preprocessing | None) -> tuple[str, list[str]] | None:
    """``(what takes env.kwargs, the keyword arguments it takes)``, or ``None`` where that cannot be told."""
    if backend == "ale_vector":
        from ale_py.vector_env import AtariVectorEnv

        return "ale-py's AtariVectorEnv (env.backend=ale_vector)", _parameters(AtariVectorEnv)
    if backend == "envpool":
        task = _task(backend, env_id, preprocessing)
        spec = _envpool().make_spec(task)
        return f"EnvPool's {task} (env.backend=envpool)", list(spec.config._fields)
    prepare(env_id)
    try:
        spec = gym.spec(env_id)
    except gym.error.Error:
        return None  # making the env says what is wrong with the id
    entry = spec.vector_entry_point if backend == "vector" else spec.entry_point
    if isinstance(entry, str):
        entry = gym.envs.registration.load_env_creator(entry)
    names = _parameters(entry)
    if names is None:
        return None
    if backend == "vector":
        return f"{env_id}'s vector env (env.backend=vector)", names
    return env_id, [*names, *_MAKE_KWARGS]


def _parameters(creator: Callable) -> list[str] | None:
    """The keyword arguments ``creator`` takes (a class: its constructor's), ``None`` where it takes ``**kwargs``."""
    try:
        parameters = inspect.signature(creator).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                     inspect.Parameter.KEYWORD_ONLY)]


def make_vector(backend: str, env_id: str, num_envs: int, kwargs: Mapping[str, Any],
                preprocessing: Preprocessing | None = None) -> gym.vector.VectorEnv:
    """``num_envs`` envs of ``env_id`` on a fast backend, stepping with same-step autoreset.

    Args:
        backend: ``vector``, ``ale_vector`` or ``envpool``.
        env_id: ``env.id``.
        num_envs: how many envs.
        kwargs: the vector env constructor's arguments (``gymnasium.make_vec``, ``AtariVectorEnv``: ``num_threads``...)
            or ``envpool.make_gymnasium``'s (``num_threads``, ``max_episode_steps``...).
        preprocessing: the env family's preprocessing, done in the backend's own arguments (see
            `components.envs.family.EnvFamily.vector_kwargs`).

    Raises:
        ConfigurationError: the backend cannot make the env.
    """
    check_backend(backend, env_id, preprocessing)
    if preprocessing is not None:
        env_id, own = preprocessing.family.vector_kwargs(env_id, preprocessing.config, backend)
        kwargs = {**own, **kwargs}
    if backend == "ale_vector":
        return AleVector(env_id, num_envs, dict(kwargs))
    if backend == "vector":
        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)
        if env.metadata.get("autoreset_mode") == gym.vector.AutoresetMode.SAME_STEP:
            return env
        reset_rows = row_resets().get(type(env.unwrapped).__qualname__)
        if reset_rows is None:
            env.close()
            raise ConfigurationError(
                f"env {env_id!r}: its vector implementation {type(env.unwrapped).__name__} resets on the next step "
                f"({env.metadata.get('autoreset_mode')}) and has no same-step adapter here: use env.backend=gymnasium",
                path="env.backend")
        return SameStepVector(env, reset_rows)
    return EnvPoolVector(env_id, num_envs, dict(kwargs))


# ---------------------------------------------------------------------------------------------- vector_entry_point
class SameStepVector(gym.vector.VectorEnv):
    """An array-vectorized gymnasium env that resets on the next step, stepped with same-step autoreset.

    Args:
        env: the vector env (``gymnasium.make_vec(..., vectorization_mode="vector_entry_point")``).
        reset_rows: ``(unwrapped env, boolean rows) -> observations of every env`` after resetting those rows.
    """

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, env: gym.vector.VectorEnv, reset_rows: Callable[[Any, np.ndarray], np.ndarray]):
        self.env, self._reset_rows = env, reset_rows
        self.num_envs, self.spec = env.num_envs, env.spec
        self.single_observation_space, self.single_action_space = env.single_observation_space, env.single_action_space
        self.observation_space, self.action_space = env.observation_space, env.action_space

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        """Reset every env (``seed``: one per env or one for all; see the module's note on seeds)."""
        return self.env.reset(seed=_first(seed), options=options)

    def step(self, actions):
        """Step every env; an ended one is reset within the step, its final observation in ``info["final_obs"]``."""
        obs, reward, terminated, truncated, info = self.env.step(actions)
        done = np.logical_or(terminated, truncated)
        if done.any():
            info = {**info, "final_obs": obs, "_final_obs": done}
            obs = self._reset_rows(self.env.unwrapped, done)
        return obs, reward, terminated, truncated, info

    def close(self, **kwargs: Any) -> None:
        """Close the underlying vector env."""
        self.env.close(**kwargs)


def _first(seed: int | list[int] | None) -> int | None:
    """One seed for a whole vector: the first of a per-env list."""
    return seed[0] if isinstance(seed, (list, tuple)) else seed


# ---------------------------------------------------------------------------------------------- ale_vector
def _ale_roms(game: str) -> None:
    """Refuse a game ale-py has no ROM of, or ale-py missing."""
    try:
        from ale_py import roms
    except ImportError as exc:
        raise ConfigurationError("env.backend=ale_vector needs ale-py: pip install '.[atari]'",
                                 path="env.backend") from exc
    with warnings.catch_warnings():  # ale-py warns of an unknown ROM before returning None: the error below says it
        warnings.simplefilter("ignore", UserWarning)
        path = roms.get_rom_path(game)
    if path is None:
        raise ConfigurationError(f"ale-py has no ROM {game!r} (from env.id): ale_py.roms.get_all_rom_ids() lists them",
                                 path="env.id")


class AleVector(gym.vector.VectorEnv):
    """ale-py's ``AtariVectorEnv`` with same-step autoreset, seeded per env as the ``gymnasium`` backend is.

    Args:
        game: the ROM name (``breakout``).
        num_envs: emulators, all stepped together.
        kwargs: the rest of ``AtariVectorEnv``'s arguments (preprocessing, ``num_threads``...).
    """

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, game: str, num_envs: int, kwargs: dict[str, Any]):
        from ale_py.vector_env import AtariVectorEnv

        self.env = AtariVectorEnv(game, num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP, **kwargs)
        self.num_envs, self.spec = num_envs, None
        self.single_observation_space, self.single_action_space = (self.env.single_observation_space,
                                                                   self.env.single_action_space)
        self.observation_space, self.action_space = self.env.observation_space, self.env.action_space

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        """Reset every env (``seed``: one per env or one for all; see the module's note on seeds)."""
        if isinstance(seed, (list, tuple)):
            seed = np.asarray(seed, dtype=np.int64)
        return self.env.reset(seed=seed, options=options)

    def step(self, actions):
        """Step every env; an ended one is reset within the step, its final observation in ``info["final_obs"]``."""
        obs, reward, terminated, truncated, info = self.env.step(np.asarray(actions, dtype=np.int64))
        done = np.logical_or(terminated, truncated)
        if done.any() and "_final_obs" not in info:
            info = {**info, "_final_obs": done}
        return obs, reward, terminated, truncated, info

    def close(self, **kwargs: Any) -> None:
        """Close the underlying vector env."""
        self.env.close(**kwargs)


# ---------------------------------------------------------------------------------------------- envpool
def _envpool():
    try:
        import envpool
    except ImportError as exc:
        raise ConfigurationError("env.backend=envpool needs EnvPool: pip install '.[envpool]'",
                                 path="env.backend") from exc
    return envpool


def _envpool_ids(env_id: str) -> None:
    if env_id not in _envpool().list_all_envs():
        raise ConfigurationError(f"EnvPool does not implement {env_id!r}: use env.backend=gymnasium (EnvPool's ids: "
                                 "envpool.list_all_envs())", path="env.id")


class EnvPoolVector(gym.vector.VectorEnv):
    """EnvPool's synchronous env pool as a gymnasium vector env with same-step autoreset.

    EnvPool resets an ended env on its next step; here the ended envs are reset within the step
    (``pool.reset(env_ids)``), so the step after is a real transition. Seeding (``reset(seed=s)``) makes a new pool
    with ``seed=s``: EnvPool derives every env's seed from it.

    Args:
        env_id: an id of ``envpool.list_all_envs()``.
        num_envs: envs in the pool (all stepped together: ``batch_size = num_envs``).
        kwargs: more arguments of ``envpool.make_gymnasium`` (``num_threads``: its worker threads, default one per
            core; ``max_episode_steps``...).
    """

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, env_id: str, num_envs: int, kwargs: dict[str, Any], seed: int = 0):
        self.env_id, self.num_envs, self._kwargs = env_id, num_envs, kwargs
        self._pool, self._seed = self._make(seed), seed
        self.single_observation_space = self._pool.observation_space
        self.single_action_space = self._pool.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)

    def _make(self, seed: int):
        with warnings.catch_warnings():  # EnvPool builds float32 Boxes from float64 bounds: gymnasium warns, harmlessly
            warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32", category=UserWarning)
            pool = _envpool().make_gymnasium(self.env_id, num_envs=self.num_envs, batch_size=self.num_envs, seed=seed,
                                             **self._kwargs)
            pool.observation_space, pool.action_space  # built on first access: here, where the warning is ignored
        return pool

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        """Reset every env (``seed``: one per env or one for all; see the module's note on seeds)."""
        seed = _first(seed)
        if seed is not None and seed != self._seed:
            self._pool.close()
            self._pool, self._seed = self._make(seed), seed
        obs, _ = self._pool.reset()
        return obs, {}

    def step(self, actions):
        """Step every env; an ended one is reset within the step, its final observation in ``info["final_obs"]``."""
        obs, reward, terminated, truncated, _ = self._pool.step(np.asarray(actions))
        done = np.logical_or(terminated, truncated)
        info: dict = {}
        if done.any():
            fresh, reset_info = self._pool.reset(np.flatnonzero(done))
            info = {"final_obs": obs, "_final_obs": done}
            obs = obs.copy()
            obs[reset_info["env_id"]] = fresh
        return obs, reward, terminated, truncated, info

    def close(self, **kwargs: Any) -> None:
        """Close the underlying vector env."""
        self._pool.close()
