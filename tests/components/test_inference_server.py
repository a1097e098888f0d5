"""One contract suite for the inference server over every (placement, transport) cell built so far."""

import multiprocessing as mp
import os
import pickle
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest
import torch
from tensordict import NonTensorData, TensorDict

from components.errors import (
    ConfigurationError,
    IncompatibleCombinationError,
    LayoutError,
    PeerFailureError,
    RemoteError,
)
from components.inference import InferenceServer, InferenceServerConfig, PolicyClientModule
from components.service import LIFECYCLE_METHODS
from transports import Layout
from transports.segments import SHM_PREFIX
from components.hosts.process import context as process_context

from tests.helpers import process_gone, wait_until
from tests.factories import echo_factory, failing_factory

CELLS = [("thread", "thread"), ("thread", "direct"), ("process", "queue"), ("process", "shared_memory"),
         ("process", "process_slot")]
REQUEST = TensorDict({"observation": torch.zeros(4)})
RESPONSE = TensorDict({"action": torch.zeros(4), "served": torch.zeros((), dtype=torch.long),
                       "policy_version": torch.zeros((), dtype=torch.long)})


def request(value: float) -> TensorDict:
    return TensorDict({"observation": torch.full((4,), float(value))})


def make_server(placement, transport, *, delay=0.0, num_slots=64, hang_marker=None, **config):
    options = {"num_slots": num_slots} if transport in ("shared_memory", "process_slot") else {}
    from transports.config import TransportConfig

    return InferenceServer(InferenceServerConfig(placement=placement, **config),
                           policy_factory=partial(echo_factory, delay, hang_marker),
                           transport=TransportConfig(transport, options), request_layout=REQUEST,
                           response_layout=RESPONSE)


def our_segments() -> set:
    return {f for f in os.listdir("/dev/shm") if f.startswith(f"{SHM_PREFIX}{os.getpid()}_")}


@pytest.fixture(scope="module", params=CELLS, ids=[f"{p}-{t}" for p, t in CELLS])
def cell(request):
    return request.param


@pytest.fixture(scope="module")
def server(cell):
    """One running server per cell, shared by the tests that leave it running."""
    before = our_segments()
    owner = make_server(*cell, delay=0.005, max_batch_size=16, timeout=0.01).start()
    yield owner
    owner.shutdown()
    assert our_segments() == before, "shared-memory segments left behind"


def test_resolved_transport_is_inspectable(server, cell):
    assert (server.placement, server.transport_kind) == cell
    assert server.transport_config.kind == cell[1]


def test_every_caller_gets_its_own_answer_and_batching_happens(server):
    clients = [server.client() for _ in range(16)]

    def work(i):
        answers = []
        for k in range(6):
            value = i * 100 + k
            out = clients[i](request(value))
            answers.append((value, out["action"][0].item(), out["policy_version"].item()))
        return answers

    before = server.stats()["requests"]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(work, range(16)))
    for answers in results:
        for value, action, version in answers:
            assert action == 2 * value and version == server.policy_version
    stats = server.stats()
    assert stats["requests"] - before == 96
    assert stats["mean_batch_size"] > 1.0, stats
    assert sum(k * v for k, v in stats["batch_size_histogram"].items()) == stats["batches"] * stats["mean_batch_size"]
    assert stats["forward_p95"] >= stats["forward_p50"] > 0


def test_each_producer_keeps_its_order(server, cell):
    client = server.client()
    if cell[1] == "process_slot":  # one request in flight per slot: order is sequential by construction
        served = [client(request(k))["served"].item() for k in range(8)]
    else:
        futures = [client.submit(request(k)) for k in range(8)]
        served = [f.result(timeout=30)["served"].item() for f in futures]
    assert served == sorted(served)


def test_a_failing_batch_fails_only_its_callers_and_the_server_keeps_serving(server):
    bad, good = server.client(), server.client()
    with pytest.raises(RemoteError) as info:
        bad(request(-5000))
    assert info.value.remote_type == "ValueError" and "negative marker" in info.value.remote_message
    assert "EchoPolicy" in info.value.remote_traceback or "forward" in info.value.remote_traceback
    assert good(request(3))["action"][0].item() == 6


def test_weight_updates_apply_between_batches(server):
    client = server.client()
    start = client(request(1))["policy_version"].item()
    assert server.update_weights({"scale": torch.tensor(5.0)}) == start + 1
    out = client(request(1))
    assert out["policy_version"].item() == start + 1 and out["action"][0].item() == 5.0
    assert server.policy_version == start + 1
    server.update_weights({"scale": torch.tensor(2.0)})  # back to the echo the other tests expect


def test_submit_after_shutdown_raises_at_once(cell):
    owner = make_server(*cell).start()
    client = owner.client()
    client(request(1))
    owner.shutdown()
    owner.shutdown()  # idempotent
    start = time.monotonic()
    with pytest.raises(PeerFailureError, match="shut down"):
        client.submit(request(1)).result(timeout=10)
    assert time.monotonic() - start < 1.0


def test_clients_have_no_lifecycle_methods(server):
    client = server.client()
    for name in LIFECYCLE_METHODS:
        assert not hasattr(client, name)


def _call_in_child(client, queue):
    try:
        queue.put(("ok", client(request(21))["action"][0].item()))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        queue.put(("error", repr(exc)))


def test_clients_travel_to_where_they_are_used(server, cell):
    client = server.client()
    if cell[0] == "thread":  # in-process transports: a pickled client works inside the owner's process
        clone = pickle.loads(pickle.dumps(client))
        assert clone(request(4))["action"][0].item() == 8
        return
    ctx = process_context()  # a process of its own, not forked from this one: the client travels pickled
    queue = ctx.Queue()
    worker = ctx.Process(target=_call_in_child, args=(client, queue))
    worker.start()
    try:
        assert queue.get(timeout=60) == ("ok", 42.0)
    finally:
        worker.join(timeout=30)
        queue.close()
        queue.join_thread()
    assert worker.exitcode == 0


def _call_then_wait(client, queue, leave, turn):
    turn.wait(60)  # the second process calls only once the first one has its answer
    _call_in_child(client, queue)
    leave.wait(60)  # stay alive: the endpoint stays claimed while its process lives


@pytest.mark.parametrize("transport", ["queue", "shared_memory", "process_slot"])
def test_one_client_copied_into_two_processes(transport):
    """shared_memory clients share the slot bank and a queue client connects a channel of its own in each process;
    a process_slot endpoint answers one process, and a copy in a second live process is refused at its call site
    instead of reading the first one's answers."""
    with make_server("process", transport) as server:
        _one_client_in_two_processes(server.client(), transport)


def _one_client_in_two_processes(client, transport):
    ctx = process_context()  # processes of their own, not forked from this one: the client travels pickled
    queue, leave, turns = ctx.Queue(), ctx.Event(), [ctx.Event(), ctx.Event()]
    # both start at once and call one after the other
    workers = [ctx.Process(target=_call_then_wait, args=(client, queue, leave, turn)) for turn in turns]
    try:
        results = []
        for worker in workers:
            worker.start()
        for turn in turns:
            turn.set()
            results.append(queue.get(timeout=60))
    finally:
        leave.set()
        for worker in workers:
            worker.join(timeout=30)
        queue.close()
        queue.join_thread()
    assert results[0] == ("ok", 42.0)
    if transport in ("shared_memory", "queue"):
        assert results[1] == ("ok", 42.0)
    else:
        assert results[1][0] == "error" and "TransportError" in results[1][1]
        assert "create one client per worker process" in results[1][1]
    assert client(request(1))["action"][0].item() == 2  # the owner's process may still use it after them


@pytest.mark.parametrize("transport", ["queue", "process_slot"])
def test_a_forked_copy_of_a_client_in_use_gets_its_own_channel_or_is_refused(transport):
    """A forked child inherits the client with this process's channel (queue) or claim on its endpoint
    (process_slot); both checks must see the child's own pid (kept by a fork hook, not asked of the system on every
    request): the queue copy connects a channel of its own, the slot copy is refused at its call site."""
    with make_server("process", transport) as server:
        client = server.client()
        assert client(request(1))["action"][0].item() == 2  # claimed by this process
        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_call_in_child, args=(client, queue))
        child.start()
        try:
            result = queue.get(timeout=60)
        finally:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()
                child.join(timeout=30)
            queue.close()
            queue.join_thread()
        if transport == "queue":
            assert result == ("ok", 42.0)
        else:
            assert result[0] == "error" and "TransportError" in result[1], result
        assert client(request(3))["action"][0].item() == 6  # this process keeps using it


def test_policy_client_module_reduces_owner_to_client(server):
    module = PolicyClientModule(server, in_keys=["observation"], out_keys=["action", "policy_version"], max_inflight=2)
    td = module(TensorDict({"observation": torch.ones(4), "other": torch.zeros(1)}))
    assert td["action"][0].item() == 2.0 and "served" not in td.keys() and "other" in td.keys()
    assert not hasattr(module.client, "shutdown")


# ---------------------------------------------------------------------------------------------- process only
PROCESS_CELLS = [c for c in CELLS if c[0] == "process"]


@pytest.mark.parametrize("placement, transport", PROCESS_CELLS, ids=[t for _, t in PROCESS_CELLS])
def test_waiting_clients_see_peer_failure_within_2s_of_kill_9(placement, transport, tmp_path):
    before = our_segments()
    hung = tmp_path / "hung"
    owner = make_server(placement, transport, hang_marker=str(hung)).start()
    try:
        clients = [owner.client() for _ in range(3)]
        futures = [c.submit(request(2e6)) for c in clients]  # the server hangs on this batch
        wait_until(hung.exists, timeout=30, what="the server to hang in its forward pass")
        os.kill(owner.host.pid, signal.SIGKILL)
        killed = time.monotonic()
        for future in futures:
            with pytest.raises(PeerFailureError):
                future.result(timeout=10)
        assert time.monotonic() - killed < 2.0
        assert not owner.is_alive
        with pytest.raises(PeerFailureError):
            clients[0].submit(request(1)).result(timeout=5)
    finally:
        owner.shutdown()
    assert our_segments() == before


def test_an_error_while_building_in_the_child_surfaces_at_start():
    owner = InferenceServer(InferenceServerConfig(placement="process"), policy_factory=failing_factory,
                            transport="queue")
    with pytest.raises(RemoteError) as info:
        owner.start()
    assert info.value.remote_type == "RuntimeError"
    assert "cannot build this policy here" in info.value.remote_message
    assert "failing_factory" in info.value.remote_traceback
    owner.shutdown()


def _parent_that_dies(pid_file):
    owner = make_server("process", "queue").start()
    with open(pid_file, "w") as f:
        f.write(str(owner.host.pid))
    time.sleep(60)


@pytest.mark.slow  # spawned interpreters import torch: seconds
def test_the_child_exits_when_its_parent_dies(tmp_path):
    pid_file = tmp_path / "child.pid"
    parent = mp.get_context("spawn").Process(target=_parent_that_dies, args=(str(pid_file),))
    parent.start()
    child = int(wait_until(lambda: pid_file.exists() and pid_file.read_text(), timeout=60, what="the server's pid"))
    os.kill(parent.pid, signal.SIGKILL)
    parent.join()
    wait_until(lambda: process_gone(child), timeout=10, what="the server child to exit after its parent")




# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("transport", ["shared_memory", "process_slot"])
def test_fixed_layout_mistakes_fail_in_the_caller_and_others_keep_being_served(transport):
    with make_server("process", transport) as owner:
        client, other = owner.client(), owner.client()
        with pytest.raises(LayoutError) as info:
            client(TensorDict({"obs": torch.zeros(4)}))
        assert info.value.key == ("observation",) and info.value.got == "a missing key"
        with pytest.raises(LayoutError, match=r"expected shape \[4\], got shape \[5\]"):
            client(TensorDict({"observation": torch.zeros(5)}))
        with pytest.raises(LayoutError, match="expected dtype float32, got dtype float64"):
            client(TensorDict({"observation": torch.zeros(4, dtype=torch.float64)}))
        with pytest.raises(LayoutError, match="use transport 'queue'"):
            client(TensorDict({"observation": NonTensorData("text")}))
        out = client(TensorDict({"observation": torch.ones(4), "extra": torch.ones(2)}))  # extra keys dropped
        assert out["action"][0].item() == 2.0
        assert other(request(1))["action"][0].item() == 2.0


def test_queue_carries_non_tensor_data():
    with make_server("process", "queue") as owner:
        out = owner.client()(TensorDict({"observation": torch.ones(4), "note": NonTensorData("hello")}))
        assert out["action"][0].item() == 2.0 and out["note"] == "hello"


def test_incompatible_transports_are_refused_at_construction():
    from transports.queue import QueueTransport

    with pytest.raises(IncompatibleCombinationError, match="placed on 'thread' does not support transport 'queue'"):
        make_server("thread", "queue")
    transport = QueueTransport()
    try:
        with pytest.raises(IncompatibleCombinationError, match="placed on 'thread' does not support transport 'queue'"):
            InferenceServer(InferenceServerConfig(placement="thread"), policy_factory=echo_factory, transport=transport)
    finally:
        transport.close()
    with pytest.raises(ConfigurationError, match="process placement requires policy_factory"):
        InferenceServer(InferenceServerConfig(placement="process"), policy=echo_factory())


@pytest.mark.parametrize("transport", [None, "auto", "shared_memory", "process_slot", "distributed", "queue"])
def test_half_a_fixed_layout_is_refused_at_construction_naming_the_missing_one(transport):
    from components import transport_backend
    from components.resolution import resolve_component

    config = InferenceServerConfig(placement="process")
    shown = transport or "shared_memory"  # without one, the scope's transport is named
    for given, missing, layout in (("request_layout", "response_layout", REQUEST),
                                   ("response_layout", "request_layout", RESPONSE)):
        with transport_backend("shared_memory"), pytest.raises(IncompatibleCombinationError) as info:
            InferenceServer(config, policy_factory=echo_factory, transport=transport, **{given: layout})
        assert info.value.path == f"components.inference.{missing}"
        assert info.value.message.startswith(f"inference server has {given} but no {missing} (transport {shown!r}): "
                                             "a fixed layout needs both"), info.value.message
    if transport == "auto":  # a resolution that chose queue for want of layouts is refused as well
        resolved = resolve_component("inference", "process", "auto", layouts={"request": REQUEST})
        with pytest.raises(IncompatibleCombinationError, match="has request_layout but no response_layout"):
            InferenceServer(config, policy_factory=echo_factory, resolved=resolved)


def test_auto_resolution_is_pinned():
    def auto(placement, layouts):
        kwargs = {"request_layout": REQUEST, "response_layout": RESPONSE} if layouts else {}
        return InferenceServer(InferenceServerConfig(placement=placement), policy_factory=echo_factory, **kwargs)

    assert auto("direct", False).transport_kind == "direct"
    assert auto("thread", False).transport_kind == "thread"
    assert auto("process", True).transport_kind == "shared_memory"
    owner = auto("process", False)
    assert owner.transport_kind == "queue" and owner.transport_reason.startswith("auto: process owner without fixed layouts")


def test_layout_from_a_representative_tensordict_matches_the_server_contract():
    assert Layout.from_tensordict(REQUEST).describe() == "observation [4] float32"
