"""Training recipes: functions of (config, clients) that run unchanged in every placement.

Built-in recipes are named (``+recipe=ppo``); a recipe of your own lives in your own module and is named by
reference (``+recipe=my_pkg.my_module:RECIPE``, `recipes.registry`).
"""

from .base import Checkpoint, Clients, Loop, NoCheckpoint, Progress, Recipe
from .configs import RecipeConfig
from .registry import RECIPES, RecipeNotFoundError, get_recipe, load_recipe

__all__ = ["Checkpoint", "Clients", "Loop", "NoCheckpoint", "Progress", "RECIPES", "Recipe", "RecipeConfig",
           "RecipeNotFoundError", "get_recipe", "load_recipe"]
