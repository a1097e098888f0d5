"""A finished run read back: its config, its recipe, its env and the policy of its checkpoint, rebuilt as the run
built it (the recipe's own ``make_policy``, the run's ``resolved_config.yaml``, the weights of its ``checkpoint.pt``).
What ``python -m launcher.export`` and ``python -m launcher.evaluate`` start from.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

RESOLVED, CHECKPOINT = "resolved_config.yaml", "checkpoint.pt"
"""The files of a run directory a run is read from."""


class RunError(Exception):
    """Why a run cannot be read (or used): one line for the user, and the command's exit status."""

    exit_code = 2


class NotARunDirectory(RunError):
    """The path is no run directory of ``python -m launcher`` (none, or it holds no ``resolved_config.yaml``)."""


class NoCheckpoint(RunError):
    """The run directory holds no readable ``checkpoint.pt``."""


class UnreadableRun(RunError):
    """The run's policy cannot be rebuilt here: its recipe, its config, its env or its weights cannot be loaded."""


@dataclass
class Run:
    """A run directory, read: its config, its recipe, its env and the policy of its checkpoint.

    Attributes:
        run_dir: the run directory (absolute).
        config: ``resolved_config.yaml`` as a DictConfig.
        recipe: the run's `recipes.base.Recipe`.
        recipe_config: the recipe's config object, from the resolved config.
        maker: the env's `components.envs.EnvMaker`.
        spec: the env's spaces (`components.envs.EnvSpec`).
        policy: the recipe's ``make_policy``, with the checkpoint's weights (in eval mode).
        frames: the checkpoint's frame count.
        policy_version: the weight-sync version of the checkpoint's weights.
        weights_from: which of the checkpoint's kept objects held the policy's weights (``learner``...).
    """

    run_dir: str
    config: Any
    recipe: Any
    recipe_config: Any
    maker: Any
    spec: Any
    policy: Any
    frames: int
    policy_version: int
    weights_from: str = ""
    title: str = field(default="")


def read_run(run_dir: str) -> Run:
    """Read a run directory and rebuild its policy with the checkpoint's weights.

    Raises:
        NotARunDirectory: no such directory, or one without ``resolved_config.yaml`` (a sweep's directory names its
            runs).
        NoCheckpoint: no ``checkpoint.pt``, or one that cannot be read.
        UnreadableRun: the recipe, its config, the env or the weights cannot be loaded here.
    """
    path = os.path.abspath(os.path.expanduser(run_dir))
    if not os.path.isdir(path):
        raise NotARunDirectory(f"{run_dir} is not a directory: name the run directory of a python -m launcher run "
                               f"(it holds {RESOLVED} and {CHECKPOINT})")
    if not os.path.isfile(os.path.join(path, RESOLVED)):
        runs = sorted(d for d in os.listdir(path) if os.path.isfile(os.path.join(path, d, RESOLVED)))
        hint = (f"; it holds the runs {', '.join(runs[:5])}{'...' if len(runs) > 5 else ''}: name one of them" if runs
                else "")
        raise NotARunDirectory(f"{run_dir} is not a run directory: it holds no {RESOLVED}{hint}")
    checkpoint = os.path.join(path, CHECKPOINT)
    if not os.path.isfile(checkpoint):
        raise NoCheckpoint(f"{run_dir} holds no {CHECKPOINT}: a run writes one with launcher.checkpoint_every=<frames> "
                           "(0, the default, writes none)")
    from omegaconf import OmegaConf

    from .checkpointing import load

    try:
        state = load(checkpoint)
    except ValueError as exc:
        raise NoCheckpoint(str(exc)) from None
    config = OmegaConf.load(os.path.join(path, RESOLVED))
    recipe = _recipe(path, state)
    recipe_config = _recipe_config(recipe, config)
    maker, spec = _env(config)
    try:
        policy = recipe.make_policy(recipe_config, spec)
    except Exception as exc:  # noqa: BLE001 - a policy that cannot be built here: say which and why
        raise UnreadableRun(f"recipe {recipe.name}'s make_policy failed: {type(exc).__name__}: {exc}") from exc
    weights_from = _load_weights(policy, state.get("recipe"), recipe.name)
    policy.eval()
    title = getattr(recipe_config, "variant", None) or recipe.name
    return Run(path, config, recipe, recipe_config, maker, spec, policy, int(state.get("frames") or 0),
               int(state.get("policy_version") or 0), weights_from, title)


def _recipe(run_dir: str, state: dict) -> Any:
    """The run's recipe: the checkpoint names it (a built-in one by name); a recipe of one's own is found by the
    reference the run was started with (``+recipe=my_pkg.my_module:RECIPE``, in Hydra's record of the run)."""
    from recipes.registry import RECIPES, get_recipe, is_reference

    name = (state.get("run") or {}).get("recipe")
    if name in RECIPES:
        return get_recipe(name)
    choice = _hydra_choice(run_dir, "recipe")
    if choice is not None and is_reference(choice):
        try:
            return get_recipe(choice)
        except Exception as exc:  # noqa: BLE001 - its module is not importable here, most often
            raise UnreadableRun(f"the run's recipe {choice} cannot be loaded: {exc} (run the export where the run "
                                "ran, with the recipe's package on PYTHONPATH)") from None
    raise UnreadableRun(f"the checkpoint's recipe {name!r} is no built-in recipe, and the run's record "
                        f"(.hydra/hydra.yaml) names no module:attribute reference to it")


def _hydra_choice(run_dir: str, group: str) -> str | None:
    from omegaconf import OmegaConf

    try:
        hydra = OmegaConf.load(os.path.join(run_dir, ".hydra", "hydra.yaml"))
        return OmegaConf.select(hydra, f"hydra.runtime.choices.{group}")
    except (OSError, ValueError):
        return None


def _recipe_config(recipe: Any, config: Any) -> Any:
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(recipe.config), config.recipe))
    except Exception as exc:  # noqa: BLE001 - a config written by another version of the recipe
        raise UnreadableRun(f"the run's recipe config does not fit recipe {recipe.name}'s "
                            f"{recipe.config.__name__}: {exc}") from None


def _env(config: Any) -> tuple[Any, Any]:
    from components.envs import EnvMaker
    from transports.kernel.errors import ConfigurationError

    try:
        maker = EnvMaker.from_config(config.env)
        return maker, maker.spec()
    except ConfigurationError as exc:
        raise UnreadableRun(f"the run's env cannot be made here: {exc.message}") from None


def _load_weights(policy: Any, kept: Any, recipe: str) -> str:
    """Load the policy's weights from the checkpoint's kept object that holds them (the learner's ``policy.``
    entries, or the behaviour policy itself); returns its name."""
    wanted = list(policy.state_dict())
    for name, values in (kept or {}).items():
        if not isinstance(values, dict) or not all(isinstance(v, torch.Tensor) for v in values.values()):
            continue
        for key in values:
            prefix = key[:-len(wanted[0])] if key.endswith(wanted[0]) else None
            if prefix is not None and all(prefix + k in values for k in wanted):
                try:
                    policy.load_state_dict({k: values[prefix + k] for k in wanted})
                except RuntimeError as exc:
                    raise UnreadableRun(f"the checkpoint's {name!r} does not fit recipe {recipe}'s policy as "
                                        f"this config builds it: {str(exc).splitlines()[0]}") from None
                return name
    raise UnreadableRun(f"no object the checkpoint keeps holds the weights of recipe {recipe}'s policy "
                        f"(its state {wanted[:3]}...)")
