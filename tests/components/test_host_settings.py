"""Each placement's session settings are one dataclass in its host module: the YAML schema, the defaults and the
ranges its host reads."""

import dataclasses

import pytest

from components.errors import ConfigurationError
from components.hosts.rpc import RpcSettings
from components.hosts.settings import SETTINGS, settings_class, settings_classes, settings_of


def test_every_placement_with_settings_names_its_hosts_dataclass():
    classes = settings_classes()
    assert list(classes) == list(SETTINGS) == ["ray", "submitit", "distributed", "rpc"]
    for placement, cls in classes.items():
        assert dataclasses.is_dataclass(cls) and cls.__module__.startswith("components.hosts.")
    assert settings_class("thread") is None


@pytest.mark.parametrize("placement", list(SETTINGS))
def test_unset_values_take_the_defaults(placement):
    cls = settings_class(placement)
    node = {f.name: None for f in dataclasses.fields(cls)}
    assert settings_of(cls, node) == cls() == settings_of(cls, None)


@pytest.mark.parametrize("placement, key, value", [
    ("ray", "connect_timeout", 0), ("submitit", "mem_gb", 0), ("submitit", "timeout_min", 0),
    ("distributed", "port", 70000), ("rpc", "threads", 1)])
def test_a_value_out_of_its_declared_range_names_its_config_path(placement, key, value):
    with pytest.raises(ConfigurationError) as info:
        settings_of(settings_class(placement), {key: value})
    assert info.value.path == f"{placement}.{key}"


def test_an_unknown_key_is_refused():
    with pytest.raises(TypeError, match="no field 'colour'"):
        settings_of(settings_class("ray"), {"colour": "blue"})


def test_an_rpc_interface_is_checked_where_the_world_is_made_not_while_planning():
    planned = RpcSettings(interface="no-such-interface")  # a plan may be made for another machine
    with pytest.raises(ConfigurationError) as info:
        planned.check_here()
    assert info.value.path == "rpc.interface" and "lo" in info.value.alternatives
