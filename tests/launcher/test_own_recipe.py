"""A recipe outside this repository: written into a temporary module, named ``+recipe=<module>:<attribute>``, planned
and run by the launcher in this process; a reference that leads to no recipe is a typed configuration error."""

from __future__ import annotations

import glob
import json
import os
import sys
import textwrap

import pytest

from launcher.references import forget_references
from recipes import RecipeNotFoundError, load_recipe
from tests.helpers import cli_in_process
from tests.user_code import OWN_RECIPE


@pytest.fixture
def own_module(tmp_path, monkeypatch):
    """The name of a module holding a recipe of its own, importable from a temporary folder."""
    name = f"own_recipe_{os.getpid()}_{tmp_path.name.replace('-', '_')}"
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / f"{name}.py").write_text(textwrap.dedent(OWN_RECIPE))
    monkeypatch.syspath_prepend(str(folder))
    yield name
    forget_references()  # the reference's option in the recipe group goes with it: other tests list the group
    sys.modules.pop(name, None)


def test_a_recipe_of_your_own_plans_and_runs_through_the_launcher(own_module, tmp_path):
    proc = cli_in_process(f"+recipe={own_module}:RECIPE", "recipe.num_envs=4", "launcher.progress=false",
                          "launcher.plot=false", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    [summary] = glob.glob(str(tmp_path / "outputs" / "*" / "*" / "summary.json"))
    assert json.loads(open(summary).read())["frames"] == 64
    metrics = open(os.path.join(os.path.dirname(summary), "metrics.csv")).read()
    assert "own/rows" in metrics


def test_a_registration_function_names_a_recipe_too(own_module, tmp_path):
    proc = cli_in_process(f"+recipe={own_module}:register", "recipe.num_steps=16", "launcher.dry_run=true",
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "tiny" in proc.stdout


@pytest.mark.parametrize("attribute, why", [("MISSING", "has no attribute 'MISSING'"),
                                            ("NOT_A_RECIPE", "is a int, not a recipes.base.Recipe"),
                                            ("TinyConfig", "is a type, not a recipes.base.Recipe")])
def test_a_reference_to_something_else_is_a_configuration_error(own_module, tmp_path, attribute, why):
    with pytest.raises(RecipeNotFoundError, match=why) as caught:
        load_recipe(f"{own_module}:{attribute}")
    assert caught.value.path == "recipe"
    proc = cli_in_process(f"+recipe={own_module}:{attribute}", "launcher.dry_run=true", cwd=str(tmp_path))
    assert proc.returncode == 2 and why in proc.stderr, proc.stderr


def test_a_missing_module_is_a_configuration_error(tmp_path):
    with pytest.raises(RecipeNotFoundError, match="no module named 'no_such_pkg.recipes'"):
        load_recipe("no_such_pkg.recipes:RECIPE")
    proc = cli_in_process("+recipe=no_such_pkg.recipes:RECIPE", "launcher.dry_run=true", cwd=str(tmp_path))
    assert proc.returncode == 2 and "no module named 'no_such_pkg.recipes'" in proc.stderr, proc.stderr
