"""The evaluator service: real CartPole episodes of the newest pushed weights, logged through a real logger, in each
of its placements; and the episodes themselves (deterministic mode, unclipped returns, whole games, the step limit)."""

import csv
import os

import numpy as np
import pytest
import torch

from components.envs import EnvMaker
from components.errors import ConfigurationError
from components.evaluator import Evaluator, EvaluatorConfig, play
from components.evaluator.episodes import evaluation_env_node
from components.logger import CSVLogger, Logger, LoggerConfig
from components.weight_sync import WeightSync, WeightSyncConfig
from recipes.actor_critic import make_policy
from recipes.configs import PPOConfig
from tests.helpers import decoded_video

SPEC = EnvMaker(id="CartPole-v1").spec()


def factory():
    return make_policy(PPOConfig(), SPEC)


def pushed_right():
    """A policy whose most likely action is always 1 (push right): CartPole falls within a few dozen steps."""
    torch.manual_seed(0)
    policy = factory()
    with torch.no_grad():
        last = policy.actor.net[-1]
        last.weight.zero_()
        last.bias.copy_(torch.tensor([0.0, 5.0]))
    return policy


def _metrics(log_dir: str) -> list[dict]:
    with open(os.path.join(log_dir, "metrics.csv")) as f:
        return list(csv.DictReader(f))


def _services(tmp_path, placement):
    """A weight sync and a logger the evaluator in ``placement`` can reach."""
    near = {"direct": "thread", "thread": "thread", "process": "process", "ray": "ray"}[placement]
    sync = WeightSync(WeightSyncConfig(placement=near), template=factory()).start()
    logger = Logger(LoggerConfig(placement=near), backend=CSVLogger(str(tmp_path / "logs"))).start()
    return sync, logger


@pytest.mark.parametrize("placement", ["direct", "thread", pytest.param("process", marks=pytest.mark.slow),
                                       pytest.param("ray", marks=pytest.mark.slow)])
def test_the_evaluator_plays_the_newest_weights_when_frames_pass_eval_every_and_logs_them(tmp_path, placement,
                                                                                         request):
    if placement == "ray":
        request.getfixturevalue("ray_cluster")  # the session's local cluster, started once
    sync, logger = _services(tmp_path, placement)
    try:
        config = EvaluatorConfig(placement=placement, eval_every=1000, episodes=3, seed=7)
        with Evaluator(config, env={"id": "CartPole-v1"}, policy_factory=factory, weight_sync=sync.client(),
                       logger=logger.client()) as evaluator:
            client = evaluator.client()
            version = sync.client().push(pushed_right())
            assert client.notify(999) is False  # not yet
            assert client.notify(1000) is True
            assert client.wait_idle(60)
            assert client.notify(1500) is False  # the next is at 2000
            results = client.results()
        assert len(results) == 1
        first = results[0]
        assert first["frames"] == 1000 and first["policy_version"] == version
        assert len(first["returns"]) == 3 and first["returns"] == [float(n) for n in first["lengths"]]
        assert max(first["lengths"]) < 100  # always pushing right: the pole falls (the deterministic action)
        logger.client().flush()
        rows = [r for r in _metrics(str(tmp_path / "logs")) if r["tag"] == "eval/mean_return"]
        assert [(int(r["step"]), float(r["value"])) for r in rows] == [(1000, pytest.approx(first["mean_return"]))]
        versions = [r for r in _metrics(str(tmp_path / "logs")) if r["tag"] == "eval/policy_version"]
        assert [float(r["value"]) for r in versions] == [version]
    finally:
        logger.shutdown()
        sync.shutdown()


def test_video_of_the_first_episode_is_logged_and_decodes_with_one_frame_per_step_and_the_reset(tmp_path):
    pytest.importorskip("pygame")  # CartPole renders through it (the video extra)
    sync, logger = _services(tmp_path, "thread")
    try:
        config = EvaluatorConfig(placement="thread", eval_every=100, episodes=2, video=True, video_fps=25)
        with Evaluator(config, env={"id": "CartPole-v1"}, policy_factory=factory, weight_sync=sync.client(),
                       logger=logger.client()) as evaluator:
            sync.client().push(pushed_right())
            result = evaluator.client().evaluate(100)
        frames, (width, height) = decoded_video(result["video"])
        assert result["video"].endswith("eval_video_100.mp4")
        assert frames == result["lengths"][0] + 1 and (width, height) == (600, 400)
    finally:
        logger.shutdown()
        sync.shutdown()


def test_a_failed_evaluation_is_raised_at_the_next_call(tmp_path):
    sync, logger = _services(tmp_path, "thread")
    try:
        def broken():
            raise RuntimeError("no such policy")

        config = EvaluatorConfig(placement="thread", eval_every=10, episodes=1)
        with pytest.raises(Exception, match="no such policy"):  # built where it lives: the start fails, saying why
            Evaluator(config, env={"id": "CartPole-v1"}, policy_factory=broken, weight_sync=sync.client(),
                      logger=logger.client()).start()
    finally:
        logger.shutdown()
        sync.shutdown()


def test_deterministic_episodes_repeat_and_random_ones_differ():
    policy = factory()
    maker = EnvMaker(id="CartPole-v1")
    a = play(maker, policy, 3, seed=1)
    b = play(maker, policy, 3, seed=1)
    assert a.returns == b.returns and a.lengths == b.lengths
    sampled = [play(maker, policy, 3, seed=1, mode="random").lengths for _ in range(3)]
    assert any(s != a.lengths for s in sampled)


def test_the_step_limit_ends_an_episode_and_says_so():
    result = play(EnvMaker(id="CartPole-v1"), pushed_right(), 2, seed=0, max_episode_steps=3)
    assert result.lengths == [3, 3] and result.truncated_by_limit == 2


def test_evaluation_plays_whole_games_on_the_gymnasium_backend():
    node = evaluation_env_node({"id": "ALE/Breakout-v5", "backend": "envpool", "atari": {"terminal_on_life_loss": True,
                                                                                          "frame_stack": 4}},
                               render=True)
    assert node["atari"] == {"terminal_on_life_loss": False, "frame_stack": 4}
    assert node["backend"] == "gymnasium" and node["kwargs"] == {"render_mode": "rgb_array"}


def test_an_atari_episode_is_recorded_from_rgb_array_frames():
    pytest.importorskip("ale_py")
    maker = EnvMaker.from_config(evaluation_env_node({"id": "ALE/Pong-v5", "atari": {}}, render=True))
    spec = maker.spec()
    policy = make_policy(PPOConfig(), spec)
    result = play(maker, policy, 1, seed=0, video=True, max_episode_steps=20)
    assert result.lengths == [20]
    assert result.video.shape[0] == 21 and result.video.shape[-1] == 3 and result.video.dtype == np.uint8


def test_the_evaluator_takes_only_the_placements_of_the_table():
    with pytest.raises(ConfigurationError, match="evaluator"):
        Evaluator(EvaluatorConfig(placement="distributed", eval_every=10), env={"id": "CartPole-v1"},
                  policy_factory=factory)


def test_options_are_checked():
    with pytest.raises(ConfigurationError, match="components.evaluator.episodes must be >= 1"):
        EvaluatorConfig(episodes=0)
    with pytest.raises(ConfigurationError, match="components.evaluator.mode must be one of deterministic, random"):
        EvaluatorConfig(mode="greedy")




@pytest.mark.slow  # Mesa's EGL starts a helper process
def test_a_mujoco_episode_renders_off_screen():
    pytest.importorskip("mujoco")
    maker = EnvMaker.from_config(evaluation_env_node({"id": "HalfCheetah-v5"}, render=True))
    policy = make_policy(PPOConfig(), maker.spec())
    try:
        result = play(maker, policy, 1, seed=0, video=True, max_episode_steps=5)
    except Exception as exc:  # noqa: BLE001 - only a missing EGL library may skip, saying so
        if "EGL" not in str(exc) and "egl" not in str(exc):
            raise
        pytest.skip(f"no off-screen EGL here ({exc}); .ci/run installs Mesa's")
    assert result.video.shape[0] == 6 and result.video.shape[-1] == 3 and result.video.max() > 0
