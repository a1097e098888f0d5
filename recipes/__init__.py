"""Training recipes: functions of (config, clients) that run unchanged in every placement."""

from .base import Checkpoint, Clients, NoCheckpoint, Progress, Recipe

RECIPES = ("ppo", "dqn", "impala")


def get_recipe(name: str) -> Recipe:
    """Import and return the :class:`Recipe` declared by ``recipes/<name>.py``."""
    import importlib

    if name not in RECIPES:
        raise KeyError(name)
    return importlib.import_module(f"recipes.{name}").RECIPE


__all__ = ["Checkpoint", "Clients", "NoCheckpoint", "Progress", "RECIPES", "Recipe", "get_recipe"]
