"""One source per option: every schema is the dataclass its code reads (host settings, component configs, logger
backends, recipe configs), keeps its defaults and types in step with the constructors that still take keywords, and
every YAML option is typed and states only what differs from its dataclass."""

import collections.abc
import dataclasses
import importlib
import inspect
import os
import subprocess
import sys
import types
import typing

import pytest
import yaml
from omegaconf import MISSING, OmegaConf

from launcher import schema

from tests.helpers import ROOT

LIFECYCLE_ARGS = {"self", "placement", "transport", "resolved"}


def _resolve(dotted):
    module, name = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def _params(target) -> set:
    if dataclasses.is_dataclass(target):
        return {f.name for f in dataclasses.fields(target)}
    sig = inspect.signature(target)
    return {
        n for n, p in sig.parameters.items()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n not in LIFECYCLE_ARGS
    }


def _defaults(target) -> dict:
    """``name -> (default, type hint)`` of a dataclass's fields or a callable's keyword parameters."""
    if dataclasses.is_dataclass(target):
        hints = typing.get_type_hints(target)
        return {f.name: (_default(f), hints[f.name]) for f in dataclasses.fields(target)}
    hints = typing.get_type_hints(target.__init__ if isinstance(target, type) else target)
    return {n: (p.default, hints.get(n, typing.Any)) for n, p in inspect.signature(target).parameters.items()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n not in LIFECYCLE_ARGS}


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return inspect.Parameter.empty


@pytest.mark.parametrize("conf, targets, ignored", schema.PARITY, ids=[p[0].__name__ for p in schema.PARITY])
def test_schema_fields_match_constructor_arguments(conf, targets, ignored):
    fields = {f.name for f in dataclasses.fields(conf)} - set(ignored)
    params = set().union(*(_params(_resolve(t)) for t in targets)) - LIFECYCLE_ARGS
    assert fields == params, f"{conf.__name__}: only in schema {fields - params}, only in constructor {params - fields}"


@pytest.mark.parametrize("conf, targets, ignored", schema.PARITY, ids=[p[0].__name__ for p in schema.PARITY])
def test_schema_defaults_and_types_match_constructor_arguments(conf, targets, ignored):
    fields = _defaults(conf)
    for target in targets:
        for name, (default, hint) in _defaults(_resolve(target)).items():
            if name in ignored or name not in fields or default is inspect.Parameter.empty:
                continue
            field_default, field_hint = fields[name]
            if default is None and field_default in ({}, [], ()):  # None for a mutable default: the empty container
                hint = next(a for a in typing.get_args(hint) if a is not type(None))
            else:
                assert default == field_default, (f"{conf.__name__}.{name}: default {field_default!r}, "
                                                  f"{target} {default!r}")
            assert _plain(hint) == _plain(field_hint), f"{conf.__name__}.{name}: type {field_hint}, {target} {hint}"


def _plain(hint):
    """``Dict[str, Any]`` and ``dict[str, Any]``, ``Optional[int]`` and ``int | None`` alike."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return frozenset(_plain(a) for a in args)
    origin = {collections.abc.Mapping: dict, collections.abc.Sequence: list}.get(typing.get_origin(hint),
                                                                                typing.get_origin(hint))
    return (origin, tuple(_plain(a) for a in args)) if origin is not None else hint


def _every_schema() -> list[tuple[str, type]]:
    """``(config path, dataclass)`` of every schema: host settings, component configs, logger backends, recipes."""
    from components import compat
    from components.hosts.settings import settings_classes

    found = list(settings_classes().items())
    found += [(f"components.{name}", compat.declaration(name).config) for name in compat.COMPONENTS]
    for group in ("logger", "recipe"):
        found += [(f"{group}={option.removeprefix('base_')}", cls) for option, cls in schema.SCHEMAS[group].items()]
    return found


def _accepts(hint, value) -> bool:
    """Whether ``value`` is of type ``hint`` (an int passes a float field: YAML writes 5 for 5.0)."""
    if hint is typing.Any or value is None and type(None) in typing.get_args(hint):
        return True
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(a, value) for a in args)
    if origin is not None:
        return isinstance(value, origin)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, hint)


@pytest.mark.parametrize("path, kind", _every_schema(), ids=lambda v: v if isinstance(v, str) else v.__name__)
def test_every_default_has_its_declared_type(path, kind):
    for name, (default, hint) in _defaults(kind).items():
        if default is not inspect.Parameter.empty and default is not MISSING:
            assert _accepts(hint, default), f"{path}.{name}: default {default!r} is no {hint}"


@pytest.mark.parametrize("path, kind", _every_schema(), ids=lambda v: v if isinstance(v, str) else v.__name__)
def test_the_composed_schema_holds_the_dataclass_defaults(path, kind):
    node = OmegaConf.structured(kind)
    assert OmegaConf.get_type(node) is kind
    for name, (default, hint) in _defaults(kind).items():
        if default is inspect.Parameter.empty or OmegaConf.is_missing(node, name):
            continue
        value = node[name]
        value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        expected = dataclasses.asdict(default) if dataclasses.is_dataclass(default) else default
        assert value == expected, f"{path}.{name}: the schema says {value!r}, the dataclass {expected!r}"


def test_each_host_settings_class_types_its_node_and_has_no_twin(compose_cfg):
    from components.hosts.settings import settings_classes

    cfg = compose_cfg("+recipe=ppo")
    twins = {tuple(sorted(f.name for f in dataclasses.fields(c))): c for c in vars(schema).values()
             if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == schema.__name__}
    for placement, cls in settings_classes().items():
        assert OmegaConf.get_type(cfg[placement]) is cls, placement
        assert tuple(sorted(f.name for f in dataclasses.fields(cls))) not in twins, f"{placement}: a twin in schema"


def test_targets_name_the_configured_class():
    for conf, targets, _ in schema.PARITY:
        target = next((f.default for f in dataclasses.fields(conf) if f.name == "_target_"), None)
        if target is not None:
            assert target == targets[0]


def _yaml_files():
    conf_dir = os.path.join(ROOT, "conf")
    for group in sorted(os.listdir(conf_dir)):
        folder = os.path.join(conf_dir, group)
        if os.path.isdir(folder) and group in schema.SCHEMAS:
            for name in sorted(os.listdir(folder)):
                if name.endswith(".yaml"):
                    yield group, name[:-5], os.path.join(folder, name)


@pytest.mark.parametrize("group, option, path", list(_yaml_files()), ids=lambda v: str(v))
def test_every_yaml_option_starts_from_its_schema(group, option, path):
    with open(path) as f:
        data = yaml.safe_load(f)
    base = data["defaults"][0]
    assert data["defaults"][-1] == "_self_"
    assert base in schema.SCHEMAS[group], f"{path}: {base!r} is not a registered schema of group {group!r}"
    if group == "service":
        assert base == f"base_{option}"


@pytest.mark.parametrize("group", ["service", "transport"])
def test_every_service_and_transport_option_composes_to_its_own_name(compose_cfg, group):
    for option in sorted(o for g, o, _ in _yaml_files() if g == group):
        assert compose_cfg("+recipe=ppo", f"{group}={option}")[group].name == option


def _restated(data: dict, kind: type, base: dict, path: str):
    """The keys of YAML ``data`` that say what ``base`` (the dataclass defaults, and what an earlier YAML set) says."""
    hints = typing.get_type_hints(kind)
    for key, value in data.items():
        if key == "defaults" or key not in hints:
            continue
        nested = next((a for a in (hints[key], *typing.get_args(hints[key])) if dataclasses.is_dataclass(a)), None)
        if nested is not None and isinstance(value, dict) and isinstance(base.get(key), dict):
            yield from _restated(value, nested, base[key], f"{path}.{key}" if path else key)
        elif key in base and value == base[key]:
            yield f"{path}.{key}" if path else key


def _base_of(kind: type) -> dict:
    return {n: dataclasses.asdict(d) if dataclasses.is_dataclass(d) else d
            for n, (d, _) in _defaults(kind).items() if d is not inspect.Parameter.empty}


def _group_yaml(group: str, option: str) -> dict:
    with open(os.path.join(ROOT, "conf", group, f"{option}.yaml")) as f:
        return yaml.safe_load(f) or {}


def _yaml_with_schema():
    """``(file, its data, its dataclass, what it starts from)`` of every YAML of ``conf/``."""
    for group, option, path in _yaml_files():
        data = _group_yaml(group, option)
        kind = schema.SCHEMAS[group][data["defaults"][0]]
        yield path, data, kind, _base_of(kind)
    recipes = {option for group, option, _ in _yaml_files() if group == "recipe"}
    envs = {option for group, option, _ in _yaml_files() if group == "env"}
    folder = os.path.join(ROOT, "conf", "recipe_env")
    for name in sorted(os.listdir(folder)):
        recipe = next((r for r in recipes for e in envs if name == f"{r}_{e}.yaml"), None)
        if recipe is None:
            continue
        data = _group_yaml("recipe", recipe)
        kind = schema.SCHEMAS["recipe"][data["defaults"][0]]
        base = {**_base_of(kind), **{k: v for k, v in data.items() if k != "defaults"}}
        with open(os.path.join(folder, name)) as f:
            yield os.path.join(folder, name), yaml.safe_load(f) or {}, kind, base
    with open(os.path.join(ROOT, "conf", "config.yaml")) as f:
        yield os.path.join(ROOT, "conf", "config.yaml"), yaml.safe_load(f), schema.config_schema(), \
            _base_of(schema.config_schema())


@pytest.mark.parametrize("path, data, kind, base", list(_yaml_with_schema()),
                         ids=lambda v: os.path.relpath(v, ROOT) if isinstance(v, str) else "")
def test_no_yaml_restates_a_default(path, data, kind, base):
    restated = list(_restated(data, kind, base, ""))
    assert not restated, f"{os.path.relpath(path, ROOT)} restates what its dataclass says: {restated}"


@pytest.mark.parametrize("group, option, path", list(_yaml_files()), ids=lambda v: str(v))
def test_every_yaml_option_composes(compose_cfg, group, option, path):
    overrides = [f"{group}={option}"] + ([] if group == "recipe" else ["+recipe=ppo"])
    cfg = compose_cfg(*overrides)
    assert cfg[group] is not None


def test_transport_yaml_names_match_transport_kinds():
    from transports import transport_kinds

    options = {option for group, option, _ in _yaml_files() if group == "transport"}
    assert options == set(transport_kinds())


def test_unknown_keys_are_rejected_at_compose_time(compose_cfg):
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose_cfg("+recipe=ppo", "components.replay.colour=blue")
    with pytest.raises(ConfigCompositionException):
        compose_cfg("+recipe=ppo", "recipe.learning_rate=0.1")


COMPOSE_IN_A_FRESH_INTERPRETER = """
import sys
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
import launcher.schema
from launcher.conventions import normalize_argv

launcher.schema.register()
with initialize_config_module(config_module="conf", version_base=None):
    for name in ("ppo", "dqn"):
        cfg = compose(config_name="config", overrides=normalize_argv([f"+recipe={name}"]))
        print(name, OmegaConf.get_type(cfg.recipe).__name__)
print("heavy:", sorted(m for m in ("torch", "tensordict", "gymnasium") if m in sys.modules))
"""


@pytest.mark.slow
def test_composing_a_config_imports_no_torch():
    # a fresh interpreter: this test process imported torch long ago
    proc = subprocess.run([sys.executable, "-c", COMPOSE_IN_A_FRESH_INTERPRETER], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["ppo PPOConfig", "dqn DQNConfig", "heavy: []"], proc.stdout
