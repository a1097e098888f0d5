"""Env families: what sets a kind of environment apart, declared once in a module that registers itself.

A family says which gymnasium ids are its own (a namespace such as ``ALE``, and the package that registers it), what
its preprocessing is (a config dataclass set as ``env.<name>``, the keyword arguments and wrappers it builds one env
with, and the arguments each fast backend's own implementation takes), and which built-in encoder ``recipe.encoder=
auto`` picks for its observations. The maker, the backends, the schema and the networks ask the registry here; none
of them names a family.

Adding a family is one module in ``components/envs/families/`` (loaded with the built-ins) or anywhere imported before
the env is made, plus its YAML in ``conf/env/``:

    @dataclass
    class MazeConfig:
        size: int = 5

    class Maze(EnvFamily):
        name, config = "maze", MazeConfig

        def wrap(self, env, config):
            return MyPreprocessing(env, config.size)

    register(Maze())

This module imports nothing heavy: the launcher's schema reads the registry while composing a config.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, is_dataclass
from typing import Any, Callable, Mapping

from transports.kernel.errors import ConfigurationError


class EnvFamily:
    """One family of environments; subclass it, set the attributes that apply and override the methods that do.

    Attributes:
        name: the registry key and, where `config` is set, the config key of its preprocessing (``env.<name>``).
        config: the dataclass of its preprocessing (``None``: it has none; its envs are made as gymnasium makes them).
        namespace: the gymnasium id namespace whose envs are its own (``ALE`` for ``ALE/Breakout-v5``), if any.
        package: the module that registers the namespace's envs with gymnasium, imported on first use.
        extra: what ``pip install '.[extra]'`` installs for its envs (named by errors about a missing package).
        encoder: the built-in encoder ``recipe.encoder=auto`` picks for its observations where that encoder takes them
            (``None``: the choice goes by the observation's shape alone).
        image_size: the field of `config` that sizes its images (a too-small image names ``env.<name>.<field>``).
        preprocessing: per backend, the keyword arguments its preprocessing sets itself, and the `config` field
            each comes from (``None``: fixed): ``env.kwargs`` may not set them.
        row_resets: per array-vectorized env class (its ``__qualname__``) whose own autoreset is on the next step: how
            to reset some of its envs at once, ``(unwrapped env, boolean rows) -> observations of every env``.
    """

    name: str = ""
    config: type | None = None
    namespace: str | None = None
    package: str | None = None
    extra: str | None = None
    encoder: str | None = None
    image_size: str | None = None
    preprocessing: Mapping[str, Mapping[str, str | None]] = {}
    row_resets: Mapping[str, Callable[[Any, Any], Any]] = {}

    def claims(self, env_id: str | None) -> bool:
        """Whether ``env_id`` is one of this family's envs (by default: its id is in `namespace`)."""
        return self.namespace is not None and env_id is not None and env_id.split("/", 1)[0] == self.namespace \
            and "/" in env_id

    def prepare(self, env_id: str) -> None:
        """Make ``env_id`` (one this family claims) ready for ``gymnasium.make``: by default import `package`
        and register its envs (`register_envs`).

        Raises:
            ConfigurationError: the package is not installed (naming the extra that installs it).
        """
        if self.package is None:
            return
        try:
            module = importlib.import_module(self.package)
        except ImportError as exc:
            raise ConfigurationError(f"env.id={env_id!r} needs {self.package.split('.')[0]}: pip install "
                                     f"'.[{self.extra}]'", path="env.id") from exc
        self.register_envs(module)

    def register_envs(self, module: Any) -> None:
        """Register the envs of `package` (``module``, just imported) with gymnasium."""
        import gymnasium as gym

        gym.register_envs(module)

    def check_id(self, env_id: str) -> None:
        """Refuse, before anything starts, an ``env.id`` this family's preprocessing does not apply to.

        Raises:
            ConfigurationError: naming ``env.id``.
        """

    def make_kwargs(self, config: Any) -> dict[str, Any]:
        """The keyword arguments of ``gymnasium.make`` its preprocessing sets (``config``: its `config`)."""
        return {}

    def wrap(self, env: Any, config: Any) -> Any:
        """One env made with `make_kwargs`, wrapped in its preprocessing."""
        return env

    def vector_kwargs(self, env_id: str, config: Any, backend: str) -> tuple[str, dict[str, Any]]:
        """``(id, keyword arguments)`` of a fast backend's own vector env doing the same preprocessing.

        Raises:
            ConfigurationError: the backend has no implementation of it.
        """
        raise ConfigurationError(f"env.{self.name} has no preprocessing on env.backend={backend}: use gymnasium",
                                 path="env.backend", alternatives=("gymnasium",))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


@dataclass(frozen=True)
class Preprocessing:
    """A family's preprocessing as one env config sets it: the family and its config (``env.<family.name>``).

    Attributes:
        family: the family.
        config: an instance of ``family.config``.
    """

    family: EnvFamily
    config: Any

    @property
    def path(self) -> str:
        """Its config path (``env.atari``)."""
        return f"env.{self.family.name}"

    def size(self) -> tuple[str, Any] | None:
        """``(config path, value)`` of the setting that sizes its images, if the family names one."""
        field = self.family.image_size
        return None if field is None else (f"{self.path}.{field}", getattr(self.config, field))

    def __repr__(self) -> str:
        return f"{self.family.name}={self.config!r}"


_FAMILIES: dict[str, EnvFamily] = {}
_BUILT_IN = "components.envs.families"


def register(family: EnvFamily) -> EnvFamily:
    """Add ``family`` to the registry (a family of the same name is replaced) and return it.

    Raises:
        ValueError: its name is empty, or its config is not a dataclass.
    """
    if not family.name:
        raise ValueError(f"{family!r} has no name")
    if family.config is not None and not is_dataclass(family.config):
        raise ValueError(f"env family {family.name!r}: config must be a dataclass, got {family.config!r}")
    _FAMILIES[family.name] = family
    return family


def unregister(name: str) -> None:
    """Remove the family ``name`` from the registry (nothing happens where there is none)."""
    _FAMILIES.pop(name, None)


def families() -> tuple[EnvFamily, ...]:
    """Every registered family, the built-ins (``components.envs.families``) first."""
    importlib.import_module(_BUILT_IN)  # registers the built-ins on first use
    return tuple(sorted(_FAMILIES.values(), key=lambda family: not type(family).__module__.startswith(_BUILT_IN)))


def configurable() -> dict[str, type]:
    """``{config key: config dataclass}`` of every family that has a preprocessing (what ``env.<key>`` may set)."""
    return {family.name: family.config for family in families() if family.config is not None}


def claiming(env_id: str | None) -> tuple[EnvFamily, ...]:
    """The families that claim ``env_id``."""
    return tuple(family for family in families() if family.claims(env_id))


def preprocessing(options: Mapping[str, Any]) -> Preprocessing | None:
    """The one preprocessing ``options`` sets (``{family name: config or mapping or None}``), or ``None``.

    Raises:
        ConfigurationError: a key that is no family's, or more than one preprocessing set.
    """
    known = configurable()
    chosen = []
    for key, value in options.items():
        if key not in known:
            raise ConfigurationError(f"env.{key} is no env family's preprocessing", path=f"env.{key}",
                                     alternatives=tuple(known))
        if value is not None:
            config = known[key]
            chosen.append(Preprocessing(family_named(key),
                                        value if isinstance(value, config) else config(**dict(value))))
    if len(chosen) > 1:
        raise ConfigurationError(f"{' and '.join(p.path for p in chosen)} are both set: an env takes one family's "
                                 "preprocessing", path=chosen[1].path)
    return chosen[0] if chosen else None


def family_named(name: str) -> EnvFamily:
    """The registered family ``name``.

    Raises:
        KeyError: none is registered under it.
    """
    families()
    return _FAMILIES[name]


def row_resets() -> dict[str, Callable[[Any, Any], Any]]:
    """Every family's `EnvFamily.row_resets`, merged."""
    return {name: reset for family in families() for name, reset in family.row_resets.items()}


def dependency_extras() -> dict[str, str]:
    """``{top-level package: extra}`` for every family that names both (what ``pip install '.[extra]'`` brings)."""
    return {family.package.split(".")[0]: family.extra for family in families() if family.package and family.extra}
