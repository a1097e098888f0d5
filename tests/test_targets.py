"""Your own code from YAML by ``_target_``: a policy network, an environment, a logger backend.

Each is named in the config, built where it is used, and a bad name fails before anything starts with a
``ConfigurationError`` naming the config path.
"""

import json

import pytest
from omegaconf import OmegaConf
from torch import nn

from components.envs import spec_of
from components.errors import ConfigurationError
from launcher.plan import build_plan
from recipes import get_recipe
from recipes.examples.custom_mlp import CustomMLP

from .conftest import run_cli

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
    ("{_target_:tests.user_code.no_such_net}", "recipe.network._target_", "cannot import 'tests.user_code.no_such_net'"),
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
