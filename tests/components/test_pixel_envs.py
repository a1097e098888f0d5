"""Pixels and physics: Atari with the DeepMind preprocessing on each of its backends, MinAtar's grids and MuJoCo,
stepped for real (ale-py ships its ROMs; nothing is downloaded)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from components.envs.families.atari import AtariConfig, envpool_id, game_of
from components.envs import NEXT_KEYS, EnvMaker, VectorEnvStepper, next_storage
from components.errors import ConfigurationError
from tests.helpers import ROOT

ATARI = AtariConfig()


def roll(maker: EnvMaker, num_envs: int, steps: int, seed: int = 0) -> tuple[dict, np.ndarray]:
    """``steps`` random steps through the collectors' stepper: the ``next`` arrays and the carried observations."""
    stepper = VectorEnvStepper(maker.vector(num_envs), seed)
    rng = np.random.default_rng(seed)
    try:
        nxt = next_storage(stepper.spec, (steps, num_envs))
        arrays = {key: nxt.get(key).numpy() for key in NEXT_KEYS}
        carried = np.empty((steps, *stepper.obs.shape), dtype=stepper.obs.dtype)
        for t in range(steps):
            carried[t] = stepper.obs
            actions = rng.integers(0, stepper.spec.n_actions, num_envs) if stepper.spec.discrete else \
                rng.uniform(-1, 1, (num_envs, *stepper.spec.action_shape)).astype(np.float32)
            stepper.step_into(actions, arrays, (t, slice(None)))
    finally:
        stepper.close()
    return arrays, carried


def test_atari_ids_name_their_rom_and_envpool_task():
    assert game_of("ALE/Breakout-v5") == "breakout" and game_of("ALE/MsPacman-v5") == "ms_pacman"
    assert game_of("PongNoFrameskip-v4") == "pong" and envpool_id("ALE/SpaceInvaders-v5") == "SpaceInvaders-v5"
    with pytest.raises(ConfigurationError, match="not an Atari id") as info:
        game_of("CartPole-v1/extra")
    assert info.value.path == "env.id"


@pytest.mark.parametrize("backend", ["gymnasium", "ale_vector", pytest.param("envpool", marks=pytest.mark.slow)])
def test_atari_frames_are_uint8_stacks_on_every_backend(backend):
    maker = EnvMaker(id="ALE/Breakout-v5", atari=ATARI, backend=backend)
    spec = maker.spec()
    assert spec.observation_shape == (4, 84, 84) and spec.observation_dtype == torch.uint8
    assert spec.discrete and spec.n_actions == 4 and spec.observation_scale == pytest.approx(1 / 255)
    assert spec.request_layout(2).zeros()["observation"].dtype == torch.uint8
    arrays, carried = roll(maker, 2, 60)
    assert carried.dtype == np.uint8 and arrays["observation"].dtype == np.uint8
    assert carried[-1].max() > 0  # real frames, not zeros
    # a stack shifts by one frame per step (oldest first): the newest three of a step are the oldest three of the next
    t, e = np.nonzero(~arrays["done"][:-1])
    np.testing.assert_array_equal(arrays["observation"][t, e, 1:], arrays["observation"][t + 1, e, :3])
    np.testing.assert_array_equal(arrays["observation"][t, e], carried[t + 1, e])
    assert set(np.unique(arrays["reward"])) <= {0.0, 1.0, 4.0, 7.0}  # Breakout's own scores: nothing clipped


def test_atari_episodes_end_with_their_final_frames_and_restart_from_a_reset():
    maker = EnvMaker(id="ALE/Breakout-v5", atari=AtariConfig(max_episode_frames=400, noop_max=0),
                     backend="ale_vector")
    arrays, carried = roll(maker, 2, 120, seed=3)
    truncated = arrays["truncated"]
    assert truncated.any() and (arrays["episode_length"][truncated] == 100).all()  # 400 frames at frame skip 4
    t, e = np.nonzero(arrays["done"][:-1])
    assert not (arrays["observation"][t, e] == carried[t + 1, e]).all()  # the final stack is not the reset one


def test_minatar_grids_travel_as_bytes():
    maker = EnvMaker(id="MinAtar/Breakout-v1")
    spec = maker.spec()
    assert spec.observation_shape == (10, 10, 4) and spec.observation_dtype == torch.uint8
    assert spec.n_actions == 3 and spec.observation_scale == 1.0
    arrays, carried = roll(maker, 4, 300)
    assert set(np.unique(carried)) == {0, 1} and arrays["done"].any()
    assert set(np.unique(arrays["reward"])) <= {0.0, 1.0}


MUJOCO = pytest.mark.slow  # importing gymnasium's MuJoCo envs imports glfw, which runs a Python child to read a version


@MUJOCO
def test_mujoco_half_cheetah_steps_continuous_actions():
    maker = EnvMaker(id="HalfCheetah-v5", kwargs={"max_episode_steps": 50})
    spec = maker.spec()
    assert spec.observation_shape == (17,) and spec.observation_dtype == torch.float32
    assert not spec.discrete and spec.action_shape == (6,) and spec.action_low == (-1.0,) * 6
    arrays, _ = roll(maker, 2, 60)
    assert (np.flatnonzero(arrays["truncated"][:, 0]) == [49]).all() and np.isfinite(arrays["observation"]).all()


@pytest.mark.parametrize("kwargs, path, needle", [
    (dict(id="ALE/Breakout-v5", atari=ATARI, backend="vector"), "env.backend", "no preprocessing on env.backend=vector"),
    (dict(id="ALE/Breakout-v5", backend="ale_vector"), "env.backend", "use env=atari"),
    (dict(id="ALE/NoSuchGame-v5", atari=ATARI, backend="ale_vector"), "env.id", "no ROM 'no_such_game'"),
    (dict(_target_="tests.factories.crashing_envs", atari=ATARI), "env.atari", "not an env._target_"),
    (dict(id="MinAtar/NoSuchGame-v1"), "env.id", "cannot make gymnasium env"),
    (dict(id="CartPole-v1", atari=ATARI), "env.id", "env.atari preprocesses an ALE env, and env.id='CartPole-v1' is "
     "not one"),  # not "CartPole-v1 takes no keyword argument 'frameskip'", a keyword nobody set
    (dict(id="MinAtar/Breakout-v1", atari=ATARI), "env.id", "env.id='MinAtar/Breakout-v1' is not one"),
])
def test_pixel_env_mistakes_are_refused_naming_the_key(kwargs, path, needle):
    with pytest.raises(ConfigurationError, match=needle) as info:
        EnvMaker(**kwargs).spec()
    assert info.value.path == path


@MUJOCO
def test_mujoco_warnings_go_to_the_log_not_to_a_file_in_the_working_directory(tmp_path):
    # a fresh interpreter: MuJoCo warns of a deprecated model attribute once per process
    code = ("import logging; logging.basicConfig(format='%(name)s %(message)s'); from components.envs import EnvMaker; "
            "EnvMaker(id='HalfCheetah-v5').spec()")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    assert not (tmp_path / "MUJOCO_LOG.TXT").exists()
    assert "components.envs MuJoCo: compiler attribute 'settotalmass' is deprecated" in out.stderr


def test_an_env_whose_package_is_missing_names_the_extra_to_install(monkeypatch):
    import importlib

    real_import = importlib.import_module

    def without_minatar(name, *args):
        if name.startswith("minatar"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", without_minatar)  # the lookup components.envs makes
    with pytest.raises(ConfigurationError, match=r"needs minatar: pip install '\.\[minatar\]'") as info:
        EnvMaker(id="MinAtar/Breakout-v1").spec()
    assert info.value.path == "env.id"
