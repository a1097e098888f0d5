"""Proximal Policy Optimization (clipped objective, GAE), written against service clients only.

Reads top to bottom: the config (``PPOConfig``, plain data in ``recipes/configs.py``; the actor and critic are
:mod:`recipes.actor_critic`'s), advantage estimation, the loss, then ``run``: collect a batch through the collector
(which calls the inference client), estimate advantages, write the batch to the replay buffer, optimise on the
minibatches of each epoch the buffer samples without replacement, push the new weights to the inference server.
Nothing here knows where those services live.
"""

from __future__ import annotations

import torch
from torch import nn

from .actor_critic import Learner, make_policy
from .base import Clients, Loop, Recipe
from .configs import PPOConfig  # torch-free, so composing a config never imports torch
from .networks import RunningNorm


# ============================================================================ advantages


class ReturnScale:
    """Rewards divided by the running standard deviation of each env's discounted return (the learner's own
    statistics: it sees every batch, env columns in the same order each time).

    Args:
        gamma: the discount of the return whose spread scales the rewards.
        eps: added to the variance before its square root.
    """

    def __init__(self, gamma: float, eps: float = 1e-8):
        self.gamma, self.eps = gamma, eps
        self.returns: torch.Tensor | None = None
        self.stats = RunningNorm(())

    def __call__(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """Scaled ``[time, env]`` rewards; the statistics include this batch."""
        if self.returns is None or self.returns.shape != reward.shape[1:]:
            self.returns = torch.zeros(reward.shape[1:], dtype=torch.float64)
        seen = torch.empty_like(reward, dtype=torch.float64)
        for t in range(reward.shape[0]):
            self.returns = self.returns * self.gamma + reward[t]
            seen[t] = self.returns
            self.returns = self.returns * (~done[t])
        self.stats.update(seen)
        return reward / (self.stats.var + self.eps).sqrt()

    def state_dict(self) -> dict:
        """The running returns and their statistics."""
        return {"returns": self.returns, "stats": self.stats.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`'s values."""
        self.returns = state["returns"]
        self.stats.load_state_dict(state["stats"])


@torch.no_grad()
def estimate_advantages(batch, learner: Learner, cfg: PPOConfig, scale: ReturnScale | None = None):
    """GAE over a ``[time, env]`` batch; bootstraps from the final observation on truncation, not on termination;
    ``scale`` (``normalize_rewards``) divides the rewards by the running spread of the discounted return.

    Args:
        batch: a collected ``[time, env]`` batch.
        learner: values the observations.
        cfg: the recipe's config.
        scale: the reward scale, or ``None``.

    Returns:
        The batch's rows for learning: observation, action, log-probability, advantage, value target (and value).
    """
    obs, nxt = batch["observation"], batch["next"]
    values = learner.value(obs)
    if not learner.reuses_values:
        next_values = learner.value(nxt["observation"])
    else:  # a next observation is the next step's observation, except at the last step of the batch and where an
        # episode ended (the final observation): only those are valued
        next_values = torch.empty_like(values)
        next_values[:-1] = values[1:]
        fresh = nxt["done"].clone()
        fresh[-1] = True
        next_values[fresh] = learner.value(nxt["observation"][fresh])
    reward = (nxt["reward"].sign() if cfg.clip_rewards else nxt["reward"]) * cfg.reward_scale
    if scale is not None:
        reward = scale(reward, nxt["done"])
    not_terminated = (~nxt["terminated"]).float()
    not_done = (~nxt["done"]).float()
    deltas = reward + cfg.gamma * next_values * not_terminated - values
    advantages = torch.zeros_like(deltas)
    running = torch.zeros_like(deltas[0])
    for t in reversed(range(deltas.shape[0])):
        running = deltas[t] + cfg.gamma * cfg.gae_lambda * not_done[t] * running
        advantages[t] = running
    out = batch.select("observation", "action", "sample_log_prob")
    out.set("advantage", advantages)
    out.set("value_target", advantages + values)
    if cfg.clip_vloss:
        out.set("value", values)
    return out


def ppo_loss(mb, learner: Learner, cfg: PPOConfig) -> tuple[torch.Tensor, dict]:
    """Clipped surrogate + value loss - entropy bonus on one minibatch.

    Args:
        mb: rows of :func:`estimate_advantages`.
        learner: the actor and critic being trained.
        cfg: the recipe's config.

    Returns:
        The loss and its parts as metrics.
    """
    actor = learner.policy.actor
    dist, value = learner.dist_and_value(mb["observation"])
    log_prob = actor.log_prob(dist, mb["action"])
    ratio = (log_prob - mb["sample_log_prob"]).exp()
    adv = mb["advantage"]
    if cfg.norm_adv:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
    v_loss = (value - mb["value_target"]).pow(2)
    if cfg.clip_vloss:
        clipped = mb["value"] + (value - mb["value"]).clamp(-cfg.clip_coef, cfg.clip_coef)
        v_loss = torch.max(v_loss, (clipped - mb["value_target"]).pow(2))
    v_loss = 0.5 * v_loss.mean()
    entropy = actor.entropy(dist).mean()
    loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy
    return loss, {"loss/policy": pg_loss.item(), "loss/value": v_loss.item(), "loss/entropy": entropy.item()}


# ============================================================================ training loop


def run(cfg: PPOConfig, clients: Clients) -> dict:
    """Train until ``target_return`` or ``total_frames``; return the result and learning curve.

    Args:
        cfg: the recipe's config.
        clients: the running services' clients.

    Returns:
        :meth:`~recipes.base.EpisodeStats.result`: frames, wall seconds, frames/s, episodes, mean return, solved,
        the learning curve.
    """
    loop = Loop(cfg, clients)  # seeds torch: the networks are built from its generator
    device = torch.device(cfg.device)
    learner = Learner(cfg, clients.env_spec).to(device)
    optimizer = learner.optimizer(cfg.lr)
    scale = ReturnScale(cfg.gamma) if cfg.normalize_rewards else None
    loop.start(learner.policy, learner=learner, optimizer=optimizer, reward_scale=scale)

    for batch in loop.batches():
        # ---- learn
        if cfg.anneal_lr:
            optimizer.param_groups[0]["lr"] = cfg.lr * max(0.0, 1.0 - loop.stats.frames / cfg.total_frames)
        # on the learner's device, once (.to is a no-op on the CPU); the replay buffer holds the rows on the host
        batch = batch.to(device)
        clients.replay.extend(estimate_advantages(batch, learner, cfg, scale).reshape(-1).to("cpu"))
        losses = {}
        for minibatch in clients.replay.minibatches(cfg.update_epochs * cfg.num_minibatches, cfg.minibatch_size):
            loss, losses = ppo_loss(minibatch.to(device), learner, cfg)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(learner.parameters(), cfg.max_grad_norm)
            optimizer.step()
        learner.fold_in(batch["observation"])  # after learning from the batch with the statistics it was acted with
        version = loop.push(learner.policy)

        # ---- report
        if loop.end_batch({**losses, "train/mean_return": loop.stats.mean_return, "train/fps": loop.stats.fps,
                           "train/policy_version": version}):
            break
    return loop.result()


def services(cfg: PPOConfig, spec) -> dict:
    """PPO's needs: a collector batch of ``num_envs * num_steps`` frames, and a replay buffer holding exactly
    one batch, sampled without replacement
    (:meth:`~components.replay.operations.ReplayOperations.minibatches`).

    Args:
        cfg: the recipe's config.
        spec: the environment's spaces.

    Returns:
        Each service's options, by component.
    """
    if cfg.frames_per_batch % cfg.num_minibatches:
        raise ValueError(
            f"num_envs * num_steps = {cfg.frames_per_batch} must be divisible by num_minibatches={cfg.num_minibatches}"
        )
    return {
        "collector": {"num_envs": cfg.num_envs, "frames_per_batch": cfg.frames_per_batch, "total_frames": cfg.total_frames},
        "replay": {"capacity": cfg.frames_per_batch, "sampler": "without_replacement", "batch_size": cfg.minibatch_size},
    }


RECIPE = Recipe(name="ppo", config=PPOConfig, make_policy=make_policy, services=services, run=run)
