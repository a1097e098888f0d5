"""Discovery (ServiceRegistry) and weight sync across placements."""

import multiprocessing as mp
import pickle

import pytest
import torch

from components.errors import ConfigurationError, PeerFailureError
from components.logger import CSVLogger, Logger, LoggerConfig
from components.registry import ServiceRegistry
from components.replay import ReplayBuffer, ReplayConfig
from components.weight_sync import WeightSync, WeightSyncConfig

from tests.factories import CartPolePolicy


def test_registry_owns_what_it_creates_and_never_what_it_was_given(tmp_path):
    registry = ServiceRegistry()
    external = Logger(LoggerConfig(), backend=CSVLogger(str(tmp_path))).start()
    try:
        replay_client = registry.register("replay", ReplayBuffer, ReplayConfig(capacity=16, batch_size=2))
        assert registry.register("logger", external) is external  # a direct owner is its own client
        assert "replay" in registry and "logger" in registry and "nope" not in registry
        assert registry.list() == ["logger", "replay"] and len(registry) == 2
        assert registry.get_client("replay") is replay_client
        owned = registry["replay"]
        with pytest.raises(ValueError, match="already registered"):
            registry.register("replay", ReplayBuffer)
        with pytest.raises(KeyError, match="no service named 'missing'"):
            registry.get("missing")
        registry.reset()
        assert not owned.is_alive  # the registry started it, so it stops it
        assert external.is_alive  # never shut down by the registry
        assert registry.list() == []
    finally:
        external.shutdown()


def test_registry_refuses_owners_that_are_not_running(tmp_path):
    registry = ServiceRegistry()
    with pytest.raises(ValueError, match="it is not running"):
        registry.register("logger", Logger(LoggerConfig(), backend=CSVLogger(str(tmp_path))))
    with pytest.raises(TypeError, match="running owner or a factory"):
        registry.register("x", 42)


def test_registering_a_process_owner_stores_its_restricted_client(tmp_path):
    registry = ServiceRegistry()
    with Logger(LoggerConfig(placement="process"), backend=CSVLogger(str(tmp_path))) as owner:
        client = registry.register("logger", owner)
        assert not hasattr(client, "shutdown")
        registry.get_client("logger").log_scalar("x", 1.0)
        registry.reset()
        assert owner.is_alive


@pytest.mark.parametrize("placement", ["direct", "thread", "process"])
def test_weight_sync_versions_are_monotonic_and_applied_in_place(placement):
    learner, receiver = CartPolePolicy(seed=1), CartPolePolicy(seed=2)
    storage = receiver.net.weight.data_ptr()
    with WeightSync(WeightSyncConfig(placement=placement), template=learner) as sync:
        client = sync.client()
        assert client.poll(0, into=receiver) is None  # nothing published yet
        assert client.push(learner) == 1
        assert client.poll(0, into=receiver) == 1
        assert torch.equal(receiver.net.weight, learner.net.weight)
        assert receiver.net.weight.data_ptr() == storage  # in place
        assert client.poll(1, into=receiver) is None
        with torch.no_grad():
            learner.net.weight.add_(1.0)
        assert client.push(learner) == 2 and client.version == 2
        version, state = client.pull()
        assert version == 2 and torch.equal(state["net.weight"], learner.net.weight)


def _receive(client, queue):
    receiver = CartPolePolicy(seed=9)
    queue.put((client.poll(0, into=receiver), receiver.net.weight.sum().item()))


@pytest.mark.slow  # a spawned interpreter imports torch: seconds
def test_process_weight_sync_reaches_another_process():
    learner = CartPolePolicy(seed=4)
    with WeightSync(WeightSyncConfig(placement="process"), template=learner) as sync:
        client = sync.client()
        pickle.loads(pickle.dumps(client))  # picklable by segment name
        client.push(learner)
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        child = ctx.Process(target=_receive, args=(client, queue))
        child.start()
        version, total = queue.get(timeout=60)
        child.join(timeout=30)
        queue.close()
        queue.join_thread()
    assert version == 1 and abs(total - learner.net.weight.sum().item()) < 1e-6


def test_process_weight_sync_needs_a_template():
    with pytest.raises(ConfigurationError, match="needs a template"):
        WeightSync(WeightSyncConfig(placement="process"))


@pytest.mark.parametrize("placement", ["process", pytest.param("distributed", marks=pytest.mark.slow),
                                       pytest.param("ray", marks=pytest.mark.slow)])
def test_distributed_weight_sync_fans_versions_out_before_receivers_poll(placement, request):
    from tests.helpers import wait_until

    if placement == "ray":
        request.getfixturevalue("ray_cluster")
    learner, receiver = CartPolePolicy(seed=1), CartPolePolicy(seed=2)
    storage = receiver.net.weight.data_ptr()
    with WeightSync(WeightSyncConfig(placement=placement), template=learner, transport="distributed") as sync:
        client = sync.client()
        assert client.poll(0, into=receiver) is None  # subscribes; nothing published yet
        assert client.push(learner) == 1
        assert wait_until(lambda: client.poll(0, into=receiver), timeout=10) == 1  # arrives by itself, no round trip
        assert torch.equal(receiver.net.weight, learner.net.weight) and receiver.net.weight.data_ptr() == storage
        assert client.poll(1, into=receiver) is None
        with torch.no_grad():
            learner.net.weight.add_(1.0)
        assert client.push(learner) == 2 and client.push(learner) == 3
        assert wait_until(lambda: client.poll(2, into=receiver), timeout=10) == 3
        assert torch.equal(receiver.net.weight, learner.net.weight)
        version, state = client.pull()
        assert client.version == 3 and version == 3 and torch.equal(state["net.weight"], learner.net.weight)
        if placement == "ray":  # a Ray client travels anywhere (process clients travel as Process arguments)
            other = pickle.loads(pickle.dumps(client))  # a copy subscribes on its own
            assert wait_until(lambda: other.poll(0, into=CartPolePolicy(seed=5)), timeout=10) == 3
    with pytest.raises(PeerFailureError):  # the owner stopped: the subscription says so at the next poll
        wait_until(lambda: client.poll(3, into=receiver) or False, timeout=10)


def test_state_dicts_travel_as_nested_tensordicts_and_back():
    from components.weight_sync.hub import from_tensordict, to_tensordict

    state = {"epsilon": torch.tensor(0.5), "q.0.weight": torch.ones(2, 3), "q.0.bias": torch.zeros(2)}
    td = to_tensordict(state, version=7)
    assert td["q", "0", "weight"].shape == (2, 3) and int(td["__version__"]) == 7
    back = from_tensordict(td)
    assert set(back) == set(state) and all(torch.equal(back[k], v) for k, v in state.items())
