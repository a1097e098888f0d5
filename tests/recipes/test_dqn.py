"""DQN: n-step targets by hand, and a real run that solves CartPole-v1 through the launcher."""

import pytest
import torch
from tensordict import TensorDict

from launcher.plan import build_plan
from launcher.run import execute
from recipes.dqn import DQNConfig, n_step_transitions


def _seq(rewards, terminated, truncated):
    t = len(rewards)
    done = [a or b for a, b in zip(terminated, truncated)]
    return TensorDict(
        {
            "observation": torch.arange(t, dtype=torch.float32).view(t, 1, 1),
            "action": torch.zeros(t, 1, dtype=torch.long),
            "next": {
                "observation": torch.arange(1, t + 1, dtype=torch.float32).view(t, 1, 1),
                "reward": torch.tensor(rewards).view(t, 1),
                "terminated": torch.tensor(terminated).view(t, 1),
                "done": torch.tensor(done).view(t, 1),
            },
        },
        batch_size=[t, 1],
    )


def test_n_step_sums_rewards_and_stops_at_episode_ends():
    cfg = DQNConfig(n_step=3, gamma=0.5)
    seq = _seq([1.0, 2.0, 4.0, 8.0, 16.0], [False, True, False, False, False], [False, False, False, False, False])
    out = n_step_transitions(seq, cfg)
    assert out.shape == torch.Size([3, 1])  # the last n_step - 1 steps start no full window yet
    # t=0: the episode terminates at t=1: 1 + 0.5 * 2, no bootstrap beyond it
    assert out["next", "reward"][0].item() == 1 + 0.5 * 2
    assert out["next", "terminated"][0].item() and out["next", "observation"][0].item() == 2.0
    assert out["next", "discount"][0].item() == 0.5**2
    # t=2: a full window 4 + 0.5 * 8 + 0.25 * 16, bootstrapping from s_5 with gamma^3
    assert out["next", "reward"][2].item() == 4 + 0.5 * 8 + 0.25 * 16
    assert not out["next", "terminated"][2].item() and out["next", "observation"][2].item() == 5.0
    assert out["next", "discount"][2].item() == 0.5**3


def test_truncation_ends_the_window_but_keeps_the_bootstrap():
    cfg = DQNConfig(n_step=2, gamma=0.9)
    out = n_step_transitions(_seq([1.0, 1.0, 1.0], [False, False, False], [True, False, False]), cfg)
    assert out["next", "reward"][0].item() == 1.0  # the window stops at the truncated step
    assert not out["next", "terminated"][0].item() and out["next", "discount"][0].item() == pytest.approx(0.9)


@pytest.mark.slow
def test_dqn_solves_cartpole_with_default_settings(compose_cfg, tmp_path):
    cfg = compose_cfg("+recipe=dqn", "launcher.progress=false", "seed=0")
    result = execute(build_plan(cfg), str(tmp_path))
    assert result["solved"] and result["final_mean_return"] >= 475, result
