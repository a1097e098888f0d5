"""Static batches, pinned staging and interaction modes of the serving loop.

On this machine (no CUDA) the eager policy stands in for the captured graph (``capture=eager``) and plain host
buffers for pinned ones: the padding, the checks, the fallbacks, the staging rows and the slot gathers are the same
code a CUDA server runs. The ``gpu`` tests capture real CUDA graphs."""

import logging
import os

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from components.errors import ConfigurationError
from components.inference import InferenceServer
from components.inference.client import InferenceClient
from components.inference.config import InferenceServerConfig
from components.inference.core import ServingCore, copy_weights
from components.inference.modes import MODE_KEY, acts_deterministically, serving, stamp
from components.inference.staging import DeviceStaging
from components.inference.static import StaticBatches, eager
from transports.layout import Layout
from transports.queue.transport import QueueTransport
from transports.slots.shared_memory import SharedMemoryTransport

REQUEST = TensorDict({"observation": torch.zeros(4)})
RESPONSE = TensorDict({"action": torch.zeros(4), "policy_version": torch.zeros((), dtype=torch.long)})


class Recording(nn.Module):
    """``action = observation * weight``, ``+ 100`` in a deterministic mode; keeps the inputs of every forward."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(()))
        self.seen: list = []

    def forward(self, td):
        self.seen.append(td.get("observation").clone())
        td.set("action", td.get("observation") * self.weight + (100.0 if acts_deterministically() else 0.0))
        return td


def obs(value: float) -> TensorDict:
    return TensorDict({"observation": torch.full((4,), float(value))})


def static_core(transport_kind=SharedMemoryTransport, rows: int = 8, mode: str = "random", staging: bool = False,
                clients: int = 3):
    """A serving loop over a real transport's endpoint, with static batches of ``rows`` (the eager stand-in)."""
    policy = Recording()
    config = InferenceServerConfig(max_batch_size=rows, interaction_mode=mode)
    if transport_kind is QueueTransport:
        transport = QueueTransport()
    else:
        transport = transport_kind(REQUEST, RESPONSE, num_slots=clients)
    transport.mark_serving(os.getpid())
    endpoint = transport.server()
    static = StaticBatches(policy, Layout.from_tensordict(REQUEST), rows, "cpu", mode, capture=eager)
    core = ServingCore(policy, endpoint, config, static=static, staging=staging)
    static.capture()
    return transport, [transport.client() for _ in range(clients)], endpoint, core, policy


def serve_once(endpoint, core):
    batch = endpoint.collect(16, 1, 0.0, 0.5)
    assert batch is not None
    core.serve(batch)


# ---------------------------------------------------------------------------------------------- configuration
def test_static_batches_are_refused_while_planning_without_an_explicit_cuda_device_or_below_max_batch_size():
    with pytest.raises(ConfigurationError, match="needs an explicit CUDA policy_device") as info:
        InferenceServerConfig(static_batch_size=64)
    assert info.value.path == "components.inference.static_batch_size"
    with pytest.raises(ConfigurationError, match="at least max_batch_size=64 .* got 32"):
        InferenceServerConfig(static_batch_size=32, policy_device="cuda")
    with pytest.raises(ConfigurationError, match="interaction_mode must be one of random, deterministic"):
        InferenceServerConfig(interaction_mode="greedy")
    assert InferenceServerConfig(static_batch_size=64, policy_device="cuda:1").static_batch_size == 64


def test_static_batches_need_a_serving_loop_and_a_request_layout():
    config = InferenceServerConfig(placement="direct", static_batch_size=8, max_batch_size=8, policy_device="cuda")
    with pytest.raises(ConfigurationError, match="placement 'direct' has none"):
        InferenceServer(config, policy=Recording(), request_layout=REQUEST, response_layout=RESPONSE)
    config = InferenceServerConfig(placement="thread", static_batch_size=8, max_batch_size=8, policy_device="cuda")
    with pytest.raises(ConfigurationError, match="needs the layout of one request"):
        InferenceServer(config, policy=Recording(), transport="thread")


def test_a_plan_with_static_batches_on_a_direct_server_is_refused_before_anything_starts(compose_cfg):
    from launcher.plan import build_plan

    static = ("components.inference.policy_device=cuda", "components.inference.static_batch_size=64")
    with pytest.raises(ConfigurationError, match="placement 'direct' has none") as refused:
        build_plan(compose_cfg("+recipe=appo", "env=atari", *static))
    assert refused.value.path == "components.inference.static_batch_size"
    plan = build_plan(compose_cfg("+recipe=appo", "env=atari", "service=process", *static))
    assert next(c for c in plan.components if c.component == "inference").placement == "process"


@pytest.mark.slow
def test_a_plan_with_static_batches_on_a_machine_without_cuda_exits_2_naming_the_device(tmp_path):
    from tests.helpers import run_cli

    done = run_cli("+recipe=ppo", "service=process", "components.inference.static_batch_size=64",
                   "components.inference.policy_device=cuda", f"hydra.run.dir={tmp_path}", cwd=str(tmp_path))
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the plan is not refused")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "components.inference.policy_device must be a device this machine has" in done.stderr
    assert not (tmp_path / "summary.json").exists()


# ---------------------------------------------------------------------------------------------- padding
@pytest.mark.parametrize("staging", [False, True], ids=["plain", "staged"])
def test_every_forward_has_the_static_size_and_pad_rows_copy_the_last_request(staging):
    transport, clients, endpoint, core, policy = static_core(staging=staging)
    try:
        futures = [c.submit(obs(i + 1)) for i, c in enumerate(clients)]
        serve_once(endpoint, core)
        for i, future in enumerate(futures):
            out = future.result(timeout=5)
            assert out["action"].tolist() == [float(i + 1)] * 4 and set(out.keys()) == {"action", "policy_version"}
        rows = policy.seen[-1]
        assert rows.shape == (8, 4)  # the static size, whatever the batch
        assert rows[:3, 0].tolist() == [1.0, 2.0, 3.0] and rows[3:, 0].tolist() == [3.0] * 5  # pads: the last request
        future = clients[0].submit(obs(9))  # a batch of one
        serve_once(endpoint, core)
        assert future.result(timeout=5)["action"].tolist() == [9.0] * 4
        assert policy.seen[-1].shape == (8, 4) and policy.seen[-1][:, 0].tolist() == [9.0] * 8
        if staging:  # the slots were gathered straight into the staging buffers, and the graph reads its own batch
            assert core.staging.device_batch is core.static.input
    finally:
        transport.close()


def test_a_request_lacking_a_captured_key_is_refused_and_the_server_keeps_serving():
    transport, clients, endpoint, core, policy = static_core(QueueTransport, clients=1)
    try:
        bad = clients[0].submit(TensorDict({"pixels": torch.zeros(4)}))
        serve_once(endpoint, core)
        with pytest.raises(Exception, match=r"lacks \['observation'\].*captured as inputs"):
            bad.result(timeout=5)
        good = clients[0].submit(obs(2))
        serve_once(endpoint, core)
        assert good.result(timeout=5)["action"].tolist() == [2.0] * 4
    finally:
        transport.close()


# ---------------------------------------------------------------------------------------------- weights
def test_an_in_place_weight_copy_keeps_the_graph_and_a_replaced_tensor_gives_it_up_saying_so(caplog):
    transport, clients, endpoint, core, policy = static_core(clients=1)
    try:
        core.request_update({"weight": torch.tensor(3.0)}, None)
        core.apply_updates()
        assert core.static.graph is not None and core.static.given_up is None  # copied in place
        future = clients[0].submit(obs(1))
        serve_once(endpoint, core)
        assert future.result(timeout=5)["action"].tolist() == [3.0] * 4

        policy.weight.data = torch.tensor(5.0)  # a new storage: what a captured graph would not read
        with caplog.at_level(logging.WARNING, logger="components.inference.static"):
            core.request_update({"weight": torch.tensor(5.0)}, None)
            core.apply_updates()
        assert core.static.graph is None and "replaced the policy's tensors" in core.static.given_up
        assert "CUDA graph given up, serving eagerly" in caplog.text
        seen = len(policy.seen)
        future = clients[0].submit(obs(1))
        serve_once(endpoint, core)
        assert future.result(timeout=5)["action"].tolist() == [5.0] * 4
        assert policy.seen[seen].shape == (1, 4)  # eager: the batch's own size
    finally:
        transport.close()


def test_copy_weights_keeps_every_tensor_where_it_was():
    policy = Recording()
    before = policy.weight.data_ptr()
    copy_weights(policy, {"weight": torch.tensor(7.0)})
    assert policy.weight.data_ptr() == before and policy.weight.item() == 7.0


# ---------------------------------------------------------------------------------------------- modes
def test_a_static_server_refuses_requests_stamped_with_another_mode_and_serves_the_rest():
    transport, clients, endpoint, core, policy = static_core(QueueTransport, mode="random", clients=2)
    try:
        other = clients[0].submit(stamp(obs(1).unsqueeze(0), "deterministic")[0])
        same = clients[1].submit(stamp(obs(2).unsqueeze(0), "random")[0])
        serve_once(endpoint, core)
        with pytest.raises(Exception, match="stamped interaction mode 'deterministic'.*captured in 'random'"):
            other.result(timeout=5)
        assert same.result(timeout=5)["action"].tolist() == [2.0] * 4
    finally:
        transport.close()


def test_an_eager_server_serves_each_stamped_mode_in_a_forward_of_its_own():
    policy = Recording()
    transport = QueueTransport()
    transport.mark_serving(os.getpid())
    endpoint = transport.server()
    core = ServingCore(policy, endpoint, InferenceServerConfig(interaction_mode="deterministic"))
    clients = [transport.client() for _ in range(3)]
    try:
        futures = [clients[0].submit(stamp(obs(1).unsqueeze(0), "random")[0]),
                   clients[1].submit(obs(2)),  # unstamped: the server's mode
                   clients[2].submit(stamp(obs(3).unsqueeze(0), "deterministic")[0])]
        serve_once(endpoint, core)
        assert [f.result(timeout=5)["action"][0].item() for f in futures] == [1.0, 102.0, 103.0]
    finally:
        transport.close()


def test_the_builtin_policies_take_their_most_likely_action_in_a_deterministic_mode():
    from components.envs import EnvSpec
    from recipes.actor_critic import make_policy
    from recipes.configs import PPOConfig

    spec = EnvSpec("x", (4,), torch.float32, True, 3, ())
    policy = make_policy(PPOConfig(), spec)
    td = TensorDict({"observation": torch.randn(64, 4), "sample_seed": torch.arange(64)}, [64])
    with torch.no_grad(), serving("deterministic"):
        greedy = policy(td.clone())["action"]
        expected = policy.actor.net(td["observation"]).argmax(-1)
    assert torch.equal(greedy, expected)
    with torch.no_grad(), serving("random"):
        sampled = policy(td.clone())["action"]
    assert not torch.equal(sampled, expected)  # 64 rows of three near-uniform actions: sampling differs somewhere


def test_a_client_stamps_its_mode_or_the_mode_of_the_callers_block():
    transport = QueueTransport()
    transport.mark_serving(os.getpid())
    endpoint = transport.server()
    client = InferenceClient(transport.client())
    try:
        with serving("deterministic"):
            future = client.submit(obs(1))
        batch = endpoint.collect(4, 1, 0.0, 0.5)
        assert batch.requests[0][MODE_KEY].item() == 2
        endpoint.fail(batch, RuntimeError("seen"))
        with pytest.raises(Exception):
            future.result(timeout=5)
        future = client.submit(obs(1))  # outside any block: unstamped
        batch = endpoint.collect(4, 1, 0.0, 0.5)
        assert MODE_KEY not in batch.requests[0].keys()
        endpoint.fail(batch, RuntimeError("seen"))
        future = client.with_mode("deterministic").submit(obs(1))
        batch = endpoint.collect(4, 1, 0.0, 0.5)
        assert batch.requests[0][MODE_KEY].item() == 2
        endpoint.fail(batch, RuntimeError("seen"))
        with pytest.raises(ValueError, match="must be one of random, deterministic"):
            client.with_mode("greedy")
        with pytest.raises(ValueError, match="no 'interaction_mode' leaf"):
            InferenceClient(transport.client(), carries_modes=False).with_mode("deterministic")
    finally:
        transport.close()


# ---------------------------------------------------------------------------------------------- staging
def test_staging_moves_the_first_rows_and_hands_back_host_views():
    layout = Layout.from_tensordict(TensorDict({"observation": torch.zeros(4, dtype=torch.uint8)}))
    staging = DeviceStaging(layout, rows=8, device=torch.device("cpu"))
    host = staging.host_views()["observation"]
    batch = TensorDict({"observation": torch.arange(12, dtype=torch.uint8).reshape(3, 4)}, [3])
    on_device = staging.load(batch)
    assert on_device.batch_size == (3,) and torch.equal(on_device["observation"], batch["observation"])
    assert torch.equal(host[:3], batch["observation"])  # staged through the host buffer
    out = TensorDict({"action": torch.tensor([1, 2, 3])}, [3])
    back = staging.unload(out)
    assert back["action"].tolist() == [1, 2, 3]
    assert back["action"].data_ptr() == staging.host_out["action"].data_ptr()  # a view of the reused buffer


@pytest.mark.gpu
def test_cuda_staging_is_pinned_and_waits_on_one_event():
    layout = Layout.from_tensordict(TensorDict({"observation": torch.zeros(4, dtype=torch.uint8)}))
    staging = DeviceStaging(layout, rows=8, device=torch.device("cuda"))
    assert staging.host_views()["observation"].is_pinned() and staging.event is not None
    batch = TensorDict({"observation": torch.arange(12, dtype=torch.uint8).reshape(3, 4)}, [3])
    on_device = staging.load(batch)
    back = staging.unload(on_device.apply(lambda t: t.long() * 2))
    assert back["observation"].is_pinned() and back["observation"].tolist() == (batch["observation"].long() * 2).tolist()


# ---------------------------------------------------------------------------------------------- on a GPU
def _served(static_batch_size, **config):
    from components.envs import EnvSpec
    from recipes.actor_critic import make_policy
    from recipes.configs import PPOConfig

    spec = EnvSpec("frames", (4, 84, 84), torch.uint8, True, 6, (), observation_scale=255.0)
    request = TensorDict({"observation": torch.zeros(4, 84, 84, dtype=torch.uint8)})
    response = TensorDict({"action": torch.zeros((), dtype=torch.long), "sample_log_prob": torch.zeros(()),
                           "policy_version": torch.zeros((), dtype=torch.long)})
    policy = make_policy(PPOConfig(encoder="nature_cnn"), spec)
    cfg = InferenceServerConfig(placement="thread", transport="shared_memory", max_batch_size=8,
                                policy_device="cuda", static_batch_size=static_batch_size, **config)
    return InferenceServer(cfg, policy=policy, request_layout=request, response_layout=response), policy


@pytest.mark.gpu
def test_a_captured_graph_answers_as_the_eager_policy_does_and_follows_in_place_weight_updates():
    torch.manual_seed(0)
    graph_server, policy = _served(8)
    eager_server, _ = _served(None)
    frames = torch.randint(0, 255, (5, 4, 84, 84), dtype=torch.uint8)
    with graph_server, eager_server:
        eager_server.update_weights(policy)
        graph_client, eager_client = graph_server.client(), eager_server.client()
        for step in range(2):
            requests = [TensorDict({"observation": frames[i], "sample_seed": torch.tensor(i + 10 * step)})
                        for i in range(5)]
            graph = [graph_client.submit(r).result(timeout=60) for r in requests]
            plain = [eager_client.submit(r).result(timeout=60) for r in requests]
            for g, p in zip(graph, plain):
                assert g["action"].item() == p["action"].item()
                assert torch.allclose(g["sample_log_prob"], p["sample_log_prob"], atol=1e-4)
            with torch.no_grad():
                for p in policy.parameters():
                    p.mul_(0.5)
            assert graph_server.update_weights(policy) == eager_server.update_weights(policy)
        assert graph_server._host.target.core.static.graph is not None  # in-place copies kept it


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("transport", ["shared_memory", "process_slot"])
def test_ppo_trains_with_a_cuda_server_of_static_batches_in_a_process(tmp_path, transport):
    import json

    from tests.helpers import run_cli

    done = run_cli("+recipe=ppo", "recipe.total_frames=4096", "recipe.target_return=null",
                   "components.inference.placement=process", f"components.inference.transport={transport}",
                   "components.inference.policy_device=cuda", "components.inference.max_batch_size=16",
                   "components.inference.static_batch_size=16", "launcher.progress=false",
                   f"hydra.run.dir={tmp_path}", cwd=str(tmp_path), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["frames"] >= 4096
    assert "CUDA graph given up" not in done.stderr + (tmp_path / "launcher.log").read_text()
