"""Env backends (``env.backend``): gymnasium's per-env vector, CartPole's array-vectorized env and EnvPool, stepped
for real; every one with same-step autoreset, so recipes see the same kind of data on each."""

from __future__ import annotations

import dataclasses
from functools import partial

import numpy as np
import pytest
import torch

from components.envs.families.atari import PREPROCESSING, AtariConfig, ale_kwargs, vector_kwargs
from components.collectors import Collector, CollectorConfig
from components.envs.backends import BACKENDS, SET_HERE, EnvPoolVector, SameStepVector

ENVPOOL_SLOW = pytest.mark.slow  # EnvPool's pools start their C++ threads: seconds per test here


def _backends(names):
    return [pytest.param(b, marks=ENVPOOL_SLOW) if b == "envpool" else b for b in names]
from components.envs import NEXT_KEYS, EnvMaker, VectorEnvStepper, next_storage
from components.errors import ConfigurationError

from tests.factories import LocalPolicy

X_LIMIT, THETA_LIMIT = 2.4, 12 * 2 * np.pi / 360  # CartPole's termination thresholds


def roll(maker: EnvMaker, num_envs: int, steps: int, seed: int, policy) -> tuple[dict, np.ndarray]:
    """``steps`` steps of ``num_envs`` envs through the collectors' stepper: the ``next`` arrays ``[time, env]`` and
    the observation carried into each step."""
    stepper = VectorEnvStepper(maker.vector(num_envs), seed)
    try:
        nxt = next_storage(stepper.spec, (steps, num_envs))
        arrays = {key: nxt.get(key).numpy() for key in NEXT_KEYS}
        carried = np.empty((steps, num_envs, 4), dtype=np.float32)
        for t in range(steps):
            carried[t] = stepper.obs
            stepper.step_into(policy(stepper.obs, t), arrays, (t, slice(None)))
    finally:
        stepper.close()
    return arrays, carried


def random_actions(obs, t):
    return np.random.default_rng(t).integers(0, 2, len(obs))


def balancing_actions(obs, t):
    """Pushes the cart toward where the pole falls: keeps it up for hundreds of steps."""
    return (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)


CARTPOLE = [b for b in BACKENDS if b != "ale_vector"]  # ale_vector makes Atari envs only (tests/components/test_pixel_envs.py)


@pytest.mark.parametrize("backend", _backends(CARTPOLE))
def test_every_backend_resets_an_ended_episode_within_its_last_step(backend):
    arrays, carried = roll(EnvMaker(id="CartPole-v1", backend=backend), 8, 400, 3, random_actions)
    done, terminated = arrays["done"], arrays["terminated"]
    assert done.sum() > 50  # random play ends many episodes
    assert (arrays["reward"] == 1).all()  # no step of a reset with its zero reward and ignored action
    final = arrays["observation"][terminated]
    assert ((np.abs(final[:, 0]) > X_LIMIT) | (np.abs(final[:, 2]) > THETA_LIMIT)).all()  # the final observation
    t, e = np.nonzero(done[:-1])
    assert (np.abs(carried[t + 1, e]) <= 0.05).all()  # ... while the next step starts from a fresh reset
    t, e = np.nonzero(~done[:-1])
    np.testing.assert_array_equal(arrays["observation"][t, e], carried[t + 1, e])  # no jump inside an episode
    lengths = arrays["episode_length"]
    assert (lengths[1:][~done[:-1]] == lengths[:-1][~done[:-1]] + 1).all()
    assert (lengths[1:][done[:-1]] == 1).all()


@pytest.mark.parametrize("backend", _backends(CARTPOLE))
def test_every_backend_truncates_at_max_episode_steps(backend):
    arrays, carried = roll(EnvMaker(id="CartPole-v1", kwargs={"max_episode_steps": 20}, backend=backend), 4, 100, 0,
                           balancing_actions)
    assert not arrays["terminated"].any()
    truncated = arrays["truncated"]
    assert (np.flatnonzero(truncated[:, 0]) == [19, 39, 59, 79, 99]).all()
    assert (arrays["episode_length"][truncated] == 20).all() and (arrays["episode_return"][truncated] == 20).all()
    t, e = np.nonzero(truncated[:-1])
    assert not np.isclose(arrays["observation"][t, e], carried[t + 1, e]).all(axis=-1).any()  # final != reset


@pytest.mark.parametrize("backend", _backends(["vector", "envpool"]))
def test_a_fast_backend_is_reproducible_from_its_seed(backend):
    maker = EnvMaker(id="CartPole-v1", backend=backend)
    first, _ = roll(maker, 4, 200, 5, random_actions)
    again, _ = roll(maker, 4, 200, 5, random_actions)
    other, _ = roll(maker, 4, 200, 6, random_actions)
    for key in NEXT_KEYS:
        np.testing.assert_array_equal(first[key], again[key])
    assert not np.array_equal(first["observation"], other["observation"])


@ENVPOOL_SLOW
def test_envpool_steps_continuous_actions_within_their_bounds():
    maker = EnvMaker(id="Pendulum-v1", backend="envpool")
    spec = maker.spec()
    assert not spec.discrete and spec.action_low == (-2.0,) and spec.action_high == (2.0,)
    stepper = VectorEnvStepper(maker.vector(2), 0)
    try:
        nxt = next_storage(stepper.spec, (210, 2))
        arrays = {key: nxt.get(key).numpy() for key in NEXT_KEYS}
        for t in range(210):
            stepper.step_into(np.full((2, 1), 50.0, dtype=np.float32), arrays, (t, slice(None)))  # clipped to 2
    finally:
        stepper.close()
    assert (np.flatnonzero(arrays["truncated"][:, 0]) == [199]).all()
    assert (arrays["reward"] <= 0).all() and (arrays["episode_length"][200] == 1).all()


@pytest.mark.parametrize("backend, cls", [("vector", SameStepVector), ("envpool", EnvPoolVector)])
def test_the_backends_are_what_they_say(backend, cls):
    env = EnvMaker(id="CartPole-v1", backend=backend).vector(2)
    env.close()
    assert isinstance(env, cls)
    assert "backend='envpool'" in repr(EnvMaker(id="CartPole-v1", backend="envpool"))


@pytest.mark.parametrize("kwargs, path, needle", [
    (dict(id="CartPole-v1", backend="fast"), "env.backend", "supported: gymnasium, vector, ale_vector, envpool"),
    (dict(id="Pendulum-v1", backend="vector"), "env.backend", "no array-vectorized implementation"),
    (dict(id="NoSuchEnv-v0", backend="envpool"), "env.id", "EnvPool does not implement 'NoSuchEnv-v0'"),
    (dict(_target_="tests.factories.crashing_envs", backend="envpool"), "env.backend", "makes envs by id"),
])
def test_a_backend_that_cannot_make_the_env_is_refused_naming_why(kwargs, path, needle):
    with pytest.raises(ConfigurationError, match=needle) as info:
        EnvMaker(**kwargs)
    assert info.value.path == path


@pytest.mark.parametrize("backend", _backends(["vector", "envpool"]))
def test_process_collectors_build_fast_backends_where_they_run(backend):
    maker = EnvMaker(id="CartPole-v1", backend=backend)
    with Collector(CollectorConfig(frames_per_batch=4 * 8 * 2, total_frames=4 * 8 * 2 * 3, num_collectors=2,
                                   placement="process"), create_env_fn=partial(maker.vector, 4), policy=LocalPolicy(),
                   seed=1) as collector:
        batches = list(collector)
    assert [b.batch_size for b in batches] == [torch.Size([8, 8])] * 3
    assert (torch.cat([b["next", "reward"] for b in batches]) == 1).all()
    first = batches[0]["observation"][0]
    assert len({tuple(row.tolist()) for row in first}) == 8  # the two workers' envs differ


# ---------------------------------------------------------------------------------------------- env.kwargs
ATARI = AtariConfig()
ENV_OF = {"gymnasium": "CartPole-v1", "vector": "CartPole-v1", "ale_vector": "ALE/Breakout-v5", "envpool": "CartPole-v1"}


def _maker(backend: str, kwargs: dict, atari: AtariConfig | None = None) -> EnvMaker:
    atari = ATARI if backend == "ale_vector" else atari
    return EnvMaker(id="ALE/Breakout-v5" if atari else ENV_OF[backend], kwargs=kwargs, backend=backend, atari=atari)


def test_the_preprocessing_table_holds_what_each_backend_is_given():
    assert set(PREPROCESSING["gymnasium"]) == set(ale_kwargs(ATARI))
    for backend in ("ale_vector", "envpool"):
        assert set(PREPROCESSING[backend]) == set(vector_kwargs("ALE/Breakout-v5", ATARI, backend)[1])
    fields = {f.name for f in dataclasses.fields(AtariConfig)}
    assert all(field is None or field in fields for keys in PREPROCESSING.values() for field in keys.values())


@pytest.mark.parametrize("backend, key, field", [(b, k, f) for b, keys in PREPROCESSING.items() for k, f in keys.items()])
def test_a_keyword_the_atari_preprocessing_sets_is_refused_naming_its_field(backend, key, field):
    # +env.kwargs.frameskip=4 on env=atari: two values for one argument (a TypeError), or on a fast backend one that
    # silently won over env.atari's
    with pytest.raises(ConfigurationError) as info:
        _maker(backend, {key: 4}, ATARI)
    assert info.value.path == f"env.kwargs.{key}"
    assert str(info.value).startswith(f"env.kwargs.{key}=4 clashes with env.atari, whose preprocessing sets {key} "
                                      f"itself on env.backend={backend}: ")
    assert (f"set env.atari.{field} instead" if field else "drop it (it is fixed") in str(info.value)


@pytest.mark.parametrize("backend, key", [(b, k) for b, keys in SET_HERE.items() for k in keys])
def test_a_keyword_the_collector_sets_is_refused(backend, key):
    with pytest.raises(ConfigurationError) as info:
        _maker(backend, {key: 2})
    assert info.value.path == f"env.kwargs.{key}"
    assert str(info.value).startswith(f"env.kwargs.{key}=2 clashes with the collector, which sets {key} itself on "
                                      f"env.backend={backend} (from {SET_HERE[backend][key]}): drop it")


@pytest.mark.parametrize("backend, atari, what, takes", [
    ("gymnasium", None, "CartPole-v1", "sutton_barto_reward"),
    ("gymnasium", ATARI, "ALE/Breakout-v5", "full_action_space"),
    ("vector", None, "CartPole-v1's vector env (env.backend=vector)", "sutton_barto_reward"),
    ("ale_vector", ATARI, "ale-py's AtariVectorEnv (env.backend=ale_vector)", "num_threads"),
    ("envpool", ATARI, "EnvPool's Breakout-v5 (env.backend=envpool)", "num_threads"),
    ("envpool", None, "EnvPool's CartPole-v1 (env.backend=envpool)", "num_threads"),
])
def test_a_keyword_the_env_does_not_take_is_refused_listing_those_it_does(backend, atari, what, takes):
    with pytest.raises(ConfigurationError) as info:
        _maker(backend, {"colour": 1}, atari)
    assert info.value.path == "env.kwargs.colour"
    assert str(info.value).startswith(f"{what} takes no keyword argument 'colour' (env.kwargs sets it)")
    assert takes in info.value.alternatives  # and nothing that clashes
    preprocessing = PREPROCESSING[backend] if atari is not None or backend == "ale_vector" else {}
    assert not set(info.value.alternatives) & {*preprocessing, *SET_HERE[backend]}
    _maker(backend, {takes: 1}, atari)  # one it takes is taken


def test_a_value_the_env_refuses_names_its_keyword():
    for kwargs, path, needle in [({"mode": 99}, "env.kwargs.mode", "env.kwargs.mode=99: RuntimeError: Invalid game mode"),
                                 ({"obs_type": "bogus"}, "env.kwargs.obs_type", "Invalid observation type: bogus")]:
        with pytest.raises(ConfigurationError) as info:
            EnvMaker(id="ALE/Breakout-v5", kwargs=kwargs, atari=ATARI).spec()
        assert info.value.path == path and needle in str(info.value), str(info.value)
        assert str(info.value).startswith("ALE/Breakout-v5 cannot be made with ")
    spec = EnvMaker(id="ALE/Breakout-v5", kwargs={"full_action_space": True}, atari=ATARI).spec()
    assert spec.n_actions == 18 and spec.observation_shape == (4, 84, 84)  # a keyword it takes reaches the env
