"""Each producer's requests to a ``ray``-placed server are served in the order it submitted them.

The policy numbers the rows it serves, in the order it sees them across batches, so the test checks the order
the server batched the requests in, not only that each answer matches its request.
"""

import threading

import pytest
import torch
from tensordict import TensorDict
from torch import nn

from components.inference import InferenceServer, InferenceServerConfig

from tests.helpers import our_live_actors, wait_until

from transports import actor_calls
from transports.actor_calls import Sequencer

on_ray = pytest.mark.usefixtures("ray_cluster")

REQUESTS = 50


class ServingOrder(nn.Module):
    """Echoes each request's ``index`` and writes ``position``: where the row came in the serving order."""

    def __init__(self):
        super().__init__()
        self.served = 0

    def forward(self, td):
        n = td.batch_size[0]
        td["echo"] = td["index"].clone()
        td["position"] = torch.arange(self.served, self.served + n)
        self.served += n
        return td


@pytest.fixture(scope="module")
def server(ray_session):
    owner = InferenceServer(InferenceServerConfig(placement="ray", max_batch_size=8, timeout=0.002),
                            policy_factory=ServingOrder).start()
    yield owner
    owner.shutdown()
    wait_until(lambda: our_live_actors() == [], timeout=10, what="the server's actor to stop")


def produce(client, producer: int, out: dict) -> None:
    """Submit REQUESTS requests back to back without waiting, then collect their answers."""
    futures = [client.submit(TensorDict({"index": torch.tensor(i), "producer": torch.tensor(producer)}))
               for i in range(REQUESTS)]
    out[producer] = [f.result(60) for f in futures]


def check_order(answers: list) -> None:
    assert [a["echo"].item() for a in answers] == list(range(REQUESTS))  # each answer belongs to its request
    positions = [a["position"].item() for a in answers]
    assert positions == sorted(positions), f"served out of submission order: {positions}"


@pytest.mark.slow  # an actor is a new worker process: seconds
@on_ray
def test_one_producer_is_served_in_submission_order(server):
    out: dict = {}
    produce(server.client(), 0, out)
    check_order(out[0])


@pytest.mark.slow  # an actor is a new worker process: seconds
@on_ray
def test_concurrent_producers_each_keep_their_order(server):
    out: dict = {}
    threads = [threading.Thread(target=produce, args=(server.client(), p, out)) for p in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(out) == [0, 1, 2]
    for answers in out.values():
        check_order(answers)
    mixed = {p: {a["position"].item() for a in answers} for p, answers in out.items()}
    assert len(set().union(*mixed.values())) == 3 * REQUESTS  # one serving order over all producers


@pytest.mark.slow  # an actor is a new worker process: seconds
@on_ray
def test_copies_of_one_client_are_separate_producers(server):
    client = server.client()
    out: dict = {}
    threads = [threading.Thread(target=produce, args=(c, p, out))
               for p, c in enumerate([client] + [pickle_copy(client) for _ in range(2)])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for answers in out.values():
        check_order(answers)


def pickle_copy(obj):
    import pickle

    return pickle.loads(pickle.dumps(obj))


# ---------------------------------------------------------------------------------------------- the in-actor order
def release_in_threads(sequencer: Sequencer, arrivals: list) -> list:
    """Let requests ``(producer, seq)`` arrive in the given order, each on its own thread; the release order."""
    released, threads = [], []
    for producer, seq in arrivals:
        threads.append(threading.Thread(target=sequencer.release, args=(producer, seq, lambda p=producer, s=seq:
                                                                          released.append((p, s)))))
        threads[-1].start()
        threads[-1].join(0.05)  # the next one arrives later
    for t in threads:
        t.join(10)
    return released


def test_early_requests_wait_for_their_predecessors_only():
    released = release_in_threads(Sequencer(), [(b"a", 2), (b"b", 0), (b"a", 1), (b"a", 0), (b"b", 1)])
    assert [s for p, s in released if p == b"a"] == [0, 1, 2]
    assert released[0] == (b"b", 0)  # another producer's request did not wait behind the gap


def test_a_lost_predecessor_stops_blocking_after_the_gap_timeout(monkeypatch):
    monkeypatch.setattr(actor_calls, "GAP_TIMEOUT", 0.2)
    sequencer = Sequencer()
    assert release_in_threads(sequencer, [(b"a", 1), (b"a", 2)]) == [(b"a", 1), (b"a", 2)]
    assert release_in_threads(sequencer, [(b"a", 0)]) == [(b"a", 0)]  # late: released at once


def test_a_restarted_actor_takes_each_producer_from_its_first_request():
    assert release_in_threads(Sequencer(first_seen=True), [(b"a", 7), (b"a", 8)]) == [(b"a", 7), (b"a", 8)]
