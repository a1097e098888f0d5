"""Your own code from YAML by ``_target_``: a policy network, an environment, a logger backend.

Each is named in the config, built where it is used, and a bad name fails before anything starts with a
``ConfigurationError`` naming the config path.
"""

import json
import pickle
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from omegaconf import OmegaConf
from torch import nn

from components.envs import EnvMaker, spec_of
from components.errors import ConfigurationError
from components.logger import backend_class
from launcher.plan import build_plan
from launcher.run import execute
from recipes import get_recipe
from recipes.examples.custom_mlp import CustomMLP

from tests.helpers import ROOT, run_cli
from tests.loggers import CustomLogger
from tests.user_code import JsonLinesLogger

NET = "{_target_:tests.user_code.two_layer_net,width:16}"


def _linears(module: nn.Module) -> list[tuple[int, int]]:
    return [(m.in_features, m.out_features) for m in module.modules() if isinstance(m, nn.Linear)]


# ---------------------------------------------------------------------------------------------- networks
def test_ppo_builds_actor_and_critic_from_the_network_the_yaml_names(compose_cfg):
    import recipes.ppo as ppo

    rcfg = OmegaConf.to_object(compose_cfg("+recipe=ppo", f"recipe.network={NET}").recipe)
    spec = spec_of("CartPole-v1")
    assert _linears(ppo.make_policy(rcfg, spec).actor.net) == [(4, 16), (16, 2)]
    assert _linears(ppo.Learner(rcfg, spec).critic) == [(4, 16), (16, 1)]
    pendulum = spec_of("Pendulum-v1")
    assert _linears(ppo.make_policy(rcfg, pendulum).actor.net) == [(3, 16), (16, 1)]  # one action dimension


def test_dqn_builds_its_q_network_from_the_network_the_yaml_names(compose_cfg):
    rcfg = OmegaConf.to_object(compose_cfg("+recipe=dqn", f"+recipe.network={NET}").recipe)
    assert _linears(get_recipe("dqn").make_policy(rcfg, spec_of("CartPole-v1")).q) == [(4, 16), (16, 2)]


def test_without_a_network_the_recipes_keep_their_built_in_mlp(compose_cfg):
    spec = spec_of("CartPole-v1")
    ppo = OmegaConf.to_object(compose_cfg("+recipe=ppo").recipe)
    dqn = OmegaConf.to_object(compose_cfg("+recipe=dqn").recipe)
    assert ppo.network is None and dqn.network is None
    assert _linears(get_recipe("ppo").make_policy(ppo, spec).actor.net) == [(4, 64), (64, 64), (64, 2)]
    assert _linears(get_recipe("dqn").make_policy(dqn, spec).q) == [(4, 128), (128, 128), (128, 2)]


def test_the_shipped_example_selects_the_custom_mlp(compose_cfg):
    cfg = compose_cfg("+recipe=ppo_custom_mlp", "recipe.network.hidden=[32,32,32]", "recipe.network.layer_norm=true")
    plan = build_plan(cfg)
    assert plan.recipe == "ppo"
    policy = get_recipe("ppo").make_policy(OmegaConf.to_object(cfg.recipe), spec_of("CartPole-v1"))
    assert isinstance(policy.actor.net, CustomMLP)
    assert _linears(policy.actor.net) == [(4, 32), (32, 32), (32, 32), (32, 2)]
    assert sum(isinstance(m, nn.LayerNorm) for m in policy.actor.net) == 3


@pytest.mark.parametrize("network, path, needle", [
    ("{_target_:tests.user_code.no_such_net}", "recipe.network._target_", "cannot import 'tests.user_code.no_such"),
    ("{_target_:tests.user_code.two_layer_net,depth:3}", "recipe.network", "unexpected keyword argument 'depth'"),
    ("{_target_:tests.user_code.not_a_module}", "recipe.network._target_", "returned a dict, not a torch.nn"),
    ("{_target_:recipes.examples.custom_mlp.CustomMLP,activation:Sigmoidal}", "recipe.network", "Sigmoidal"),
    ("{hidden:64}", "recipe.network._target_", "must be a mapping with _target_"),
], ids=["not-importable", "wrong-argument", "not-a-module", "raises", "no-target"])
def test_a_bad_network_fails_at_planning_naming_its_config_path(compose_cfg, network, path, needle):
    with pytest.raises(ConfigurationError) as info:
        build_plan(compose_cfg("+recipe=ppo", f"recipe.network={network}"))
    assert info.value.path == path and needle in info.value.message


@pytest.mark.slow
def test_the_custom_mlp_example_solves_cartpole_through_the_cli(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("+recipe=ppo_custom_mlp", "launcher.progress=false", f"hydra.run.dir={run_dir}", cwd=str(tmp_path),
                   timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["solved"] and summary["final_mean_return"] >= 475, summary
    assert "recipes.examples.custom_mlp.CustomMLP" in (run_dir / "resolved_config.yaml").read_text()


@pytest.mark.slow
def test_a_bad_target_exits_2_before_anything_starts(tmp_path):
    proc = run_cli("+recipe=ppo", "recipe.network={_target_:my_nets.missing}", f"hydra.run.dir={tmp_path}",
                   cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("configuration error: cannot import 'my_nets.missing'")
    assert "full_key: recipe.network._target_" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "plan.json").exists() and not (tmp_path / "metrics.csv").exists()


# ---------------------------------------------------------------------------------------------- environments
CORRIDOR = ("env.id=null", "env._target_=tests.user_code.make_corridor", "+env.kwargs.length=7")
TINY = ("+recipe=ppo", "recipe.num_envs=4", "recipe.num_steps=16", "recipe.total_frames=128",
        "recipe.target_return=null", "launcher.progress=false")


def test_a_user_env_factory_named_by_target_is_used(compose_cfg, tmp_path):
    cfg = compose_cfg(*TINY, *CORRIDOR)
    plan = build_plan(cfg)
    assert plan.env_id == "tests.user_code.make_corridor"
    assert plan["inference"].layouts["request"].describe() == "observation [4, 3] float32"  # the corridor's 3 features
    result = execute(plan, str(tmp_path))
    # every episode lasts exactly `length` steps of reward 1: the kwargs reached the factory in every env
    assert result["frames"] == 128 and result["episodes"] == 4 * (32 // 7)
    assert result["final_mean_return"] == 7.0


def test_a_user_env_factory_travels_pickled_and_is_vectorized_with_same_step_autoreset():
    maker = EnvMaker.from_config({"_target_": "tests.user_code.make_corridor", "kwargs": {"length": 2}})
    env = pickle.loads(pickle.dumps(partial(maker.vector, 3)))()  # what a collector process receives
    try:
        assert isinstance(env, gym.vector.SyncVectorEnv) and env.num_envs == 3
        assert env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
        env.reset(seed=0)
        env.step(np.zeros(3, dtype=np.int64))
        obs, _, terminated, _, info = env.step(np.zeros(3, dtype=np.int64))
        assert terminated.all() and (obs[:, 0] == 0).all()  # the same step already holds the reset observation
        assert (info["final_obs"][0] == [2.0, 0.0, 1.0]).all()
    finally:
        env.close()


def test_env_ids_keep_working_through_the_same_maker():
    maker = EnvMaker.from_config({"id": "CartPole-v1", "kwargs": {"max_episode_steps": 20}})
    assert maker.spec() == spec_of("CartPole-v1")
    env = maker.vector(3)
    try:
        assert env.num_envs == 3 and [e.spec.max_episode_steps for e in env.envs] == [20, 20, 20]  # the kwargs
    finally:
        env.close()


@pytest.mark.parametrize("overrides, path, needle", [
    (("env._target_=tests.user_code.make_corridor",), "env", "both name an environment"),
    (("env.id=null",), "env.id", "no environment"),
    (("env.id=null", "env._target_=tests.user_code.no_such_env"), "env._target_", "cannot import"),
    (("env.id=null", "env._target_=tests.user_code.two_layer_net", "+env.kwargs.in_features=3",
      "+env.kwargs.out_features=1"), "env._target_", "not a gymnasium.core.Env"),
    (("env.id=null", "env._target_=tests.user_code.make_corridor", "+env.kwargs.width=3"), "env",
     "unexpected keyword argument 'width'"),
], ids=["both", "neither", "not-importable", "not-an-env", "wrong-argument"])
def test_a_bad_env_fails_at_planning_naming_its_config_path(compose_cfg, overrides, path, needle):
    with pytest.raises(ConfigurationError) as info:
        build_plan(compose_cfg("+recipe=ppo", *overrides))
    assert info.value.path == path and needle in info.value.message, info.value


def test_an_untyped_env_node_with_other_keys_is_refused():
    with pytest.raises(ConfigurationError, match=r"unknown keys \['length'\]; the callable's arguments go under env"):
        EnvMaker.from_config({"_target_": "tests.user_code.make_corridor", "length": 7})


# ---------------------------------------------------------------------------------------------- loggers
def test_a_user_logger_class_named_on_the_command_line_is_used(compose_cfg, tmp_path):
    cfg = compose_cfg(*TINY, "logger._target_=tests.loggers.CustomLogger")
    owners = {}
    execute(build_plan(cfg), str(tmp_path), on_started=owners.update)
    assert type(owners["logger"].backend) is CustomLogger
    assert "train/mean_return" in (tmp_path / "metrics.csv").read_text()


def test_a_user_logger_yaml_with_options_of_its_own_is_used(compose_cfg, tmp_path):
    # a YAML in the user's own config directory (python -m launcher --config-dir DIR logger=jsonl), untyped
    (tmp_path / "conf" / "logger").mkdir(parents=True)
    (tmp_path / "conf" / "logger" / "jsonl.yaml").write_text(
        "_target_: tests.user_code.JsonLinesLogger\nlog_dir: logs\nfilename: scalars.jsonl\n")
    cfg = compose_cfg(*TINY, f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "logger=jsonl")
    owners = {}
    execute(build_plan(cfg), str(tmp_path / "run"), on_started=owners.update)
    assert type(owners["logger"].backend) is JsonLinesLogger
    rows = [json.loads(line) for line in (tmp_path / "run" / "logs" / "scalars.jsonl").read_text().splitlines()]
    assert {"hparams"} <= set(rows[0]) and any(r.get("name") == "train/mean_return" for r in rows)


@pytest.mark.parametrize("overrides, path, needle", [
    (("logger._target_=tests.loggers.NoSuchLogger",), "logger._target_", "cannot import 'tests.loggers.NoSuchLogger'"),
    (("logger._target_=tests.user_code.NotALogger",), "logger._target_", "is not a logger backend"),
    (("logger._target_=components.logger.TensorBoardLogger",), "logger",  # csv's options, TensorBoard's class
     "does not take the options ['flush_every', 'flush_seconds', 'log_dir', 'resume_step', 'tensorboard']"),
], ids=["not-importable", "not-a-logger", "wrong-options"])
def test_a_bad_logger_fails_at_planning_naming_its_config_path(compose_cfg, overrides, path, needle):
    with pytest.raises(ConfigurationError) as info:
        build_plan(compose_cfg("+recipe=ppo", *overrides))
    assert info.value.path == path and needle in info.value.message, info.value


def test_an_untyped_logger_yaml_without_log_dir_is_refused():
    with pytest.raises(ConfigurationError, match="logger.log_dir is missing") as info:
        backend_class({"_target_": "tests.user_code.JsonLinesLogger", "filename": "x.jsonl"})
    assert info.value.path == "logger.log_dir"
    assert backend_class({"_target_": "tests.user_code.JsonLinesLogger", "log_dir": "."}) is JsonLinesLogger


# ---------------------------------------------------------------------------------------------- all three, elsewhere
@pytest.mark.slow
def test_user_code_is_built_in_child_processes_from_the_picklable_config(tmp_path):
    # every owner in its own process: the network (inference server, weight sync), the env factory (collector) and
    # the logger class are each built from the config where their owner lives
    run_dir = tmp_path / "run"
    proc = run_cli(*TINY, "service=process", f"recipe.network={NET}", *CORRIDOR,
                   "logger._target_=tests.loggers.CustomLogger", f"hydra.run.dir={run_dir}", cwd=ROOT, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] == 128 and summary["final_mean_return"] == 7.0
    plan = json.loads((run_dir / "plan.json").read_text())
    assert {c["placement"] for c in plan["components"]} == {"process"}
    assert plan["env_id"] == "tests.user_code.make_corridor"
