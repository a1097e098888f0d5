"""The plan: pure data from the composed config; every service x transport pair plans or is rejected."""

import itertools

import pytest

from components import compat
from components.errors import ConfigurationError, IncompatibleCombinationError, NotImplementedYetError
from launcher.plan import build_plan
from launcher.run import ensure_runnable

SERVICES = ["direct", "thread", "process", "ray", "monarch"]
TRANSPORTS = ["auto", "direct", "thread", "queue", "shared_memory", "process_slot", "ray", "distributed"]


_BY_SERVICE: dict = {}
"""One composed config per service, shared by its pairs: a transport option differs from another only in its name
(``conf/transport/*.yaml``; each composes on its own in test_config_parity.py), so each pair sets that name."""


@pytest.mark.parametrize("service, transport", list(itertools.product(SERVICES, TRANSPORTS)))
def test_every_service_transport_pair_plans_or_is_rejected(compose_cfg, service, transport):
    if service not in _BY_SERVICE:
        _BY_SERVICE[service] = compose_cfg("+recipe=ppo", f"service={service}")
    cfg = _BY_SERVICE[service]
    cfg.transport.name = transport  # as transport=<transport> composes it (the plan reads, never writes, the config)
    try:
        plan = build_plan(cfg)
    except IncompatibleCombinationError as exc:
        message = str(exc)
        assert f"transport {transport!r}" in message and f"{service!r}" in message
        assert "full_key: transport" in message and "supported: auto" in message
        assert f"(the value came from transport={transport})" in message
        return
    assert plan.start_order == ("logger", "weight_sync", "replay", "inference", "collector")
    for c in plan.components:
        assert c.placement == service
        cell = compat.TABLE[(c.name, c.placement)]
        if cell.takes_transport:
            assert c.transport in cell.transports
            # the broad default applies wherever the component takes that kind at all
            if transport != "auto" and cell.transports.get(transport) == compat.SUPPORTED:
                assert c.transport == transport
        assert c.status in (compat.SUPPORTED, compat.NOT_YET)
    rendered = plan.render()
    assert all(c.name in rendered for c in plan.components)
    if plan.not_built:
        assert "NOT IMPLEMENTED YET" in rendered
        with pytest.raises(NotImplementedYetError, match="is not implemented yet"):
            ensure_runnable(plan)
    else:
        ensure_runnable(plan)


def test_pinned_pairs(compose_cfg):
    plan = build_plan(compose_cfg("+recipe=ppo"))
    assert all(c.built for c in plan.components) and plan["inference"].transport == "direct"
    with pytest.raises(IncompatibleCombinationError, match="does not support transport 'shared_memory'"):
        build_plan(compose_cfg("+recipe=ppo", "service=ray", "transport=shared_memory"))
    plan = build_plan(compose_cfg("+recipe=ppo", "service=process", "transport=shared_memory"))
    assert plan["inference"].transport == "shared_memory" and all(c.built for c in plan.components)
    assert all(c.built for c in build_plan(compose_cfg("+recipe=ppo", "service=ray")).components)
    planned = build_plan(compose_cfg("+recipe=ppo", "service=ray", "components.replay.placement=distributed"))
    assert not planned["replay"].built and planned["logger"].built
    assert plan["logger"].transport == "queue" and "never uses 'shared_memory'" in plan["logger"].transport_reason
    plan = build_plan(compose_cfg("+recipe=ppo", "service=process"))
    assert plan["inference"].transport == "process_slot"  # collectors keep one request in flight per worker
    assert plan["inference"].transport_reason.startswith("auto: process owner, known layouts, one request in flight")


def test_per_component_overrides_win_over_service_and_transport(compose_cfg):
    plan = build_plan(
        compose_cfg(
            "+recipe=ppo", "service=process", "transport=shared_memory",
            "components.replay.placement=direct", "components.inference.transport=queue",
            "components.collector.resources.num_cpus=2",
        )
    )
    assert plan["replay"].placement == "direct" and plan["replay"].placement_from == "components.replay.placement"
    assert plan["replay"].transport == "direct"  # shared_memory does not apply to a direct replay buffer
    assert plan["inference"].transport == "queue" and plan["inference"].transport_reason == "explicit"
    assert plan["collector"].resources.num_cpus == 2


def test_explicit_component_mistakes_name_their_path(compose_cfg):
    with pytest.raises(IncompatibleCombinationError) as info:
        build_plan(compose_cfg("+recipe=ppo", "components.replay.transport=process_slot"))
    assert "full_key: components.replay.transport" in str(info.value)
    with pytest.raises(IncompatibleCombinationError) as info:
        build_plan(compose_cfg("+recipe=ppo", "components.logger.placement=submitit"))
    assert "full_key: components.logger.placement" in str(info.value)
    with pytest.raises(IncompatibleCombinationError, match="takes no transport"):
        build_plan(compose_cfg("+recipe=ppo", "components.collector.transport=queue"))
    with pytest.raises(ConfigurationError, match="unknown placement 'cloud'"):
        build_plan(compose_cfg("+recipe=ppo", "components.replay.placement=cloud"))


def test_unreachable_dependencies_are_rejected(compose_cfg):
    # a process collector cannot call an inference server that lives in the driver with direct calls
    with pytest.raises(IncompatibleCombinationError) as info:
        build_plan(compose_cfg("+recipe=ppo", "components.collector.placement=process"))
    message = str(info.value)
    assert "cannot reach the collector placed on 'process'" in message
    assert "full_key: components.inference.transport" in message
    # weight sync in the driver cannot push into a process-owned server over direct copies
    with pytest.raises(IncompatibleCombinationError, match="cannot reach the inference placed on 'process'"):
        build_plan(compose_cfg("+recipe=ppo", "components.inference.placement=process"))


def test_the_plan_shows_which_edges_ride_gloo(compose_cfg):
    plan = build_plan(compose_cfg("+recipe=ppo", "service=ray", "transport=distributed"))
    rows = {line.split()[1]: line for line in plan.render().splitlines()[2:7]}
    for name in ("inference", "replay", "weight_sync"):
        assert "distributed (gloo)" in rows[name]
    assert "distributed" not in rows["logger"].split("  auto")[0]  # the logger stays on Ray's control plane
    labels = {c["name"]: c["transport_label"] for c in plan.to_dict()["components"]}
    assert labels["inference"] == "distributed (gloo)" and labels["logger"] == "ray"


def test_worker_ranks_move_an_unplaced_server_within_reach(compose_cfg):
    plan = build_plan(compose_cfg("+recipe=ppo", "components.collector.placement=distributed",
                                  "components.collector.num_collectors=2"))
    inference = plan["inference"]
    assert (inference.placement, inference.transport) == ("thread", "distributed") and inference.built
    assert inference.placement_from == "for the collector on 'distributed'"
    assert "not 'direct': the collector on 'distributed' reaches it over 'distributed'" in inference.transport_reason
    assert plan["replay"].placement == "direct"  # the learner, in the driver, is its only caller
    # a placement the user chose is kept, and a server out of reach is an error naming what would reach
    with pytest.raises(IncompatibleCombinationError, match="cannot reach the collector placed on 'distributed'"):
        build_plan(compose_cfg("+recipe=ppo", "components.collector.placement=distributed",
                               "components.inference.placement=direct"))


def test_no_recipe_is_a_clear_error(compose_cfg):
    with pytest.raises(ConfigurationError, match=r"no recipe selected: add one on the command line, e\.g\. \+recipe=ppo"):
        build_plan(compose_cfg())


def test_layouts_come_from_env_specs_and_the_policy(compose_cfg):
    plan = build_plan(compose_cfg("+recipe=ppo", "recipe.num_envs=8", "env=pendulum"))
    layouts = {k: v.describe() for k, v in plan["inference"].layouts.items()}
    assert layouts["request"] == "observation [8, 3] float32"
    assert layouts["response"] == "action [8, 1] float32; policy_version [8] int64; sample_log_prob [8] float32"
    saved = plan.to_dict()["components"][3]["layouts"]["request"]["leaves"][0]
    assert saved == {"key": ["observation"], "shape": [8, 3], "dtype": "torch.float32", "device": "cpu"}


def test_recipe_constraints_fail_before_anything_starts(compose_cfg):
    with pytest.raises(ConfigurationError, match="must be divisible by num_minibatches=3"):
        build_plan(compose_cfg("+recipe=ppo", "recipe.num_minibatches=3"))


@pytest.mark.parametrize("backend", ["gymnasium", "vector", "envpool"])
def test_the_plan_names_the_env_backend_where_it_is_not_the_default(compose_cfg, backend):
    plan = build_plan(compose_cfg("+recipe=ppo", f"env.backend={backend}"))
    assert plan.env_backend == backend and plan.to_dict()["env_backend"] == backend
    first = plan.render().splitlines()[0]
    assert first == "plan: recipe=ppo env=CartPole-v1 seed=0" if backend == "gymnasium" else \
        first == f"plan: recipe=ppo env=CartPole-v1 (env.backend={backend}) seed=0"


@pytest.mark.parametrize("service", ["direct", "thread", "process", "ray"])
def test_local_policy_plans_replicas_fed_by_weight_sync_and_no_inference_server(compose_cfg, service):
    plan = build_plan(compose_cfg("+recipe=ppo", f"service={service}", "components.collector.local_policy=true"))
    assert "inference" not in plan.start_order
    collector = plan["collector"]
    assert set(collector.depends_on) == {"replay", "weight_sync"}
    assert "policy replica in each worker" in plan.render()
    assert all(c.built for c in plan.components)
    ensure_runnable(plan)


@pytest.mark.parametrize("overrides, threads", [
    (("+recipe=ppo",), lambda cores: 1),  # flat observations: a small MLP is fastest on one thread
    (("+recipe=ppo", "env=minatar"), lambda cores: cores),  # images, collected and learned in turn: every core
    (("+recipe=impala", "env=minatar", "service=process", "components.collector.num_collectors=2"),
     lambda cores: cores - 2),  # one pass per batch, workers beside it on this machine: a core left to each
    (("+recipe=impala", "env=minatar", "service=thread", "components.collector.num_collectors=2"),
     lambda cores: cores - 2),
    (("+recipe=appo", "env=minatar", "service=process"), lambda cores: cores),  # four passes: the learner needs most
    (("+recipe=ppo", "env=minatar", "service=process", "components.collector.sync=false"), lambda cores: cores),
    (("+recipe=impala", "env=minatar", "service=process", "launcher.torch_threads=3"),
     lambda cores: 3),  # the user's word wins
])
def test_a_one_pass_learner_leaves_a_core_to_each_worker_that_collects_while_it_learns(compose_cfg, overrides,
                                                                                       threads):
    import os

    cores = len(os.sched_getaffinity(0))
    assert build_plan(compose_cfg(*overrides)).launcher.torch_threads == max(1, threads(cores))


def test_learner_threads_on_a_bigger_machine():
    from types import SimpleNamespace

    from launcher.plan import learner_threads

    def collector(placement, sync, workers):
        return SimpleNamespace(placement=placement, config=SimpleNamespace(sync=sync, num_collectors=workers))

    pixels = (4, 84, 84)
    assert learner_threads(pixels, collector("process", False, 2), cores=16) == 14
    assert learner_threads(pixels, collector("process", False, 2), passes=4, cores=16) == 16
    assert learner_threads(pixels, collector("process", True, 2), cores=16) == 16
    assert learner_threads(pixels, collector("process", False, 8), cores=4) == 1  # never below one
    assert learner_threads(pixels, collector("ray", False, 2), cores=16) == 16  # the workers may be elsewhere
    assert learner_threads(pixels, None, cores=16) == 16
    assert learner_threads((4,), collector("process", False, 2), cores=16) == 1
