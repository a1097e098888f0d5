"""The replay buffer in every placement and transport built: acknowledgement, errors, failures, no lost write."""

import os
import signal
import threading
import time

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from components.errors import LayoutError, PeerFailureError, RemoteError
from components.replay import PolicyAgeFilter, ReplayBuffer, ReplayConfig
from components.replay.payload import SERVER_OPS, positions
from components.replay.storage import ReplayStorage
from components.weight_sync import WeightSync, WeightSyncConfig
from transports.segments import segments_of

CELLS = [("direct", "direct"), ("thread", "thread"), ("process", "queue"), ("process", "shared_memory")]


def rows(n, start=0, obs_dim=4, version=0):
    return TensorDict(
        {
            "observation": torch.arange(start, start + n, dtype=torch.float32).unsqueeze(-1).expand(n, obs_dim).clone(),
            "id": torch.arange(start, start + n),
            "policy_version": torch.full((n,), version, dtype=torch.long),
        },
        batch_size=[n],
    )


def our_segments(*pids):
    """The shared-memory segments this process and ``pids`` created (another test run's are not ours)."""
    return set(segments_of([os.getpid(), *pids]))


@pytest.fixture(params=CELLS, ids=[f"{p}-{t}" for p, t in CELLS])
def cell(request):
    return request.param


def make(cell, seed=None, **options):
    placement, transport = cell
    return ReplayBuffer(ReplayConfig(placement=placement, **options), transport=transport, seed=seed)


def test_acknowledged_writes_are_counted_and_sampled(cell):
    with make(cell, capacity=1000, batch_size=32, seed=0) as owner:
        client = owner.client()
        assert client.extend(rows(100)).tolist() == list(range(100))
        assert len(client) == 100 and len(owner) == 100
        assert client.add(rows(1, start=100)[0]) == 100
        assert len(client) == 101
        sample = client.sample()
        assert sample.batch_size == torch.Size([32])
        assert torch.equal(sample["observation"][:, 0].long(), sample["id"])
        assert torch.equal(sample["index"], sample["id"])  # stored at the position of their id
        client.empty()
        assert len(client) == 0


INDEX_CELLS = CELLS + [pytest.param(c, marks=pytest.mark.slow)
                       for c in (("ray", "ray"), ("process", "distributed"), ("ray", "distributed"))]


@pytest.mark.parametrize("cell", INDEX_CELLS, ids=lambda c: "-".join(c))
def test_extend_returns_the_positions_written_and_they_update_priorities(cell, request):
    if cell[0] == "ray":
        request.getfixturevalue("ray_cluster")
    with make(cell, capacity=10, batch_size=4, sampler="prioritized", alpha=1.0, seed=0) as owner:
        client = owner.client()
        first = client.extend(rows(4))
        assert first.dtype == torch.int64 and first.shape == (4,) and first.tolist() == [0, 1, 2, 3]
        assert client.extend(rows(4, start=4)).tolist() == [4, 5, 6, 7]  # a bound length (distributed: over gloo)
        assert client.extend(rows(4, start=8)).tolist() == [8, 9, 0, 1]  # wraps around
        assert client.add(rows(1, start=12)[0]) == 2
        longer = client.extend(rows(12, start=20))  # longer than the capacity: its last 10 rows stay
        assert longer.tolist() == [3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4]
        stored = client.state_dict()["storage"]["id"]
        assert stored[longer[2:]].tolist() == list(range(22, 32))
        index = client.extend(rows(4, start=100))
        assert index.tolist() == [5, 6, 7, 8]  # after the oldest rows of the longer batch
        client.update_priority(index, torch.zeros(4))  # the rows just written (near-)never come up again
        drawn = torch.cat([client.sample()["id"] for _ in range(10)])
        assert not set(drawn.tolist()) & set(range(100, 104)), drawn


def test_remote_errors_raise_at_the_call_site_and_the_buffer_keeps_serving(cell):
    with make(cell, capacity=64, batch_size=8) as owner:
        client = owner.client()
        with pytest.raises((RuntimeError, RemoteError), match="empty replay buffer"):
            client.sample()
        client.extend(rows(16))
        with pytest.raises(LayoutError) as info:
            client.extend(rows(4, obs_dim=5))
        assert info.value.key == ("observation",)
        assert len(client) == 16 and client.sample()["observation"].shape == (8, 4)


def test_eight_concurrent_producers_lose_no_write(cell):
    producers, per_producer, chunk = 8, 50, 5
    with make(cell, capacity=10_000, batch_size=16) as owner:
        clients = [owner.client() for _ in range(producers)]

        def produce(p):
            for k in range(0, per_producer, chunk):
                start = p * 1000 + k
                assert len(clients[p].extend(rows(chunk, start=start))) == chunk

        threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert len(owner.client()) == producers * per_producer
        state = owner.client().state_dict()
    ids = sorted(state["storage"]["id"].tolist())
    assert ids == sorted(p * 1000 + k for p in range(producers) for k in range(per_producer))
    stored = state["storage"]
    assert torch.equal(stored["observation"][:, 0].long(), stored["id"])  # contents kept together


def test_state_dict_round_trip(cell):
    with make(cell, capacity=32, batch_size=4, sampler="prioritized", seed=3) as a, make(cell, capacity=32, batch_size=4,
                                                                                          sampler="prioritized") as b:
        ca, cb = a.client(), b.client()
        ca.extend(rows(20))
        ca.update_priority(torch.tensor([0, 1]), torch.tensor([5.0, 7.0]))
        cb.load_state_dict(ca.state_dict())
        assert len(cb) == 20
        sa, sb = ca.state_dict(), cb.state_dict()
        assert torch.equal(sa["storage"]["id"], sb["storage"]["id"])
        assert np.allclose(sa["sampler"]["tree"], sb["sampler"]["tree"])


PROCESS = [c for c in CELLS if c[0] == "process"]


@pytest.mark.parametrize("cell", PROCESS, ids=[t for _, t in PROCESS])
def test_peer_failure_after_kill_9_and_leak_free_shutdown(cell):
    before = our_segments()
    owner = make(cell, capacity=64, batch_size=8).start()
    child = owner.host.pid
    try:
        client = owner.client()
        client.extend(rows(8))
        client.sample()
        os.kill(owner.host.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(PeerFailureError):
            client.sample()
        assert time.monotonic() - start < 2.0
    finally:
        owner.shutdown()
        owner.shutdown()
    assert our_segments(child) - before == set()


def test_shared_memory_sample_layout_is_fixed_per_endpoint():
    with make(("process", "shared_memory"), capacity=64, batch_size=8) as owner:
        client = owner.client()
        client.extend(rows(4))
        client.extend(rows(28, start=4))  # a larger extend opens a larger staging area
        assert sorted(client.sample(8)["id"].tolist())[0] >= 0
        client.extend(rows(40, start=100))  # and again, after the first sample
        assert client.sample(8).batch_size == torch.Size([8])
        with pytest.raises(LayoutError, match="fixed by this endpoint's first sample"):
            client.sample(4)
        other = owner.client()  # another endpoint binds its own layout
        assert other.sample(4).batch_size == torch.Size([4])


def test_prioritized_frequencies_follow_priorities():
    """With alpha=1, item i is drawn with probability p_i / sum(p): checked within 3 standard errors."""
    with ReplayBuffer(ReplayConfig(capacity=8, batch_size=4000, sampler="prioritized", alpha=1.0, beta=1.0),
                      seed=0) as rb:
        rb.extend(rows(8))
        priorities = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.5, 0.5, 1.0, 8.0])
        rb.update_priority(torch.arange(8), priorities)
        counts = torch.zeros(8)
        draws = 0
        weights = []
        for _ in range(10):
            s = rb.sample()
            counts += torch.bincount(s["index"], minlength=8)
            draws += 4000
            weights.append(s["_weight"])
    expected = priorities / priorities.sum()
    observed = counts / draws
    stderr = (expected * (1 - expected) / draws).sqrt()
    assert ((observed - expected).abs() <= 3 * stderr + 1e-3).all(), (observed, expected)
    w = torch.cat(weights)
    assert w.max() <= 1.0 + 1e-6 and w.min() > 0  # importance weights normalised by the batch maximum


def test_policy_age_filter_at_extend_time():
    with WeightSync() as sync:
        for _ in range(5):
            sync.push({})
        flt = PolicyAgeFilter(max_policy_lag=2, source=sync, when="extend")
        with ReplayBuffer(ReplayConfig(capacity=100, batch_size=4), filters=[flt]) as rb:
            batch = torch.cat([rows(3, 0, version=1), rows(3, 10, version=3), rows(3, 20, version=5)])
            assert rb.extend(batch).tolist() == list(range(6))  # version 1 lags 4 > 2: dropped before storage
            assert sorted(rb.state_dict()["storage"]["id"].tolist()) == [10, 11, 12, 20, 21, 22]
            assert rb.add(rows(1, 30, version=0)[0]) is None and rb.add(rows(1, 40, version=5)[0]) == 6
        storage = ReplayStorage(capacity=100, sampler="uniform", batch_size=4, filters=[flt])
        answer = SERVER_OPS["extend"](storage, batch)  # a distributed answer keeps the batch's length, padded
        assert answer["index"].tolist() == [0, 1, 2, 3, 4, 5, -1, -1, -1]
        assert positions(answer).tolist() == list(range(6))


def test_policy_age_filter_at_sample_time_in_a_process_buffer():
    with WeightSync(WeightSyncConfig(placement="process"), template={"w": torch.zeros(1)}) as sync:
        client = sync.client()
        flt = PolicyAgeFilter(max_policy_lag=1, source=client, when="sample")
        with ReplayBuffer(ReplayConfig(capacity=100, batch_size=64, placement="process"), filters=[flt],
                          transport="queue") as rb:
            c = rb.client()
            c.extend(torch.cat([rows(10, 0, version=0), rows(10, 100, version=1)]))
            assert set(c.sample()["id"].tolist()) <= set(range(10)) | set(range(100, 110))
            sync.push({"w": torch.ones(1)})
            sync.push({"w": torch.ones(1)})  # live version 2: version 0 is now too old
            assert set(c.sample()["id"].tolist()) <= set(range(100, 110))
            assert len(c) == 20  # evicted from sampling, still counted until overwritten
