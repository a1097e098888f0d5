"""Replay of frame stacks stored frame by frame: every sampled stack is the stack that was observed, across episode
ends, wrap-around, shared-memory readers and checkpoints, in about one frame of memory per transition."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from tensordict import TensorDict

from components.envs.families.atari import AtariConfig
from components.envs import EnvMaker
from components.errors import LayoutError
from components.replay import ReplayBuffer, ReplayConfig
from components.replay import frames as frames_module
from components.replay.frames import pool_slots
from components.replay.storage import ReplayStorage
from tests.components.test_pixel_envs import roll
from transports.segments import segments_of

KEYS = ["observation", "next.observation"]
FRAME_BYTES = 84 * 84


@pytest.fixture(scope="module")
def breakout():
    """Transitions of real Breakout frames from 2 envs, episodes truncated at 200 emulator frames (50 agent steps),
    in the order the collector yields them (step by step, env by env): ``[steps * envs]`` rows."""
    atari = dataclasses.replace(AtariConfig(), max_episode_frames=200)
    arrays, carried = roll(EnvMaker(id="ALE/Breakout-v5", atari=atari), 2, 160)
    steps, envs = arrays["done"].shape
    td = TensorDict({"observation": torch.from_numpy(carried),
                     "next": {"observation": torch.from_numpy(arrays["observation"]),
                              "done": torch.from_numpy(arrays["done"])},
                     "id": torch.arange(steps * envs).reshape(steps, envs)}, [steps, envs])
    assert int(td["next", "done"].sum()) >= 4  # episode ends inside the data
    return td.reshape(-1)


def storage(capacity, **kw):
    return ReplayStorage(capacity=capacity, sampler="uniform", batch_size=32, frames=KEYS, seed=0, **kw)


def everything(store) -> TensorDict:
    """Every stored row, rebuilt by the storage's own sampling path."""
    index = torch.nonzero(store._valid[: len(store)]).squeeze(-1)
    store._draw = lambda n: (index, None)
    return store.sample(len(index))


def assert_rebuilt(sample: TensorDict, source: TensorDict):
    original = source[sample["id"]]
    assert sample["observation"].dtype == torch.uint8
    assert torch.equal(sample["observation"], original["observation"])
    assert torch.equal(sample["next", "observation"], original["next", "observation"])


def test_sampled_stacks_equal_the_observed_ones_across_episode_ends(breakout):
    store = storage(1000)
    for chunk in breakout.split(16):  # as the recipe writes: a batch of steps of every env
        store.extend(chunk)
    sample = everything(store)
    assert len(sample) == len(breakout) and bool(sample["next", "done"].any())
    assert_rebuilt(sample, breakout)
    # one new frame per transition, plus the first stack and those of episode starts
    episodes = int(breakout["next", "done"].sum()) + 2
    assert store._pool.next_serial <= len(breakout) + 4 * episodes
    assert store._pool.next_serial < 1.2 * len(breakout)


def test_memory_is_within_1_2x_of_the_frames_own_bytes(breakout):
    store = storage(len(breakout))
    store.extend(breakout)
    held = store.nbytes
    assert held <= 1.2 * len(breakout) * FRAME_BYTES
    # whole stacks of observation and next observation would take 8 frames per transition
    assert held < len(breakout) * 2 * 4 * FRAME_BYTES / 6
    # and at the 100k transitions of dqn_atari: ring slots for 1.1 frames per transition
    assert pool_slots(100_000, 4) * (FRAME_BYTES + 8) <= 1.2 * 100_000 * FRAME_BYTES


def test_wrapping_overwrites_old_transitions_and_never_their_frames(breakout):
    store = storage(64)
    for chunk in breakout.split(10):
        store.extend(chunk)
    sample = everything(store)
    assert len(sample) >= 60  # the ring keeps the frames of (almost) every live transition
    assert_rebuilt(sample, breakout)
    assert sample["id"].min() >= len(breakout) - 64


def test_colliding_hashes_store_frames_again_and_never_confuse_them(breakout, monkeypatch):
    monkeypatch.setattr(frames_module, "_hashes", lambda flat: torch.zeros(flat.shape[0]))
    store = storage(1000)
    for chunk in breakout.split(16):
        store.extend(chunk)
    assert_rebuilt(everything(store), breakout)


def test_state_dict_round_trip_keeps_the_frames(breakout):
    store = storage(200)
    store.extend(breakout[:150])
    again = storage(200)
    again.load_state_dict(store.state_dict())
    again.extend(breakout[150:])  # writes after a resume rebuild as well
    assert_rebuilt(everything(again), breakout)


def test_a_key_that_is_no_frame_stack_is_refused_at_the_first_write(breakout):
    store = ReplayStorage(capacity=10, sampler="uniform", batch_size=2, frames=["id"])
    with pytest.raises(LayoutError, match="frame stack"):
        store.extend(breakout[:2])


@pytest.mark.parametrize("transport", ["shared_memory", "queue"])
def test_a_process_buffer_rebuilds_stacks_on_either_side(breakout, transport):
    with ReplayBuffer(ReplayConfig(capacity=1000, batch_size=32, placement="process", frames=KEYS),
                      transport=transport) as buffer:
        for chunk in breakout.split(32):
            buffer.extend(chunk)
        for _ in range(3):
            sample = buffer.sample()
            assert_rebuilt(sample, breakout)
        pid = buffer._host.pid
    assert not segments_of([os.getpid(), pid])


def test_dqn_stores_pixel_stacks_frame_by_frame_and_nothing_else():
    from recipes.configs import DQNConfig
    from recipes.dqn import services

    pixels = EnvMaker(id="ALE/Breakout-v5", atari=AtariConfig()).spec()
    grid = EnvMaker(id="MinAtar/Breakout-v1").spec()
    assert services(DQNConfig(), pixels)["replay"]["frames"] == KEYS
    assert services(DQNConfig(), grid)["replay"]["frames"] == []
    assert services(DQNConfig(replay_frames=False), pixels)["replay"]["frames"] == []
