"""Every owner is called the same way: ``Owner(config, *, dependencies..., transport=None, resolved=None)``.

The owners are found, not listed: every :class:`~components.service.Owner` subclass defined in a component's package,
so an owner added later is held to the convention too.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import pytest

import components
from components import compat
from components.service import Owner, owner_parameters


def _component_packages() -> list[str]:
    """The packages of components/ that declare a component (they hold a ``declaration`` module)."""
    return [info.name for info in pkgutil.iter_modules(components.__path__, "components.")
            if info.ispkg and importlib.util.find_spec(f"{info.name}.declaration") is not None]


def _owner_classes() -> list[type]:
    for package in _component_packages():
        for info in pkgutil.walk_packages(importlib.import_module(package).__path__, f"{package}."):
            importlib.import_module(info.name)
    found, todo = set(), [Owner]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                todo.append(sub)
    return sorted((c for c in found if c.__module__.startswith("components.")), key=lambda c: c.__qualname__)


OWNERS = _owner_classes()


def test_every_component_of_the_table_has_an_owner():
    assert {owner.component for owner in OWNERS} == set(compat.COMPONENTS)


@pytest.mark.parametrize("owner", OWNERS, ids=lambda c: c.__name__)
def test_an_owner_takes_its_config_first_then_everything_by_keyword(owner):
    params = owner_parameters(owner)
    config = params[0]
    assert (config.name, config.kind, config.default) == ("config", config.POSITIONAL_OR_KEYWORD, None)
    rest = params[1:]
    assert [p.name for p in rest if p.kind is not p.KEYWORD_ONLY] == [], "everything after config is keyword-only"
    names = [p.name for p in rest]
    assert names[-1] == "resolved" and rest[-1].default is None
    if "transport" in names:
        assert names[-2] == "transport", "transport comes right before resolved"
    fields = {f.name for f in dataclasses.fields(compat.declaration(owner.component).config)}
    assert (set(names) & fields) - {"transport"} == set(), "an option has one place: the config"


def _config_field(owner) -> str:
    """One field of the owner's config (its own options first) that is not also a keyword of the owner."""
    fields = [f.name for f in dataclasses.fields(compat.declaration(owner.component).config)]
    return [f for f in reversed(fields) if f != "transport"][0]


@pytest.mark.parametrize("owner", OWNERS, ids=lambda c: c.__name__)
def test_a_call_outside_the_convention_names_the_owner_and_the_argument(owner):
    config_class = compat.declaration(owner.component).config
    dependency = [p.name for p in owner_parameters(owner)][1]
    with pytest.raises(TypeError, match=rf"{owner.__name__} takes its config as its one positional argument .*"
                                        rf"got 2 positional arguments.*{dependency}="):
        owner(None, object())
    with pytest.raises(TypeError, match=rf"{owner.__name__}'s positional argument is its config "
                                        rf"\({config_class.__name__}\), got object: pass dependencies by keyword"):
        owner(object())
    field = _config_field(owner)
    with pytest.raises(TypeError, match=rf"{owner.__name__} got {field}=, a field of {config_class.__name__}: "
                                        rf"options live in the config"):
        owner(**{field: None})
    with pytest.raises(TypeError, match=rf"{owner.__name__} got an unexpected keyword argument 'bogus'"):
        owner(bogus=1)


def test_an_owner_without_a_config_takes_its_config_classs_defaults():
    from components.replay import ReplayBuffer, ReplayConfig

    buffer = ReplayBuffer()
    assert buffer.config == ReplayConfig() and buffer.capacity == ReplayConfig().capacity
    assert inspect.signature(ReplayBuffer).parameters["config"].default is None
