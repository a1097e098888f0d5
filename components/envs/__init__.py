"""Environments: gymnasium envs made from the ``env`` config, vectorized on a chosen backend and stepped into
TensorDicts, with what sets a kind of env apart declared by its family.

- `components.envs.spec`: `EnvSpec`, an env's spaces as plain data, and the ``next`` leaves of a step;
- `components.envs.family`: `EnvFamily` and the registry of families;
- `components.envs.families`: the built-in families, one module each (``atari``, ``minatar``, ``mujoco``,
  ``classic_control``);
- `components.envs.make`: ``gymnasium.make`` with the id's family made ready and config-friendly errors;
- `components.envs.backends`: how a vector env is made on ``env.backend`` (``gymnasium``, ``vector``, ``ale_vector``,
  ``envpool``), every one with same-step autoreset;
- `components.envs.maker`: `EnvMaker`, the ``env`` config as one picklable object;
- `components.envs.stepper`: `VectorEnvStepper`, a collector's stepping of a vector env.

The names below are loaded on first use: the launcher composes configs (reading the family registry) without
importing gymnasium or torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EnvSpec": "spec", "NEXT_KEYS": "spec", "next_storage": "spec", "spec_from_spaces": "spec",
    "EnvFamily": "family", "Preprocessing": "family", "register_family": "family", "unregister_family": "family",
    "families": "family",
    "make_env": "make", "make_vector_env": "make", "spec_of": "make",
    "EnvMaker": "maker", "EnvFactory": "maker",
    "VectorEnvStepper": "stepper",
}
_RENAMED = {"register_family": "register", "unregister_family": "unregister"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Load an exported name from its module on first use."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), _RENAMED.get(name, name))
    globals()[name] = value
    return value
