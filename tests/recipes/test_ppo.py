"""PPO: the advantage estimate by hand, and a real run that solves CartPole-v1 through the launcher."""

import pytest
import torch
from tensordict import TensorDict

from launcher.plan import build_plan
from launcher.run import execute
from recipes.ppo import PPOConfig, estimate_advantages


class ValueFromObservation:
    """A critic whose value is the first observation feature: makes GAE checkable by hand; ``evaluated`` counts the
    observations it valued."""

    def __init__(self, reuses_values=False):
        self.reuses_values, self.evaluated = reuses_values, 0

    def value(self, obs):
        self.evaluated += obs.shape[:-1].numel()
        return obs[..., 0]


@pytest.mark.parametrize("reuses", [False, True])
def test_gae_bootstraps_on_truncation_but_not_on_termination(reuses):
    gamma, lam = 0.9, 0.5
    cfg = PPOConfig(gamma=gamma, gae_lambda=lam)
    v = [1.0, 2.0, 3.0]        # V(s_t)
    v_next = [2.0, 10.0, 4.0]  # V(s_{t+1}); at t=1 the episode terminated, at t=2 it was truncated
    r = [1.0, 1.0, 1.0]
    batch = TensorDict(
        {
            "observation": torch.tensor(v).view(3, 1, 1),
            "action": torch.zeros(3, 1, dtype=torch.long),
            "sample_log_prob": torch.zeros(3, 1),
            "next": {
                "observation": torch.tensor(v_next).view(3, 1, 1),
                "reward": torch.tensor(r).view(3, 1),
                "terminated": torch.tensor([False, True, False]).view(3, 1),
                "truncated": torch.tensor([False, False, True]).view(3, 1),
                "done": torch.tensor([False, True, True]).view(3, 1),
            },
        },
        batch_size=[3, 1],
    )
    critic = ValueFromObservation(reuses)
    out = estimate_advantages(batch, critic, cfg)
    # a learner that reuses values reads V(s_1) for t=0 from V(s_t) and values only the final observations
    assert critic.evaluated == (3 + 2 if reuses else 3 + 3)
    d2 = r[2] + gamma * v_next[2] - v[2]  # truncated: bootstrap from the final observation
    d1 = r[1] - v[1]                      # terminated: no bootstrap
    d0 = r[0] + gamma * v_next[0] - v[0]
    a2, a1 = d2, d1                       # both end an episode: nothing flows back across them
    a0 = d0 + gamma * lam * a1
    assert torch.allclose(out["advantage"].flatten(), torch.tensor([a0, a1, a2]))
    assert torch.allclose(out["value_target"].flatten(), torch.tensor([a0 + v[0], a1 + v[1], a2 + v[2]]))
    assert set(out.keys()) == {"observation", "action", "sample_log_prob", "advantage", "value_target"}


@pytest.mark.slow
def test_ppo_solves_cartpole_with_default_settings(compose_cfg, tmp_path):
    cfg = compose_cfg("+recipe=ppo", "launcher.progress=false", "seed=0")
    torch.manual_seed(0)
    result = execute(build_plan(cfg), str(tmp_path))
    assert result["solved"], result
    assert result["final_mean_return"] >= 475
    assert result["frames"] <= cfg.recipe.total_frames
