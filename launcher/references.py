"""Recipes a command line names by reference (``+recipe=my_pkg.my_module:RECIPE``): each one's config class becomes
an option of Hydra's ``recipe`` group, named by the reference, before any config is composed."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from recipes.registry import is_reference, load_recipe, unload_references

from .conventions import normalize_argv


def register_references(argv: list[str]) -> None:
    """Load every recipe ``argv`` names by ``module:attribute`` (``recipe=...``, a sweep's values too) and register
    its config class as option ``<reference>`` of the ``recipe`` group.

    Raises:
        RecipeNotFoundError: a reference that does not lead to a recipe (a configuration error).
    """
    store = ConfigStore.instance()
    for arg in normalize_argv(list(argv)):
        key, _, value = arg.partition("=")
        if key != "recipe":
            continue
        for reference in value.split(","):
            if is_reference(reference):
                store.store(group="recipe", name=reference, node=load_recipe(reference).config)


def forget_references() -> None:
    """Undo `register_references`: drop the ``recipe`` group's options named by reference and the recipes they
    loaded, for a process that launches one command line after another (their modules stay imported)."""
    options = ConfigStore.instance().repo.get("recipe", {})
    for option in [o for o in options if is_reference(o)]:
        del options[option]
    unload_references()
