"""A replay client's domain operations: an update's minibatches fetched several per call, prioritized samples with
their weights, and rows taken from a FIFO queue, without the bookkeeping keys a sample carries."""

import pytest
import torch
from tensordict import TensorDict

from components.replay import ReplayBuffer, ReplayConfig
from components.replay import operations
from components.replay.operations import rows_per_call


class _Counting:
    """A replay buffer's ``sample``, its calls counted (the operations run over it)."""

    def __init__(self, sample):
        self._sample, self.calls = sample, 0

    def sample(self, n=None):
        self.calls += 1
        return self._sample(n)


@pytest.mark.parametrize("fitting, per_update", [(None, 12), (5, 4)])
def test_minibatches_are_what_one_call_per_minibatch_gives_while_the_buffer_fills(monkeypatch, fitting, per_update):
    # sync=false with two collectors: each batch is half the buffer, which holds one, then two of them; an update's
    # 12 minibatches of 32 rows come in one call (small rows), or in calls of 4 when only 5 minibatches fit in
    # SAMPLE_BYTES
    count, size, capacity = 12, 32, 128
    half = capacity // 2
    if fitting is not None:
        monkeypatch.setattr(operations, "SAMPLE_BYTES", fitting * size * 8)  # rows of one int64
    got, expected, calls = [], [], []
    for out, grouped in ((got, True), (expected, False)):
        with ReplayBuffer(ReplayConfig(capacity=capacity, sampler="without_replacement", batch_size=size),
                          seed=5) as rb:
            counting = _Counting(rb.sample)
            rb.sample = counting.sample  # the buffer's own operations go through the count
            for start in (0, 1000, 2000):  # the buffer holds 64, then 128, then 128 rows
                rb.extend(TensorDict({"action": torch.arange(start, start + half)}, [half]))
                before = counting.calls
                if grouped:
                    out += [mb["action"] for mb in rb.minibatches(count, size)]
                    calls.append(counting.calls - before)
                else:
                    out += [rb.sample()["action"] for _ in range(count)]
    assert len(got) == 3 * count and all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert calls == [count // per_update] * 3
    assert rows_per_call(100, count, size) == size  # minibatches that do not tile a batch: one per call


def test_minibatches_hold_only_the_rows_written():
    with ReplayBuffer(ReplayConfig(capacity=16, sampler="without_replacement", batch_size=4), seed=0) as rb:
        rb.extend(TensorDict({"action": torch.arange(16)}, [16]))
        batches = list(rb.minibatches(4, 4))
    assert len(batches) == 4 and all(set(mb.keys()) == {"action"} for mb in batches)
    assert sorted(torch.cat([mb["action"] for mb in batches]).tolist()) == list(range(16))


def test_a_prioritized_sample_carries_its_weights_and_positions_apart_from_its_rows():
    with ReplayBuffer(ReplayConfig(capacity=8, batch_size=4, sampler="prioritized", alpha=1.0, beta=1.0), seed=0) as rb:
        rb.extend(TensorDict({"action": torch.arange(8)}, [8]))
        rb.update_priority(torch.arange(8), torch.tensor([1.0, 2.0, 3.0, 4.0, 0.5, 0.5, 1.0, 8.0]))
        sample = rb.sample_prioritized()
        assert set(sample.rows.keys()) == {"action"}
        assert torch.equal(sample.rows["action"], sample.index)  # row i holds action i
        assert sample.weight.shape == (4,) and sample.weight.max() <= 1.0 + 1e-6 and sample.weight.min() > 0
        rb.update_priority(sample.index, torch.ones(4))  # the positions go back as they came


def test_an_unweighted_sampler_gives_weights_of_one():
    with ReplayBuffer(ReplayConfig(capacity=8, batch_size=4, sampler="uniform"), seed=0) as rb:
        rb.extend(TensorDict({"action": torch.arange(8)}, [8]))
        sample = rb.sample_prioritized()
    assert torch.equal(sample.weight, torch.ones(4))


def test_take_hands_out_the_oldest_rows_as_written():
    with ReplayBuffer(ReplayConfig(capacity=8, batch_size=3, sampler="fifo"), seed=0) as rb:
        rb.extend(TensorDict({"action": torch.arange(6)}, [6]))
        first, second = rb.take(), rb.take()
    assert set(first.keys()) == {"action"}
    assert first["action"].tolist() == [0, 1, 2] and second["action"].tolist() == [3, 4, 5]
