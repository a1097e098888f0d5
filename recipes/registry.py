"""Which recipes a run can name: the built-in ones by name (``+recipe=ppo``), and a recipe of your own, outside this
repository, by reference (``+recipe=my_pkg.my_module:MY_RECIPE``).

A reference is ``<module>:<attribute>``: the module is imported (it must be importable, e.g. on ``PYTHONPATH``), and
the attribute is a `Recipe`, or a function taking no argument that returns one (a registration
function). A reference that does not lead to a recipe is a `RecipeNotFoundError`, a configuration error.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from components.errors import ConfigurationError

from .base import Recipe
from .configs import DQNConfig, IMPALAConfig, PPOConfig

RECIPES: dict[str, type] = {"ppo": PPOConfig, "dqn": DQNConfig, "impala": IMPALAConfig}
"""The built-in recipes by name, each ``recipes/<name>.py`` declaring ``RECIPE``, with its config class (from the
torch-free `recipes.configs`, so the launcher's schema names them without importing torch)."""

_loaded: dict[str, Recipe] = {}  # recipes loaded by reference, by their name


class RecipeNotFoundError(ConfigurationError):
    """A recipe reference (``module:attribute``) whose module is missing, whose attribute is missing, or whose
    attribute is not a recipe.

    Args:
        reference: the reference as written.
        why: what is wrong with it.
    """

    def __init__(self, reference: str, why: str):
        self.reference = reference
        super().__init__(f"recipe={reference}: {why}", path="recipe")


def is_reference(name: str) -> bool:
    """Whether ``name`` is a ``module:attribute`` reference rather than a built-in recipe's name."""
    return ":" in name


def load_recipe(reference: str) -> Recipe:
    """The recipe a ``module:attribute`` reference names (imported once; afterwards found by its name too).

    Args:
        reference: ``<module>:<attribute>``, the attribute a `Recipe` or a function returning one.

    Returns:
        The recipe.

    Raises:
        RecipeNotFoundError: the module cannot be imported, it has no such attribute, the attribute is not a
            recipe, or the recipe takes a built-in recipe's name.
    """
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise RecipeNotFoundError(reference, "write it as <module>:<attribute>, e.g. my_pkg.my_module:RECIPE")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_name.startswith(exc.name):  # the module exists; one it imports does not
            raise
        raise RecipeNotFoundError(reference,
                                  f"no module named {module_name!r} (is its folder on PYTHONPATH?)") from None
    try:
        found: Any = getattr(module, attribute)
    except AttributeError:
        raise RecipeNotFoundError(reference, f"module {module_name!r} has no attribute {attribute!r}") from None
    if callable(found) and not isinstance(found, Recipe) and not isinstance(found, type):
        found = found()  # a registration function
    if not isinstance(found, Recipe):
        raise RecipeNotFoundError(reference, f"{module_name}.{attribute} is a {type(found).__name__}, not a "
                                             "recipes.base.Recipe (nor a function returning one)")
    if found.name in RECIPES:
        raise RecipeNotFoundError(reference, f"its name {found.name!r} is a built-in recipe's: give it another")
    _loaded[found.name] = found
    return found


def unload_references() -> None:
    """Forget the recipes loaded by reference (their modules stay imported)."""
    _loaded.clear()


def get_recipe(name: str) -> Recipe:
    """A recipe by its name (built-in, or loaded by reference before) or by its ``module:attribute`` reference.

    Raises:
        KeyError: no recipe of that name.
        RecipeNotFoundError: a reference that does not lead to a recipe.
    """
    if name in RECIPES:
        return importlib.import_module(f"recipes.{name}").RECIPE
    if name in _loaded:
        return _loaded[name]
    if is_reference(name):
        return load_recipe(name)
    raise KeyError(name)


def recipe_for_config(config: Any) -> Recipe | None:
    """The recipe whose config class ``config`` is: one loaded by reference, a built-in one, or one declared in the
    module of ``config``'s class (a process that loaded no reference itself); failing those, the built-in recipe whose
    config class ``config``'s extends. ``None``: none."""
    builtin = [get_recipe(name) for name in RECIPES]
    module = sys.modules.get(type(config).__module__)
    declared = [value for value in vars(module).values() if isinstance(value, Recipe)] if module else []
    for recipe in [*_loaded.values(), *builtin, *declared]:
        if type(config) is recipe.config:
            if recipe.name not in RECIPES:
                _loaded.setdefault(recipe.name, recipe)
            return recipe
    return next((recipe for recipe in builtin if isinstance(config, recipe.config)), None)
