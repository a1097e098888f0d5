"""Config schemas stay in step with the constructors they configure, and every YAML option is typed."""

import dataclasses
import importlib
import inspect
import os
import subprocess
import sys

import pytest
import yaml

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


@pytest.mark.parametrize("conf, targets, ignored", schema.PARITY, ids=[p[0].__name__ for p in schema.PARITY])
def test_schema_fields_match_constructor_arguments(conf, targets, ignored):
    fields = {f.name for f in dataclasses.fields(conf)} - set(ignored)
    params = set().union(*(_params(_resolve(t)) for t in targets)) - LIFECYCLE_ARGS
    assert fields == params, f"{conf.__name__}: only in schema {fields - params}, only in constructor {params - fields}"


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
        assert base == f"base_{option}" and data["name"] == option
    if group == "transport":
        assert data["name"] == option


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
