"""The direct replay buffer: lazily shaped storage, circular writes, the two samplers, layout errors."""

import re

import pytest
import torch
from tensordict import TensorDict

from components.errors import ConfigurationError, IncompatibleCombinationError, LayoutError
from components.replay import ReplayBuffer, ReplayConfig


def _batch(n, start=0):
    return TensorDict(
        {"observation": torch.arange(start, start + n, dtype=torch.float32).unsqueeze(-1).expand(n, 4).clone(),
         "action": torch.arange(start, start + n)},
        batch_size=[n],
    )


def test_extend_then_sample_uniform():
    with ReplayBuffer(ReplayConfig(capacity=100, batch_size=16), seed=0) as rb:
        assert rb.extend(_batch(40)).tolist() == list(range(40))
        assert len(rb) == 40
        sample = rb.sample()
        assert sample.batch_size == torch.Size([16])
        assert sample["observation"].shape == (16, 4)
        # every sampled row is one that was written, with its fields kept together
        assert torch.equal(sample["observation"][:, 0].long(), sample["action"])
        assert int(sample["action"].max()) < 40


def test_capacity_wraps_overwriting_the_oldest():
    with ReplayBuffer(ReplayConfig(capacity=10, batch_size=10, sampler="without_replacement"), seed=0) as rb:
        rb.extend(_batch(8))
        rb.extend(_batch(5, start=100))
        assert len(rb) == 10
        stored = set(rb.sample()["action"].tolist())
        assert stored == {3, 4, 5, 6, 7, 100, 101, 102, 103, 104}


def test_extend_returns_positions_in_row_order_and_add_its_one_position():
    with ReplayBuffer(ReplayConfig(capacity=8, batch_size=4, sampler="prioritized"), seed=0) as rb:
        assert rb.extend(_batch(6)).tolist() == [0, 1, 2, 3, 4, 5]
        assert rb.add(_batch(1, start=6)[0]) == 6
        index = rb.extend(_batch(3, start=7))
        assert index.dtype == torch.int64 and index.tolist() == [7, 0, 1]  # wrapped
        rb.update_priority(index, torch.tensor([1.0, 2.0, 3.0]))
        on_disk = rb.state_dict()["storage"]["action"]
        assert on_disk[index].tolist() == [7, 8, 9]
        longer = rb.extend(_batch(11, start=20))  # the last 8 rows stay, each where its position says
        assert longer.tolist() == [2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4]
        assert rb.state_dict()["storage"]["action"][longer[3:]].tolist() == list(range(23, 31))
        assert rb.extend(_batch(1, start=50)).tolist() == [5]  # the oldest row is overwritten next


def test_without_replacement_visits_every_item_once_per_epoch():
    with ReplayBuffer(ReplayConfig(capacity=64, sampler="without_replacement", batch_size=16), seed=1) as rb:
        rb.extend(_batch(64))
        for _ in range(3):  # three epochs
            seen = torch.cat([rb.sample()["action"] for _ in range(4)])
            assert sorted(seen.tolist()) == list(range(64))


def test_one_epoch_in_one_call_is_the_minibatches_in_order():
    # PPO samples each epoch in one call and splits it: the rows a minibatch at a time would have given, in order
    minibatches, epochs = [], []
    for one_call in (False, True):
        with ReplayBuffer(ReplayConfig(capacity=64, sampler="without_replacement", batch_size=16), seed=3) as rb:
            rb.extend(_batch(64))
            for _ in range(3):
                if one_call:
                    epochs += list(rb.sample(64)["action"].split(16))
                else:
                    minibatches += [rb.sample()["action"] for _ in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(minibatches, epochs, strict=True))
    assert not torch.equal(torch.cat(epochs[:4]), torch.cat(epochs[4:8]))  # each epoch its own permutation


def test_several_epochs_in_one_call_are_what_consecutive_calls_give():
    # PPO asks for all of an update's minibatches at once: what is left of the current epoch, then new epochs
    calls = []
    for sizes in ((8, 8, 8, 8, 8, 8, 8, 8, 8, 8), (8, 72)):
        with ReplayBuffer(ReplayConfig(capacity=32, sampler="without_replacement", batch_size=8), seed=4) as rb:
            rb.extend(_batch(32))
            calls.append(torch.cat([rb.sample(n)["action"] for n in sizes]))
            after = rb.sample(8)["action"]  # the sampler's state goes on from there the same way
            calls[-1] = torch.cat([calls[-1], after])
    assert torch.equal(calls[0], calls[1])
    epochs = calls[1][:32], calls[1][32:64]  # each a permutation of its own
    assert all(sorted(epoch.tolist()) == list(range(32)) for epoch in epochs)
    assert not torch.equal(*epochs)


def test_a_write_starts_a_new_epoch():
    with ReplayBuffer(ReplayConfig(capacity=32, sampler="without_replacement", batch_size=8), seed=2) as rb:
        rb.extend(_batch(32))
        rb.sample()
        rb.extend(_batch(32, start=1000))  # PPO: a fresh batch replaces the old one
        seen = torch.cat([rb.sample()["action"] for _ in range(4)])
        assert sorted(seen.tolist()) == list(range(1000, 1032))


def test_fifo_gives_each_item_once_oldest_first_and_len_counts_the_queue():
    with ReplayBuffer(ReplayConfig(capacity=8, sampler="fifo", batch_size=3), seed=0) as rb:
        rb.extend(_batch(5))
        assert len(rb) == 5
        assert rb.sample()["action"].tolist() == [0, 1, 2]
        rb.extend(_batch(4, start=5))  # wraps the ring: positions 5, 6, 7, 0
        assert len(rb) == 6
        assert rb.sample(6)["action"].tolist() == [3, 4, 5, 6, 7, 8]
        assert len(rb) == 0
        with pytest.raises(RuntimeError, match="holds 0 items, 3 were asked for"):
            rb.sample()
        rb.extend(_batch(6, start=20))
        rb.extend(_batch(4, start=26))  # past the oldest queued: the two oldest are overwritten, counted
        assert len(rb) == 8 and rb.sample(8)["action"].tolist() == list(range(22, 30))
        assert rb.state_dict()["sampler"]["overwritten"] == 2


def test_fifo_passes_over_stale_items_and_resumes_where_it_was():
    versions = {"live": 0}
    from components.replay.filters import PolicyAgeFilter

    stale = PolicyAgeFilter(1, lambda: versions["live"], when="sample")
    with ReplayBuffer(ReplayConfig(capacity=8, sampler="fifo", batch_size=2), seed=0, filters=[stale]) as rb:
        rb.extend(_batch(3).set("policy_version", torch.tensor([0, 0, 0])))
        rb.extend(_batch(3, start=3).set("policy_version", torch.tensor([2, 2, 2])))
        versions["live"] = 2  # the first three are two versions behind: passed over
        assert rb.sample()["action"].tolist() == [3, 4]
        assert rb.state_dict()["sampler"]["skipped"] == 3 and len(rb) == 1
        state = rb.state_dict()
    with ReplayBuffer(ReplayConfig(capacity=8, sampler="fifo", batch_size=1), seed=0, filters=[stale]) as again:
        again.load_state_dict(state)
        assert len(again) == 1 and again.sample()["action"].tolist() == [5]
        again.empty()
        assert len(again) == 0
        again.extend(_batch(2, start=9).set("policy_version", torch.tensor([2, 2])))
        assert again.sample(2)["action"].tolist() == [9, 10]


def test_add_writes_one_item_and_empty_forgets():
    with ReplayBuffer(ReplayConfig(capacity=8, batch_size=1)) as rb:
        rb.add(_batch(1)[0])
        assert len(rb) == 1
        rb.empty()
        assert len(rb) == 0
        with pytest.raises(RuntimeError, match="empty replay buffer"):
            rb.sample()


def test_a_wrong_payload_fails_at_the_call_site_and_the_buffer_keeps_serving():
    with ReplayBuffer(ReplayConfig(capacity=16, batch_size=4)) as rb:
        rb.extend(_batch(8))
        bad = TensorDict({"observation": torch.zeros(2, 5), "action": torch.zeros(2, dtype=torch.long)}, [2])
        with pytest.raises(LayoutError) as info:
            rb.extend(bad)
        assert info.value.key == ("observation",)
        with pytest.raises(LayoutError, match="a missing key"):
            rb.extend(TensorDict({"observation": torch.zeros(2, 4)}, [2]))
        assert len(rb) == 8
        assert rb.sample()["observation"].shape == (4, 4)


def test_bad_settings_are_configuration_errors():
    with pytest.raises(ConfigurationError, match="replay.sampler must be one of uniform, without_replacement, prioritized, fifo, got 'lifo'"):
        ReplayBuffer(ReplayConfig(sampler="lifo"))
    with pytest.raises(ConfigurationError, match="capacity must be >= 1"):
        ReplayBuffer(ReplayConfig(capacity=0))
    with ReplayBuffer(ReplayConfig(capacity=4)) as rb:
        with pytest.raises(ConfigurationError, match="has no priorities"):
            rb.update_priority(0, 1.0)


def test_layouts_are_refused_at_construction_unless_the_transport_is_distributed():
    batch = _batch(10)
    for transport, chose in (("auto", "'queue' (auto: process owner without fixed layouts"),
                             ("queue", "'queue' (explicit)"), ("shared_memory", "'shared_memory' (explicit)")):
        with pytest.raises(IncompatibleCombinationError, match=f"to transport 'distributed', not {re.escape(chose)}"):
            ReplayBuffer(ReplayConfig(placement="process"), transport=transport, layouts={"extend": batch})
    # a subset is complete: the operations without a layout bind theirs with their first call
    distributed = ReplayBuffer(ReplayConfig(placement="process"), transport="distributed", layouts={"extend": batch})
    assert distributed.transport_kind == "distributed"


def test_memmap_storage_lives_on_disk(tmp_path):
    with ReplayBuffer(ReplayConfig(capacity=32, batch_size=4, storage="memmap", scratch_dir=str(tmp_path / "rb")),
                      seed=0) as rb:
        rb.extend(_batch(20))
        files = list((tmp_path / "rb").rglob("*.memmap"))
        assert files, "no memory-mapped files were written"
        assert sum(f.stat().st_size for f in files) >= 32 * (4 * 4 + 8)  # capacity x (4 float32 + int64)
        sample = rb.sample()
        assert torch.equal(sample["observation"][:, 0].long(), sample["action"])
    with pytest.raises(ConfigurationError, match="scratch_dir must be a directory for storage 'memmap'"):
        ReplayBuffer(ReplayConfig(storage="memmap"))
