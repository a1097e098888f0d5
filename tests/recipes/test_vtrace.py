"""V-trace (``recipes/vtrace.py``) against its definition, written out here as plain loops: the sum of the paper's
equation (1), not the recursion the module computes, over episode ends inside an unroll and both clips; on-policy
data reduces to n-step returns."""

from __future__ import annotations

import pytest
import torch

from recipes.vtrace import vtrace


def reference(mu_log, pi_log, rewards, values, bootstrap, discounts, rho_bar, c_bar, pg_rho_bar, lambda_):
    """Equation (1) of Espeholt et al. (2018), element by element:
    ``v_s = V(x_s) + sum_{t>=s} (prod_{s<=i<t} gamma_i c_i) rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))``."""
    T, B = rewards.shape
    ratio = [[float(torch.exp(pi_log[t, b] - mu_log[t, b])) for b in range(B)] for t in range(T)]
    value = [[float(values[t, b]) if t < T else float(bootstrap[b]) for b in range(B)] for t in range(T + 1)]
    vs = [[0.0] * B for _ in range(T)]
    for b in range(B):
        for s in range(T):
            total, trace = value[s][b], 1.0
            for t in range(s, T):
                rho = min(rho_bar, ratio[t][b])
                delta = rho * (float(rewards[t, b]) + float(discounts[t, b]) * value[t + 1][b] - value[t][b])
                total += trace * delta
                trace *= float(discounts[t, b]) * lambda_ * min(c_bar, ratio[t][b])
            vs[s][b] = total
    adv = [[0.0] * B for _ in range(T)]
    for b in range(B):
        for t in range(T):
            v_next = vs[t + 1][b] if t + 1 < T else float(bootstrap[b])
            adv[t][b] = min(pg_rho_bar, ratio[t][b]) * (float(rewards[t, b]) + float(discounts[t, b]) * v_next
                                                         - value[t][b])
    return torch.tensor(vs, dtype=torch.float64), torch.tensor(adv, dtype=torch.float64)


def unrolls(T=9, B=4, seed=0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    mu_log = -torch.rand(T, B, generator=g, dtype=torch.float64) * 2
    pi_log = mu_log + spread * torch.randn(T, B, generator=g, dtype=torch.float64)  # ratios both sides of the clips
    rewards = torch.randn(T, B, generator=g, dtype=torch.float64)
    values = torch.randn(T, B, generator=g, dtype=torch.float64)
    bootstrap = torch.randn(B, generator=g, dtype=torch.float64)
    discounts = torch.full((T, B), 0.97, dtype=torch.float64)
    discounts[2, 0] = discounts[5, 1] = discounts[T - 1, 2] = discounts[0, 3] = 0.0  # episodes that end inside
    return mu_log, pi_log, rewards, values, bootstrap, discounts


@pytest.mark.parametrize("rho_bar, c_bar, pg_rho_bar, lambda_", [(1.0, 1.0, 1.0, 1.0), (2.0, 0.5, 1.5, 1.0),
                                                                 (1.0, 1.0, 1.0, 0.9), (10.0, 10.0, 10.0, 1.0)])
@pytest.mark.parametrize("seed", [0, 1])
def test_v_trace_matches_its_definition(rho_bar, c_bar, pg_rho_bar, lambda_, seed):
    data = unrolls(seed=seed)
    got = vtrace(*data, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, lambda_=lambda_)
    vs, adv = reference(*data, rho_bar, c_bar, pg_rho_bar, lambda_)
    torch.testing.assert_close(got.vs, vs)
    torch.testing.assert_close(got.advantages, adv)
    torch.testing.assert_close(got.rhos, torch.exp(data[1] - data[0]))
    pg_rhos = got.rhos.clamp(max=pg_rho_bar)  # the unweighted advantages APPO's surrogate weights itself
    torch.testing.assert_close((got.q_values - data[3]) * pg_rhos, adv)
    assert (got.rhos > min(rho_bar, 2.0)).any() and (got.rhos < c_bar).any()  # the data reaches past the clips


def test_on_policy_data_gives_n_step_returns():
    mu_log, _, rewards, values, bootstrap, discounts = unrolls(seed=3)
    got = vtrace(mu_log, mu_log.clone(), rewards, values, bootstrap, discounts)
    returns, running = torch.empty_like(rewards), bootstrap.clone()
    for t in range(rewards.shape[0] - 1, -1, -1):  # to the unroll's end, or its episode's
        running = rewards[t] + discounts[t] * running
        returns[t] = running
    torch.testing.assert_close(got.vs, returns)
    torch.testing.assert_close(got.advantages, returns - values)
    assert torch.equal(got.rhos, torch.ones_like(rewards))


def test_ratios_beyond_the_clips_count_as_the_clips():
    mu_log, _, rewards, values, bootstrap, discounts = unrolls(seed=4)
    far = vtrace(mu_log, mu_log + 3.0, rewards, values, bootstrap, discounts)  # every ratio e^3 > 1
    on = vtrace(mu_log, mu_log.clone(), rewards, values, bootstrap, discounts)
    torch.testing.assert_close(far.vs, on.vs)
    torch.testing.assert_close(far.advantages, on.advantages)


def test_nothing_of_the_next_episode_flows_back_over_its_end():
    data = list(unrolls(seed=5))
    before = vtrace(*data)
    rewards = data[2].clone()
    rewards[3:, 0] += 100.0  # column 0's episode ended at step 2
    data[2] = rewards
    after = vtrace(*data)
    torch.testing.assert_close(after.vs[:3, 0], before.vs[:3, 0])
    assert not torch.allclose(after.vs[3:, 0], before.vs[3:, 0])


def test_shapes_and_clips_are_checked():
    mu_log, pi_log, rewards, values, bootstrap, discounts = unrolls()
    with pytest.raises(ValueError, match="rewards has shape"):
        vtrace(mu_log, pi_log, rewards[:-1], values, bootstrap, discounts)
    with pytest.raises(ValueError, match="bootstrap_value has shape"):
        vtrace(mu_log, pi_log, rewards, values, bootstrap[:-1], discounts)
    with pytest.raises(ValueError, match="must be > 0"):
        vtrace(mu_log, pi_log, rewards, values, bootstrap, discounts, c_bar=0.0)


def test_an_episode_cut_short_bootstraps_from_its_own_last_value_and_its_trace_stops_there():
    mu_log, pi_log, rewards, values, bootstrap, discounts = unrolls(seed=6)
    discounts = torch.full_like(discounts, 0.97)  # no termination: column 1 is cut short (a time limit) at step 4
    last_value = torch.tensor(2.5, dtype=torch.float64)  # the value of that episode's last observation
    next_values = torch.cat([values[1:], bootstrap.unsqueeze(0)])
    next_values[4, 1] = last_value
    continues = torch.ones_like(discounts, dtype=torch.bool)
    continues[4, 1] = False
    got = vtrace(mu_log, pi_log, rewards, values, bootstrap, discounts, next_values=next_values, continues=continues)
    # its first five steps are an unroll of their own, bootstrapped from that last value
    alone = vtrace(mu_log[:5, 1:2], pi_log[:5, 1:2], rewards[:5, 1:2], values[:5, 1:2], last_value.reshape(1),
                   discounts[:5, 1:2])
    torch.testing.assert_close(got.vs[:5, 1:2], alone.vs)
    torch.testing.assert_close(got.advantages[:5, 1:2], alone.advantages)
    # the steps after it, and the other columns, are what they are without the cut
    after = vtrace(mu_log[5:, 1:2], pi_log[5:, 1:2], rewards[5:, 1:2], values[5:, 1:2], bootstrap[1:2],
                   discounts[5:, 1:2])
    torch.testing.assert_close(got.vs[5:, 1:2], after.vs)
    plain = vtrace(mu_log, pi_log, rewards, values, bootstrap, discounts)
    torch.testing.assert_close(got.vs[:, [0, 2, 3]], plain.vs[:, [0, 2, 3]])
