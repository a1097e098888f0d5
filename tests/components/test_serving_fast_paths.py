"""The serving loop over a slot endpoint, in one process: the shortcuts of the small-request path (one-slot
batches, fixed response keys, reused version tensors) answer exactly as the general path does."""

import os

import pytest
import torch
from tensordict import NonTensorData, TensorDict
from torch import nn

from components.errors import LayoutError
from components.inference.config import InferenceServerConfig
from components.inference.core import ServingCore
from transports.slots.process_slot import ProcessSlotTransport
from transports.slots.shared_memory import SharedMemoryTransport

REQUEST = TensorDict({"observation": torch.zeros(4)})
RESPONSE = TensorDict({"action": torch.zeros(4), "policy_version": torch.zeros((), dtype=torch.long)})
NESTED = TensorDict({"obs": {"pixels": torch.zeros(2), "state": torch.zeros(3)}})  # a request layout with nested keys


class Double(nn.Module):
    """Writes ``action`` into the batch it is given and returns that batch."""

    def forward(self, td):
        td.set("action", td.get("observation") * 2)
        return td


class KeepsItsOutput(nn.Module):
    """Returns a TensorDict of its own (inputs included) and keeps it."""

    def __init__(self):
        super().__init__()
        self.last = None

    def forward(self, td):
        self.last = TensorDict({"observation": td.get("observation").clone(), "action": td.get("observation") * 3},
                               td.batch_size)
        return self.last


def obs(value: float) -> TensorDict:
    return TensorDict({"observation": torch.full((4,), float(value))})


@pytest.fixture(params=[SharedMemoryTransport, ProcessSlotTransport], ids=["shared_memory", "process_slot"])
def kind(request):
    return request.param


def serving(kind, policy, request_layout=REQUEST, response_layout=RESPONSE, clients=3):
    transport = kind(request_layout, response_layout, num_slots=clients)
    transport.mark_serving(os.getpid())
    server = transport.server()
    core = ServingCore(policy, server, InferenceServerConfig())
    return transport, [transport.client() for _ in range(clients)], server, core


def test_one_and_many_request_batches_are_private_cpu_copies_in_submission_order(kind):
    transport, clients, server, _ = serving(kind, Double())
    try:
        futures = [clients[0].submit(obs(7))]
        batch = server.collect(16, 1, 0.0, 0.05)
        assert batch.handles == [futures[0].slot] and len(batch.enqueued) == 1
        assert batch.stacked.batch_size == torch.Size([1]) and batch.stacked.device == torch.device("cpu")
        assert batch.stacked["observation"].tolist() == [[7.0] * 4]
        batch.stacked["observation"].fill_(-1)  # the batch is the server's own copy, not the slot
        assert server._req_all[batch.handles[0]]["observation"].tolist() == [7.0] * 4
        server.fail(batch, RuntimeError("done"))
        with pytest.raises(Exception):
            futures[0].result(timeout=5)

        order = [2, 0, 1]
        futures = {i: clients[i].submit(obs(i)) for i in order}
        batch = server.collect(16, 1, 0.0, 0.05)
        assert batch.handles == [futures[i].slot for i in order]
        assert batch.enqueued == sorted(batch.enqueued)
        assert batch.stacked.batch_size == torch.Size([3]) and batch.stacked.device == torch.device("cpu")
        assert batch.stacked["observation"][:, 0].tolist() == [float(i) for i in order]
    finally:
        transport.close()


def test_nested_request_keys_take_the_general_copy():
    transport, clients, server, _ = serving(SharedMemoryTransport, Double(), NESTED, clients=1)
    try:
        clients[0].submit(TensorDict({"obs": {"pixels": torch.ones(2), "state": torch.full((3,), 5.0)}}))
        batch = server.collect(16, 1, 0.0, 0.05)
        assert batch.stacked.batch_size == torch.Size([1]) and batch.stacked.device == torch.device("cpu")
        assert batch.stacked["obs", "state"].tolist() == [[5.0] * 3]
        assert batch.stacked["obs", "pixels"].tolist() == [[1.0] * 2]
    finally:
        transport.close()


def test_answers_and_versions_through_the_fixed_layout_path(kind):
    transport, clients, server, core = serving(kind, Double())
    try:
        for version in (0, 1, 2):
            # one request, then three in one batch: each batch size gets the current version
            future = clients[0].submit(obs(1))
            core.serve(server.collect(16, 1, 0.0, 0.05))
            out = future.result(timeout=5)
            assert out["action"].tolist() == [2.0] * 4 and out["policy_version"].item() == version
            futures = [c.submit(obs(i)) for i, c in enumerate(clients)]
            core.serve(server.collect(16, 1, 0.0, 0.05))
            for i, f in enumerate(futures):
                out = f.result(timeout=5)
                assert out["action"].tolist() == [2.0 * i] * 4 and out["policy_version"].item() == version
                assert set(out.keys()) == {"action", "policy_version"}
            core.request_update({}, None)
            core.apply_updates()
    finally:
        transport.close()


@pytest.mark.parametrize("response_layout", [RESPONSE, TensorDict({"out": {"action": torch.zeros(4)},
                                                                     "policy_version": torch.zeros((), dtype=torch.long)})],
                         ids=["flat", "nested"])
def test_an_answer_is_the_private_copy_the_general_clone_makes(kind, response_layout):
    class Nested(nn.Module):
        def forward(self, td):
            td.set(("out", "action") if "out" in response_layout.keys() else "action", td.get("observation") * 2)
            return td

    transport, clients, server, core = serving(kind, Nested(), response_layout=response_layout, clients=1)
    try:
        future = clients[0].submit(obs(3))
        core.serve(server.collect(16, 1, 0.0, 0.05))
        slot = future.slot
        expected = clients[0]._resp_rows[slot].clone()  # the general path, read before the slot is given back
        out = future.result(timeout=5)
        assert type(out) is type(expected) and out.batch_size == expected.batch_size and out.device == expected.device
        assert set(out.keys(True, True)) == set(expected.keys(True, True))
        assert all(out.get(k).dtype == expected.get(k).dtype and torch.equal(out.get(k), expected.get(k))
                   for k in expected.keys(True, True))
        for key in out.keys(True, True):  # nothing shares the slot's memory: the next answer cannot change this one
            out.get(key).add_(1)
        assert torch.equal(clients[0]._resp_rows[slot].get(key), expected.get(key))
    finally:
        transport.close()


def test_a_policy_s_own_output_is_left_untouched(kind):
    policy = KeepsItsOutput()
    transport, clients, server, core = serving(kind, policy)
    try:
        future = clients[0].submit(obs(2))
        core.serve(server.collect(16, 1, 0.0, 0.05))
        assert future.result(timeout=5)["action"].tolist() == [6.0] * 4
        assert set(policy.last.keys()) == {"observation", "action"}  # no policy_version written into it
    finally:
        transport.close()


def test_a_response_key_that_is_also_an_input_is_still_dropped(kind):
    response_layout = RESPONSE.clone().set("observation", torch.zeros(4))
    transport, clients, server, core = serving(kind, Double(), response_layout=response_layout)
    try:
        future = clients[0].submit(obs(1))
        core.serve(server.collect(16, 1, 0.0, 0.05))
        with pytest.raises(LayoutError) as info:
            future.result(timeout=5)
        assert info.value.key == ("observation",) and info.value.got == "a missing key"
        other = clients[1].submit(obs(1))  # the server keeps serving
        core.serve(server.collect(16, 1, 0.0, 0.05))
        with pytest.raises(LayoutError):
            other.result(timeout=5)
    finally:
        transport.close()


def test_serving_outside_the_loop_still_runs_without_gradients(kind):
    class GradProbe(nn.Module):
        def forward(self, td):
            td.set("action", td.get("observation") + float(torch.is_grad_enabled()))
            return td

    transport, clients, server, core = serving(kind, GradProbe())
    try:
        assert torch.is_grad_enabled()
        future = clients[0].submit(obs(1))
        core.serve(server.collect(16, 1, 0.0, 0.05))
        assert future.result(timeout=5)["action"].tolist() == [1.0] * 4
        assert torch.is_grad_enabled()
    finally:
        transport.close()


# ---------------------------------------------------------------------------------------------- general-path shortcuts
def _rebuilt(wire):
    import pickle

    from transports.queue.wire import from_wire

    return from_wire(pickle.loads(pickle.dumps(wire, protocol=pickle.HIGHEST_PROTOCOL)))


def _same(a, b) -> bool:
    if type(a) is not type(b) or a.batch_size != b.batch_size or a.device != b.device:
        return False
    if set(a.keys(True, True)) != set(b.keys(True, True)):
        return False
    for key in a.keys(True, True):
        x, y = a.get(key), b.get(key)
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)):
                return False
        elif x != y:
            return False
    return True


@pytest.mark.parametrize("answer", [
    TensorDict({"action": torch.arange(12.0).view(3, 4), "policy_version": torch.zeros(3, dtype=torch.long)}, [3]),
    TensorDict({"a": torch.arange(6).view(2, 3).t(), "empty": torch.empty(3, 0)}, [3], device="cpu"),
    TensorDict({"a": torch.ones(2, 2), "nested": {"x": torch.ones(2)}}, [2]),
    TensorDict({"a": torch.ones(2, 2), "text": NonTensorData("hi", batch_size=[2])}, [2]),
    TensorDict({"action": torch.arange(4.0).view(1, 4), "v": torch.zeros(1, dtype=torch.long)}, [1]),
    TensorDict({"b": torch.arange(8.0).view(2, 4).t()[:1].to(torch.bfloat16), "s": torch.arange(3.0)[None, 1:]}, [1]),
    TensorDict({"b": torch.randn(2, 3).to(torch.bfloat16), "flag": torch.tensor([True, False])}, [2]),
], ids=["flat", "strided-cpu", "nested", "non-tensor", "one-row", "one-row-strided-bfloat16", "bfloat16-bool"])
def test_queue_rows_travel_as_their_row_tensordicts_would(answer):
    from transports.queue.wire import rows_to_wire, to_wire

    n = answer.batch_size[0]
    for row, wire in zip(range(n), rows_to_wire(answer, n)):
        expected = to_wire(answer[row])
        assert wire[0] == expected[0]
        assert _same(_rebuilt(wire), _rebuilt(expected))
    assert rows_to_wire([("a",), ("b",)], 2) == [to_wire(("a",)), to_wire(("b",))]  # commands and other answers


@pytest.mark.parametrize("request_td", [
    TensorDict({"observation": torch.ones(4)}),
    TensorDict({"o": torch.arange(24.0).view(8, 3).t(), "done": torch.zeros(3, dtype=torch.bool)}, [3]),
    TensorDict({"o": torch.ones(2)}, device="cpu"),
    TensorDict({"obs": {"x": torch.ones(2)}}),
    TensorDict({"o": torch.ones(2), "text": NonTensorData("hi")}),
], ids=["flat", "strided-batched", "cpu", "nested", "non-tensor"])
def test_a_single_request_batch_is_what_stack_and_move_make(request_td):
    from components.inference.core import default_collate
    from transports.thread import ThreadTransport

    core = ServingCore(nn.Identity(), ThreadTransport().server(), InferenceServerConfig())
    expected = default_collate([request_td]).to("cpu")
    got = core._collate_one([request_td])
    if got is None:  # the general path serves it
        assert any(type(value) is not torch.Tensor for value in request_td.values())
        return
    assert _same(got, expected)
    for key in got.keys():
        assert got[key].is_contiguous() and got[key].data_ptr() != request_td[key].data_ptr()  # a copy, as stack


def test_threads_sharing_one_queue_client_each_get_their_answers_in_any_reading_order():
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from transports.queue import QueueTransport

    transport = QueueTransport()
    client, stop = transport.client(), threading.Event()
    core = ServingCore(Double(), transport.server(), InferenceServerConfig(max_batch_size=4))
    transport.mark_serving(os.getpid())
    loop = threading.Thread(target=core.run, args=(stop,), daemon=True)
    loop.start()

    def work(i):
        for k in range(20):
            futures = [client.submit(obs(i * 1000 + k * 10 + j)) for j in range(3)]
            for j in (2, 0, 1):  # answers arrive in submission order; read them out of it
                assert futures[j].result(timeout=30)["action"][0].item() == 2 * (i * 1000 + k * 10 + j)
        return True

    try:
        with ThreadPoolExecutor(4) as pool:
            assert all(pool.map(work, range(4)))
    finally:
        stop.set()
        loop.join(10)
        transport.close()


def test_an_endpoint_of_private_copies_serves_without_copying_and_answers_stay_apart():
    from transports.queue import QueueTransport

    transport = QueueTransport()
    transport.mark_serving(os.getpid())
    server = transport.server()
    core = ServingCore(Double(), server, InferenceServerConfig())
    client = transport.client()
    try:
        assert server.private_copies and core._private
        request = obs(3)
        expected = torch.stack([request]).to("cpu")
        got = core._collate_one([request])
        assert _same(got, expected)
        assert got["observation"].data_ptr() == request["observation"].data_ptr()  # a view, not a copy
        answers = []
        for version in (0, 1):
            future = client.submit(obs(version + 1))
            core.serve(server.collect(16, 1, 0.0, 1.0))
            answers.append(future.result(timeout=5))
            core.request_update({}, None)
            core.apply_updates()
        # the version tensor is shared between batches on the server; each answer was encoded, so stays as sent
        assert [a["policy_version"].item() for a in answers] == [0, 1]
        assert [a["action"].tolist() for a in answers] == [[2.0] * 4, [4.0] * 4]
    finally:
        transport.close()


def test_a_batch_of_large_answers_is_scattered_row_by_row_to_the_right_callers(kind):
    request_layout = TensorDict({"observation": torch.zeros(4), "frame": torch.zeros(16384, dtype=torch.uint8)})
    response_layout = TensorDict({"action": torch.zeros(4), "next_frame": torch.zeros(16384, dtype=torch.uint8),
                                  "policy_version": torch.zeros((), dtype=torch.long)})

    class Echo(nn.Module):
        def forward(self, td):
            td.set("action", td.get("observation") * 2)
            td.set("next_frame", td.get("frame") + 1)
            return td

    transport, clients, server, core = serving(kind, Echo(), request_layout, response_layout, clients=3)
    try:
        # policy_version is not copied (the server writes the version into the slots): only the 16 KiB leaf of
        # action and next_frame goes row by row
        assert server._resp_by_row == [False, True]
        futures = [c.submit(TensorDict({"observation": torch.full((4,), float(i)),
                                        "frame": torch.full((16384,), i, dtype=torch.uint8)})) for i, c in enumerate(clients)]
        batch = server.collect(16, 3, 1.0, 1.0)
        assert len(batch) == 3
        core.serve(batch)
        for i, future in enumerate(futures):
            out = future.result(timeout=5)
            assert out["action"].tolist() == [2.0 * i] * 4
            assert bool((out["next_frame"] == i + 1).all())
            assert out["policy_version"].item() == core.version
    finally:
        transport.close()


def test_a_batch_of_nested_requests_is_gathered_in_submission_order():
    transport, clients, server, _ = serving(SharedMemoryTransport, Double(), NESTED, clients=3)
    try:
        for i, c in enumerate(clients):
            c.submit(TensorDict({"obs": {"pixels": torch.full((2,), float(i)), "state": torch.full((3,), 10.0 + i)}}))
        batch = server.collect(16, 3, 1.0, 1.0)
        assert batch.stacked.batch_size == torch.Size([3])
        assert batch.stacked["obs", "pixels"][:, 0].tolist() == [0.0, 1.0, 2.0]
        assert batch.stacked["obs", "state"][:, 0].tolist() == [10.0, 11.0, 12.0]
        assert batch.stacked["obs", "state"].untyped_storage().data_ptr() != \
            server._req_all["obs", "state"].untyped_storage().data_ptr()  # a copy, not the slots
    finally:
        transport.close()


class ClaimsAVersion(nn.Module):
    """Writes ``action`` and a ``policy_version`` of its own, which the server's stamp must replace."""

    def forward(self, td):
        td.set("action", td.get("observation") * 2)
        td.set("policy_version", torch.full(td.batch_size, 99, dtype=torch.long))
        return td


@pytest.mark.parametrize("n", [1, 3])
def test_slot_servers_stamp_the_serving_version_into_every_answer(kind, n):
    transport, clients, server, core = serving(kind, ClaimsAVersion())
    try:
        assert server.stamps_version
        for version in (0, 7):
            if version:
                core.request_update(core.policy.state_dict(), version)
                core.apply_updates()
            futures = [c.submit(obs(i)) for i, c in enumerate(clients[:n])]
            batch = server.collect(16, n, 1.0, 1.0)
            assert len(batch) == n
            core.serve(batch)
            for i, future in enumerate(futures):
                out = future.result(timeout=5)
                assert out["action"].tolist() == [2.0 * i] * 4
                assert out["policy_version"].dtype == torch.long and out["policy_version"].shape == ()
                assert out["policy_version"].item() == version  # the server's, not the policy's 99
    finally:
        transport.close()


def test_a_response_layout_without_policy_version_is_served(kind):
    transport, clients, server, core = serving(kind, Double(), response_layout=TensorDict({"action": torch.zeros(4)}))
    try:
        future = clients[0].submit(obs(3))
        core.serve(server.collect(16, 1, 1.0, 1.0))
        out = future.result(timeout=5)
        assert set(out.keys()) == {"action"} and out["action"].tolist() == [6.0] * 4
    finally:
        transport.close()


def test_answers_of_a_dtype_numpy_lacks_are_private_copies(kind):
    request = TensorDict({"observation": torch.zeros(4, dtype=torch.bfloat16)})
    response = TensorDict({"action": torch.zeros(4, dtype=torch.bfloat16),
                           "policy_version": torch.zeros((), dtype=torch.long)})
    transport, clients, server, core = serving(kind, Double(), request, response)
    try:
        first = clients[0].submit(TensorDict({"observation": torch.full((4,), 1.5, dtype=torch.bfloat16)}))
        core.serve(server.collect(16, 1, 1.0, 1.0))
        answer = first.result(timeout=5)
        assert answer["action"].dtype == torch.bfloat16 and answer["action"].tolist() == [3.0] * 4
        second = clients[0].submit(TensorDict({"observation": torch.full((4,), 4.0, dtype=torch.bfloat16)}))
        core.serve(server.collect(16, 1, 1.0, 1.0))
        assert second.result(timeout=5)["action"].tolist() == [8.0] * 4
        assert answer["action"].tolist() == [3.0] * 4  # the first answer did not change with the slot
    finally:
        transport.close()


def test_a_server_that_died_unseen_fails_the_waiting_request_and_the_next_submit(kind):
    import subprocess

    from components.errors import PeerFailureError

    gone = subprocess.Popen(["true"])  # a process that is gone once waited for
    gone.wait(30)
    transport = kind(REQUEST, RESPONSE, num_slots=2)
    try:
        transport.mark_serving(gone.pid)  # the flags say "serving", but that process is gone
        client = transport.client()
        future = client.submit(obs(1))  # a submit reads the flags only
        with pytest.raises(PeerFailureError, match=f"pid {gone.pid}"):
            future.result(timeout=5)  # the waiting loop probes the pid
        with pytest.raises(PeerFailureError):
            client.submit(obs(2)).result(timeout=5)
    finally:
        transport.close()


@pytest.mark.parametrize("version", [torch.zeros((), dtype=torch.float32), torch.zeros(1, dtype=torch.long)],
                         ids=["float32", "shape [1]"])
def test_a_response_layout_whose_policy_version_the_server_cannot_stamp_is_refused(kind, version):
    from components.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="policy_version.*int64 of shape \\[\\]"):
        kind(REQUEST, TensorDict({"action": torch.zeros(4), "policy_version": version}), num_slots=2)


@pytest.mark.parametrize("n", [1, 2])
def test_an_answer_the_endpoint_cannot_write_fails_its_callers_and_the_loop_serves_on(kind, n):
    from components.errors import RemoteError

    transport, clients, server, core = serving(kind, Double())
    try:
        core.request_update({}, 2**63)  # a version no int64 slot can hold: reply raises while writing it
        core.apply_updates()
        futures = [c.submit(obs(1)) for c in clients[:n]]
        core.serve(server.collect(16, n, 1.0, 1.0))  # must not raise: the batch's callers get the error
        for future in futures:
            with pytest.raises(RemoteError, match="OverflowError"):
                future.result(timeout=5)
        core.request_update({}, 5)
        core.apply_updates()
        future = clients[0].submit(obs(4))
        core.serve(server.collect(16, 1, 1.0, 1.0))
        answer = future.result(timeout=5)
        assert answer["action"].tolist() == [8.0] * 4 and answer["policy_version"].item() == 5
    finally:
        transport.close()
