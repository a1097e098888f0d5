"""The env config as one picklable object: `EnvMaker` makes one env, or a vector of them on the chosen backend,
as ``env.id`` / ``env._target_``, ``env.kwargs``, ``env.backend`` and an env family's preprocessing (``env.atari``)
say."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import gymnasium as gym

from transports.kernel.errors import ConfigurationError

from ..targets import instantiate_target
from .backends import check_backend, check_kwargs, make_vector
from .family import Preprocessing, claiming, configurable, preprocessing
from .make import make_env, make_vector_env
from .spec import EnvSpec, spec_from_spaces


class EnvMaker:
    """Makes one environment as the ``env`` config says: ``gymnasium.make(id, **kwargs)``, or your own callable
    ``_target_(**kwargs) -> gymnasium.Env``; and vector envs of it on the chosen backend. Plain data, so it pickles:
    collectors make their envs where they run.

    Args:
        id: a registered gymnasium id (``CartPole-v1``).
        _target_: instead of ``id``, the dotted name of a callable that returns one gymnasium env.
        kwargs: keyword arguments of ``gymnasium.make``, or of the ``_target_`` callable; on the ``vector`` and
            ``envpool`` backends, of the vector env (see `components.envs.backends`).
        backend: how `vector` vectorizes: ``gymnasium`` (per-env SyncVectorEnv), ``vector`` (the env's own
            array-vectorized implementation), ``ale_vector`` (ale-py's threaded Atari vector env) or ``envpool``; all
            with same-step autoreset.
        **families: at most one env family's preprocessing, under the family's name: ``atari=`` the DeepMind
            preprocessing of an ALE env (`AtariConfig`, ``env=atari`` sets it),
            done by each backend's own implementation; a config object or a mapping of its fields. ``None`` or left
            out: the env as ``gymnasium.make`` gives it.

    Raises:
        ConfigurationError: neither or both of ``id`` and ``_target_`` are set; a backend that cannot make the env;
            a keyword argument the env does not take, or one the collector or the preprocessing sets itself; a
            preprocessing of no registered family, or of two.

    Examples:
        >>> EnvMaker(_target_="my_envs.make_maze", kwargs={"size": 5}).vector(8)   # a SyncVectorEnv of 8 mazes
    """

    def __init__(self, id: str | None = None, _target_: str | None = None, kwargs: Mapping[str, Any] | None = None,
                 backend: str = "gymnasium", **families: Any):
        if id is not None and _target_ is not None:
            raise ConfigurationError(f"env.id={id!r} and env._target_={_target_!r} both name an environment: keep one "
                                     "(e.g. env.id=null)", path="env")
        if id is None and _target_ is None:
            raise ConfigurationError("no environment: set env.id (a gymnasium id) or env._target_ (a callable that "
                                     "returns one gymnasium env)", path="env.id")
        self.preprocessing: Preprocessing | None = preprocessing(families)
        if self.preprocessing is not None and id is None:
            path = self.preprocessing.path
            raise ConfigurationError(f"{path} preprocesses an env named by env.id (ALE/Breakout-v5), not an "
                                     "env._target_ callable", path=path)
        check_backend(backend, id, self.preprocessing)
        if id is not None and kwargs:
            check_kwargs(backend, id, kwargs, self.preprocessing)
        self.id, self.target, self.kwargs, self.backend = id, _target_, dict(kwargs or {}), backend

    @classmethod
    def from_config(cls, node: Any) -> "EnvMaker":
        """From the ``env`` config node (a DictConfig or a mapping of ``id``, ``_target_``, ``kwargs``, ``backend``,
        and each env family's preprocessing, ``atari``...).

        Raises:
            ConfigurationError: the node holds other keys, or neither or both of ``id`` and ``_target_``.
        """
        from omegaconf import OmegaConf

        data = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
        known = ("id", "_target_", "kwargs", "backend", *configurable())
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigurationError(f"env: unknown keys {unknown}; the callable's arguments go under env.kwargs",
                                     path=f"env.{unknown[0]}", alternatives=known)
        return cls(**data)

    @property
    def name(self) -> str:
        """The gymnasium id, or the callable's dotted name."""
        return self.id if self.id is not None else self.target

    @property
    def image_size(self) -> tuple[str, Any] | None:
        """``(config path, value)`` of the setting that sizes the env's images (``("env.atari.screen_size", 84)``),
        where the preprocessing has one."""
        return None if self.preprocessing is None else self.preprocessing.size()

    def __call__(self) -> gym.Env:
        """One environment."""
        if self.preprocessing is not None:
            family, config = self.preprocessing.family, self.preprocessing.config
            return family.wrap(make_env(self.id, **family.make_kwargs(config), **self.kwargs), config)
        if self.id is not None:
            return make_env(self.id, **self.kwargs)
        return instantiate_target({"_target_": self.target, **self.kwargs}, "env", expect=gym.Env)

    def spec(self) -> EnvSpec:
        """The `EnvSpec`, read from a throwaway instance (closed before returning): one env, or on a fast
        backend a vector of one (its kwargs are the vector env's).

        Raises:
            ConfigurationError: the env cannot be made; where ``kwargs`` are set, whatever making it raises names
                them (a value the env refuses: ``env.kwargs.mode=99`` for a game without that mode).
        """
        path = "env.id" if self.id is not None else "env._target_"
        vector = self.backend != "gymnasium"
        try:
            env = self.vector(1) if vector else self()
        except ConfigurationError as exc:
            cause = exc.__cause__  # gymnasium's error for a value an env refuses is blamed on env.id by make_env
            if not self.kwargs or exc.path != "env.id" or not isinstance(cause, gym.error.Error) or isinstance(
                    cause, (gym.error.UnregisteredEnv, gym.error.DeprecatedEnv, gym.error.DependencyNotInstalled)):
                raise
            raise self._refused(cause) from cause
        except Exception as exc:
            if not self.kwargs:
                raise
            raise self._refused(exc) from exc
        try:
            spaces = ((env.single_observation_space, env.single_action_space) if vector else
                      (env.observation_space, env.action_space))
            return dataclasses.replace(spec_from_spaces(self.name, *spaces, path=path), encoder=self._encoder())
        finally:
            env.close()

    def _encoder(self) -> str | None:
        """The encoder the env's family prefers: the preprocessing's family, else the first family claiming the id."""
        if self.preprocessing is not None:
            return self.preprocessing.family.encoder
        return next((family.encoder for family in claiming(self.id) if family.encoder is not None), None)

    def _refused(self, exc: BaseException) -> ConfigurationError:
        """What making the env with `kwargs` raised, as a configuration error naming them."""
        where = f"env.kwargs.{next(iter(self.kwargs))}" if len(self.kwargs) == 1 else "env.kwargs"
        given = ", ".join(f"env.kwargs.{key}={value!r}" for key, value in self.kwargs.items())
        return ConfigurationError(f"{self.name} cannot be made with {given}: {type(exc).__name__}: "
                                  f"{' '.join(str(exc).split())}", path=where)

    def vector(self, num_envs: int) -> gym.vector.VectorEnv:
        """``num_envs`` environments in one vector env on `backend`, with same-step autoreset."""
        if self.backend != "gymnasium":
            return make_vector(self.backend, self.id, num_envs, self.kwargs, self.preprocessing)
        if self.id is not None and self.preprocessing is None:
            return make_vector_env(self.id, num_envs, **self.kwargs)
        return gym.vector.SyncVectorEnv([self] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)

    def __repr__(self) -> str:
        backend = "" if self.backend == "gymnasium" else f", backend={self.backend!r}"
        pre = "" if self.preprocessing is None else f", {self.preprocessing!r}"
        return f"EnvMaker({self.name!r}, kwargs={self.kwargs!r}{backend}{pre})"


EnvFactory = Callable[[], gym.vector.VectorEnv]
"""What a collector is given to make its envs where it runs: a callable returning one vector env
(``functools.partial(maker.vector, n)``)."""
