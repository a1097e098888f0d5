"""Every check runs before anything starts: a value out of range fails the plan (and so the dry run) with one
message naming its config path, the value and what is allowed."""

import pytest

from components.errors import ConfigurationError
from launcher.plan import build_plan

BAD = [
    (("components.inference.max_batch_size=-5",), "components.inference.max_batch_size", "got -5", ">= 1"),
    (("components.inference.min_batch_size=100",), "components.inference.min_batch_size", "got 100",
     "in [1, max_batch_size=64]"),
    (("components.inference.timeout=-1",), "components.inference.timeout", "got -1", ">= 0 seconds"),
    (("components.inference.policy_device=cuda:x",), "components.inference.policy_device", "got 'cuda:x'",
     "a device (cpu, cuda or cuda:<index>)"),
    (("components.inference.output_device=mps",), "components.inference.output_device", "got 'mps'",
     "a device (cpu, cuda or cuda:<index>) or null"),
    (("service=thread", "components.collector.num_collectors=3"), "components.collector.num_collectors", "got 3",
     "a divisor of"),
    (("components.collector.num_collectors=2",), "components.collector.num_collectors", "got 2",
     "1 for a collector in the caller's thread"),
    (("service=thread", "components.collector.num_collectors=2", "components.collector.env_groups=3"),
     "components.collector.env_groups", "got 3", "a divisor of the 8 envs of each worker"),
    (("components.collector.env_groups=0",), "components.collector.env_groups", "got 0", ">= 1"),
    (("service=process", "+components.inference.transport_options.bogus=1"),
     "components.inference.transport_options.bogus", "takes no option 'bogus'", "supported: num_slots"),
    (("service=ray", "components.replay.resources.max_concurrency=0"), "components.replay.resources.max_concurrency",
     "got 0", ">= 1"),
]


@pytest.mark.parametrize("overrides, path, got, allowed", BAD, ids=[b[1] + ":" + b[0][-1].split("=")[-1] for b in BAD])
def test_out_of_range_values_fail_the_plan_with_their_path(compose_cfg, overrides, path, got, allowed):
    with pytest.raises(ConfigurationError) as info:
        build_plan(compose_cfg("+recipe=ppo", *overrides))
    message = str(info.value)
    assert f"full_key: {path}" in message
    assert got in message and allowed in message


def test_an_owner_built_from_python_runs_the_same_checks():
    from components.inference import InferenceServerConfig

    with pytest.raises(ConfigurationError) as info:
        InferenceServerConfig(max_batch_size=-5)
    assert "full_key: components.inference.max_batch_size" in str(info.value)


def _linear_policy():
    import torch
    from tensordict.nn import TensorDictModule

    return TensorDictModule(torch.nn.Linear(4, 2), in_keys=["observation"], out_keys=["action"])


def test_an_owner_built_from_python_checks_its_device_where_it_builds_the_policy():
    import torch

    from components.inference import InferenceServer, InferenceServerConfig

    with pytest.raises(ConfigurationError, match=r"policy_device must be a device \(cpu, cuda or cuda:<index>\), "
                                                 "got 'mps'"):
        InferenceServerConfig(policy_device="mps")  # the name: when the config is made
    absent = f"cuda:{torch.cuda.device_count()}"
    server = InferenceServer(InferenceServerConfig(policy_device=absent), policy_factory=_linear_policy)
    try:
        with pytest.raises(ConfigurationError, match=f"got '{absent}': it has ") as info:
            server.start()  # the device: where the policy is built (it may be made for another node)
        assert info.value.path == "components.inference.policy_device"
    finally:
        server.shutdown()


def test_a_partial_fixed_layout_is_refused_at_construction():
    import torch
    from tensordict import TensorDict

    from components.inference import InferenceServer, InferenceServerConfig

    request = TensorDict({"observation": torch.zeros(4)})
    with pytest.raises(ConfigurationError, match="has request_layout but no response_layout .*a fixed layout needs both"):
        InferenceServer(InferenceServerConfig(placement="process"), policy_factory=dict, transport="shared_memory",
                        request_layout=request)
