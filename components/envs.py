"""The gymnasium adapter: vector environments stepped into TensorDicts, and env specs as plain data.

Steps use gymnasium's same-step autoreset: when an episode ends, ``("next", "observation")`` holds the
episode's final observation (for bootstrapping on truncation) while the observation carried into the next
step is already the reset one. Episode return and length are tracked per env.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from transports.kernel.errors import ConfigurationError
from transports.layout import Layout

from .atari import AtariConfig, make_one
from .env_backends import check_backend, check_kwargs, make_vector
from .targets import instantiate_target

_log = logging.getLogger(__name__)


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


_TORCH_DTYPES = {np.dtype("float32"): torch.float32, np.dtype("float64"): torch.float32, np.dtype("uint8"): torch.uint8,
                 np.dtype("bool"): torch.uint8}
"""Observation dtypes on the wire and in replay: pixels and MinAtar's boolean grids travel as one byte per value (the
policy scales them), everything else as float32."""

NAMESPACES: dict[str, tuple[str, str]] = {"ALE": ("ale_py", "atari"), "MinAtar": ("minatar.gym", "minatar")}
"""Gymnasium id namespaces whose envs a package registers: ``namespace -> (module to import, extra to install)``."""

_DEPENDENCY_EXTRAS = {"mujoco": "mujoco", **{module.split(".")[0]: extra for module, extra in NAMESPACES.values()}}
"""What ``pip install '.[extra]'`` brings a gymnasium env whose package is missing: ``package -> extra``."""


def register_namespace(env_id: str | None) -> None:
    """Register the envs of ``env_id``'s namespace (``ALE/...``: ale-py, ``MinAtar/...``: MinAtar) with gymnasium.

    Raises:
        ConfigurationError: the package that provides them is not installed (naming the extra that installs it).
    """
    namespace = env_id.split("/", 1)[0] if env_id and "/" in env_id else None
    if namespace not in NAMESPACES:
        return
    module, extra = NAMESPACES[namespace]
    import importlib

    try:
        loaded = importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(f"env.id={env_id!r} needs {module.split('.')[0]}: pip install '.[{extra}]'",
                                 path="env.id") from exc
    if namespace == "MinAtar" and f"{namespace}/Breakout-v1" not in gym.registry:
        loaded.register_envs()
    elif namespace == "ALE":
        gym.register_envs(loaded)
        loaded.ALEInterface.setLoggerMode(loaded.LoggerMode.Error)  # no banner on stderr for every emulator


def _log_mujoco_warnings(env_id: str) -> None:
    """MuJoCo writes its warnings to ``MUJOCO_LOG.TXT`` in the working directory; for MuJoCo envs they go to this
    module's logger instead (``launcher.log`` in a run)."""
    spec = gym.registry.get(env_id)
    if spec is None or "mujoco" not in str(spec.entry_point):
        return
    try:
        import mujoco
    except ImportError:
        return  # gymnasium says which package is missing when the env is made
    mujoco.set_mju_user_warning(lambda text: _log.warning("MuJoCo: %s", text.strip()))


def _prepare(env_id: str) -> None:
    """What making an env of ``env_id`` needs first: its namespace registered, MuJoCo's warnings sent to the log."""
    register_namespace(env_id)
    _log_mujoco_warnings(env_id)


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """``gymnasium.make`` with a config-friendly error for unknown ids and for envs whose package is missing."""
    _prepare(env_id)
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as exc:
        extra = next((e for module, e in _DEPENDENCY_EXTRAS.items() if module in str(exc)), None)
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


def make_vector_env(env_id: str, num_envs: int, **kwargs: Any) -> gym.vector.VectorEnv:
    """A synchronous vector env with same-step autoreset."""
    _prepare(env_id)
    return gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
        **kwargs,
    )


class EnvMaker:
    """Makes one environment as the ``env`` config says: ``gymnasium.make(id, **kwargs)``, or your own callable
    ``_target_(**kwargs) -> gymnasium.Env``; and vector envs of it on the chosen backend. Plain data, so it pickles:
    collectors make their envs where they run.

    Args:
        id: a registered gymnasium id (``CartPole-v1``).
        _target_: instead of ``id``, the dotted name of a callable that returns one gymnasium env.
        kwargs: keyword arguments of ``gymnasium.make``, or of the ``_target_`` callable; on the ``vector`` and
            ``envpool`` backends, of the vector env (see :mod:`components.env_backends`).
        backend: how :meth:`vector` vectorizes: ``gymnasium`` (per-env SyncVectorEnv), ``vector`` (the env's own
            array-vectorized implementation), ``ale_vector`` (ale-py's threaded Atari vector env) or ``envpool``; all
            with same-step autoreset.
        atari: the DeepMind preprocessing of an ALE env (:class:`~components.atari.AtariConfig`), done by each
            backend's own implementation (``env=atari`` sets it); ``None``: the env as ``gymnasium.make`` gives it.

    Raises:
        ConfigurationError: neither or both of ``id`` and ``_target_`` are set; a backend that cannot make the env;
            a keyword argument the env does not take, or one the collector or ``atari`` sets itself.

    Example:
        >>> EnvMaker(_target_="my_envs.make_maze", kwargs={"size": 5}).vector(8)   # a SyncVectorEnv of 8 mazes
    """

    def __init__(self, id: str | None = None, _target_: str | None = None, kwargs: Mapping[str, Any] | None = None,
                 backend: str = "gymnasium", atari: AtariConfig | Mapping[str, Any] | None = None):
        if id is not None and _target_ is not None:
            raise ConfigurationError(f"env.id={id!r} and env._target_={_target_!r} both name an environment: keep one "
                                     "(e.g. env.id=null)", path="env")
        if id is None and _target_ is None:
            raise ConfigurationError("no environment: set env.id (a gymnasium id) or env._target_ (a callable that "
                                     "returns one gymnasium env)", path="env.id")
        self.atari = AtariConfig.of(atari)
        if self.atari is not None and id is None:
            raise ConfigurationError("env.atari preprocesses an ALE env named by env.id (ALE/Breakout-v5), not an "
                                     "env._target_ callable", path="env.atari")
        check_backend(backend, id, self.atari)
        if id is not None and kwargs:
            check_kwargs(backend, id, kwargs, self.atari)
        self.id, self.target, self.kwargs, self.backend = id, _target_, dict(kwargs or {}), backend

    @classmethod
    def from_config(cls, node: Any) -> "EnvMaker":
        """From the ``env`` config node (a DictConfig or a mapping of ``id``, ``_target_``, ``kwargs``, ``backend``,
        ``atari``).

        Raises:
            ConfigurationError: the node holds other keys, or neither or both of ``id`` and ``_target_``.
        """
        from omegaconf import OmegaConf

        data = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
        known = ("id", "_target_", "kwargs", "backend", "atari")
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigurationError(f"env: unknown keys {unknown}; the callable's arguments go under env.kwargs",
                                     path=f"env.{unknown[0]}", alternatives=known)
        return cls(**data)

    @property
    def name(self) -> str:
        """The gymnasium id, or the callable's dotted name."""
        return self.id if self.id is not None else self.target

    def __call__(self) -> gym.Env:
        """One environment."""
        if self.atari is not None:
            return make_one(self.id, self.atari, self.kwargs)
        if self.id is not None:
            return make_env(self.id, **self.kwargs)
        return instantiate_target({"_target_": self.target, **self.kwargs}, "env", expect=gym.Env)

    def spec(self) -> EnvSpec:
        """The :class:`EnvSpec`, read from a throwaway instance (closed before returning): one env, or on a fast
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
            return spec_from_spaces(self.name, *spaces, path=path)
        finally:
            env.close()

    def _refused(self, exc: BaseException) -> ConfigurationError:
        """What making the env with :attr:`kwargs` raised, as a configuration error naming them."""
        where = f"env.kwargs.{next(iter(self.kwargs))}" if len(self.kwargs) == 1 else "env.kwargs"
        given = ", ".join(f"env.kwargs.{key}={value!r}" for key, value in self.kwargs.items())
        return ConfigurationError(f"{self.name} cannot be made with {given}: {type(exc).__name__}: "
                                  f"{' '.join(str(exc).split())}", path=where)

    def vector(self, num_envs: int) -> gym.vector.VectorEnv:
        """``num_envs`` environments in one vector env on :attr:`backend`, with same-step autoreset."""
        if self.backend != "gymnasium":
            return make_vector(self.backend, self.id, num_envs, self.kwargs, self.atari)
        if self.id is not None and self.atari is None:
            return make_vector_env(self.id, num_envs, **self.kwargs)
        return gym.vector.SyncVectorEnv([self] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)

    def __repr__(self) -> str:
        backend = "" if self.backend == "gymnasium" else f", backend={self.backend!r}"
        atari = "" if self.atari is None else f", atari={self.atari!r}"
        return f"EnvMaker({self.name!r}, kwargs={self.kwargs!r}{backend}{atari})"


NEXT_KEYS = ("observation", "reward", "terminated", "truncated", "done", "episode_return", "episode_length")
"""What one step writes under ``next``, in this order."""


def next_storage(spec: EnvSpec, shape: tuple[int, ...]) -> TensorDict:
    """Uninitialized ``next`` leaves for transitions of batch shape ``shape`` (a rollout's ``[time, env]``)."""
    dtypes = (spec.observation_dtype, torch.float32, torch.bool, torch.bool, torch.bool, torch.float32, torch.long)
    return TensorDict({key: torch.empty((*shape, *(spec.observation_shape if key == "observation" else ())),
                                        dtype=dtype) for key, dtype in zip(NEXT_KEYS, dtypes)}, batch_size=shape)


class VectorEnvStepper:
    """Steps a gymnasium vector env, writing each step's ``next`` into arrays the caller owns (no per-step objects).

    The current observations and the running episode statistics live here as numpy arrays; :meth:`step_into` writes
    one step at an index of preallocated ``[time, env]`` arrays (see :func:`next_storage`), :meth:`step` is the
    convenience form that fills ``td["next"]``.

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
        ``nxt`` (keyed by :data:`NEXT_KEYS`; ``index`` selects ``num_envs`` rows, e.g. ``(t, slice(a, b))``).

        ``observation`` is the final one where an episode ended (the env itself carries on from its reset
        observation, see :attr:`obs`); ``episode_return`` / ``episode_length`` are complete where ``done``.
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
        """Apply ``td["action"]``; fill ``td["next", ...]`` (see :meth:`step_into`) and return ``td``."""
        nxt = next_storage(self.spec, (self.num_envs,))
        self.step_into(td.get("action").numpy(force=True), {k: nxt.get(k).numpy() for k in NEXT_KEYS}, slice(None))
        td.set("next", nxt)
        return td

    def close(self) -> None:
        self.env.close()


EnvFactory = Callable[[], gym.vector.VectorEnv]
