"""Env families: a family is one module registering itself (plus its YAML), and the config, the maker, the backends
and the encoder choice find it in the registry."""

import dataclasses
import importlib
import sys

import numpy as np
import pytest

from components.envs import EnvMaker, VectorEnvStepper
from components.envs.family import configurable, families, register, unregister
from components.errors import ConfigurationError
from launcher import schema
from launcher.plan import build_plan
from recipes.networks import choose

TOY_FAMILY = '''
"""A toy family: CartPole seen as frames, its rewards scaled and its episodes capped by its own config."""
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from components.envs.family import EnvFamily, register


@dataclass
class ToyConfig:
    scale: float = 2.0
    steps: int = 5


class Toy(EnvFamily):
    name, config, encoder = "toy", ToyConfig, "impala_cnn"

    def make_kwargs(self, config):
        return {"max_episode_steps": config.steps}

    def wrap(self, env, config):
        frames = gym.spaces.Box(0, 255, (3, 40, 40), np.uint8)
        env = gym.wrappers.TransformObservation(env, lambda obs: np.full((3, 40, 40), int(abs(obs[0]) * 100) % 256,
                                                                        np.uint8), frames)
        return gym.wrappers.TransformReward(env, lambda reward: reward * config.scale)


register(Toy())
'''

TOY_YAML = """defaults:
  - base_env
  - _self_

id: CartPole-v1
toy: {}
"""


@pytest.fixture
def toy_family(tmp_path, monkeypatch):
    """The toy family imported from a module in ``tmp_path`` and its YAML in ``tmp_path/conf/env``; unregistered
    afterwards (the schema registered again without it)."""
    name = f"toy_family_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(TOY_FAMILY)
    (tmp_path / "conf" / "env").mkdir(parents=True)
    (tmp_path / "conf" / "env" / "toy.yaml").write_text(TOY_YAML)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        importlib.import_module(name)
        schema.register()  # the env schema takes the families registered so far
        yield tmp_path / "conf"
    finally:
        unregister("toy")
        sys.modules.pop(name, None)
        schema.register()


def test_a_family_from_its_own_module_is_configured_made_and_stepped(toy_family, compose_cfg):
    cfg = compose_cfg("+recipe=ppo", "env=toy", f"hydra.searchpath=[file://{toy_family}]", "env.toy.scale=3")
    assert dict(cfg.env.toy) == {"scale": 3.0, "steps": 5}  # typed by the family's dataclass, its defaults filled in

    maker = EnvMaker.from_config(cfg.env)
    spec = maker.spec()
    assert spec.observation_shape == (3, 40, 40) and spec.encoder == "impala_cnn"
    # the family is asked: by their size alone, these frames would go to the Nature CNN
    assert choose("auto", spec.observation_shape) == "nature_cnn"
    assert choose("auto", spec.observation_shape, preferred=spec.encoder) == "impala_cnn"
    assert build_plan(cfg).env["toy"] == {"scale": 3.0, "steps": 5}  # the launcher plans with the family's config

    stepper = VectorEnvStepper(maker.vector(2), seed=0)
    try:
        rewards, lengths = [], []
        for _ in range(5):
            td = stepper.step(stepper.observation().set("action", np.zeros(2, dtype=np.int64)))
            rewards.append(td["next", "reward"])
            lengths.append(td["next", "episode_length"])
            assert td["next", "observation"].shape == (2, 3, 40, 40)
        assert all((reward == 3.0).all() for reward in rewards)  # CartPole's 1.0, scaled by env.toy.scale
        assert td["next", "done"].all() and (lengths[-1] == 5).all()  # capped by env.toy.steps unless it fell first
    finally:
        stepper.close()


def test_an_unregistered_family_is_gone_from_the_schema_and_the_maker(toy_family):
    assert "toy" in configurable()
    unregister("toy")
    schema.register()
    assert "toy" not in configurable()
    assert "toy" not in {f.name for f in dataclasses.fields(schema.SCHEMAS["env"]["base_env"])}
    with pytest.raises(ConfigurationError, match="env.toy is no env family's preprocessing") as info:
        EnvMaker(id="CartPole-v1", toy={})
    assert info.value.path == "env.toy"


def test_the_built_in_families_register_themselves_and_one_env_takes_one_preprocessing(toy_family):
    assert {"atari", "minatar", "mujoco", "classic_control"} <= {family.name for family in families()}
    assert [family.name for family in families()][-1] == "toy"  # the built-ins come first
    with pytest.raises(ConfigurationError, match="env.atari and env.toy are both set") as info:
        EnvMaker(id="CartPole-v1", atari={}, toy={})
    assert info.value.path == "env.toy"


def test_a_family_needs_a_name_and_a_dataclass_config():
    from components.envs.family import EnvFamily

    class Nameless(EnvFamily):
        pass

    class Loose(EnvFamily):
        name, config = "loose", dict

    with pytest.raises(ValueError, match="has no name"):
        register(Nameless())
    with pytest.raises(ValueError, match="config must be a dataclass"):
        register(Loose())
