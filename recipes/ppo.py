"""Proximal Policy Optimization (clipped objective, GAE), written against service clients only.

Reads top to bottom: the config (``PPOConfig``, plain data in ``recipes/configs.py``; the actor and critic are
`recipes.actor_critic`'s), advantage estimation, the loss, the update, then ``run``: collect a batch through the
collector (which calls the inference client), move it to the learner's device, estimate advantages, write the batch to
the replay buffer, optimise on the minibatches of each epoch the buffer samples without replacement, push the new
weights to the inference server. Nothing here knows where those services live.

A learner off the CPU (``device=cuda``) keeps the batch on its device: the replay buffer holds each row's number and
samples those, and the minibatches are the learner's own rows at the numbers it hands back (one small copy to the
device per update), so no row goes to the host and back. The losses stay on the device until they are logged.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from .actor_critic import Learner, fresh_steps, make_policy
from .base import Clients, Loop, Recipe
from .configs import PPOConfig  # torch-free, so composing a config never imports torch
from .networks import RunningNorm
from .update import UpdateStep, learner_device, to_device


# ============================================================================ advantages


class ReturnScale:
    """Rewards divided by the running standard deviation of each env's discounted return (the learner's own
    statistics: it sees every batch, env columns in the same order each time).

    Args:
        gamma: the discount of the return whose spread scales the rewards.
        eps: added to the variance before its square root.
        device: where the running returns and their statistics live: the learner's device.
    """

    def __init__(self, gamma: float, eps: float = 1e-8, device: torch.device | str = "cpu"):
        self.gamma, self.eps, self.device = gamma, eps, torch.device(device)
        self.returns: torch.Tensor | None = None
        self.stats = RunningNorm(()).to(self.device)

    def __call__(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """Scaled ``[time, env]`` rewards; the statistics include this batch."""
        if self.returns is None or self.returns.shape != reward.shape[1:]:
            self.returns = torch.zeros(reward.shape[1:], dtype=torch.float64, device=self.device)
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
        """Continue from `state_dict`'s values (on this scale's device, wherever they were saved)."""
        returns = state["returns"]
        self.returns = None if returns is None else returns.to(self.device)
        self.stats.load_state_dict(state["stats"])


@torch.no_grad()
def estimate_advantages(batch, learner: Learner, cfg: PPOConfig, scale: ReturnScale | None = None,
                        fresh: tuple[torch.Tensor, torch.Tensor] | None = None):
    """GAE over a ``[time, env]`` batch; bootstraps from the final observation on truncation, not on termination;
    ``scale`` (``normalize_rewards``) divides the rewards by the running spread of the discounted return.

    Args:
        batch: a collected ``[time, env]`` batch.
        learner: values the observations.
        cfg: the recipe's config.
        scale: the reward scale, or ``None``.
        fresh: where the learner `reuses_values`, the steps it values apart
            (`fresh_steps`), on the batch's device: read on the host, where the batch
            came from (default: read from the batch, which waits for a CUDA device).

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
        fresh = fresh_steps(nxt["done"]) if fresh is None else fresh
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
        mb: rows of `estimate_advantages`.
        learner: the actor and critic being trained.
        cfg: the recipe's config.

    Returns:
        The loss and its parts as metrics (tensors, on the learner's device).
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
    return loss, {"loss/policy": pg_loss.detach(), "loss/value": v_loss.detach(), "loss/entropy": entropy.detach()}


# ============================================================================ the update


def minibatches(rows: TensorDictBase, replay: Any, cfg: PPOConfig,
                numbers: bool | None = None) -> Iterator[TensorDictBase]:
    """Write a batch's ``rows`` to the replay buffer and yield the minibatches of every epoch, in the order its
    sampler (without replacement) gives them.

    The buffer holds the rows and hands them back; or, with ``numbers`` (the default off the CPU), the rows stay where
    they are: the buffer holds each row's number (``row``), the numbers of every minibatch of the update come back in
    one copy to the rows' device that waits for nothing, and each minibatch is the rows at its numbers.

    Args:
        rows: the batch's rows (`estimate_advantages`, flattened), on the learner's device.
        replay: the replay client.
        cfg: the recipe's config.
        numbers: write the rows' numbers rather than the rows (default: where the rows are off the CPU).
    """
    count, device = cfg.update_epochs * cfg.num_minibatches, rows.get("advantage").device
    if not (device.type != "cpu" if numbers is None else numbers):
        replay.extend(rows)
        yield from replay.minibatches(count, cfg.minibatch_size)
        return
    replay.extend(TensorDict({"row": torch.arange(rows.shape[0])}, batch_size=rows.shape))
    order = torch.cat([minibatch["row"] for minibatch in replay.minibatches(count, cfg.minibatch_size)])
    for index in to_device(order, device).split(cfg.minibatch_size):
        yield rows[index]


def update(batches: Iterator[TensorDictBase], learner: Learner, optimizer: torch.optim.Optimizer,
           step: UpdateStep, cfg: PPOConfig) -> dict:
    """One gradient step per minibatch: the loss as ``step`` computes it (`ppo_loss`, under autocast or
    compiled as configured), then the backward pass, the gradient clip and the optimizer step. Nothing is read back
    to the host.

    Args:
        batches: the minibatches (`minibatches`), on the learner's device.
        learner: the actor and critic being trained.
        optimizer: the learner's optimizer.
        step: the forward pass and loss (`UpdateStep` of `ppo_loss`).
        cfg: the recipe's config.

    Returns:
        The last minibatch's losses (tensors on the learner's device).
    """
    losses: dict = {}
    for minibatch in batches:
        loss, losses = step(minibatch)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(learner.parameters(), cfg.max_grad_norm)
        optimizer.step()
    return losses


# ============================================================================ training loop


def run(cfg: PPOConfig, clients: Clients) -> dict:
    """Train until ``target_return`` or ``total_frames``; return the result and learning curve.

    Args:
        cfg: the recipe's config.
        clients: the running services' clients.

    Returns:
        `result`: frames, wall seconds, frames/s, episodes, mean return, solved,
        the learning curve.
    """
    loop = Loop(cfg, clients)  # seeds torch: the networks are built from its generator
    device = learner_device(cfg)
    learner = Learner(cfg, clients.env_spec).to(device)
    optimizer = learner.optimizer(cfg.lr)
    scale = ReturnScale(cfg.gamma, device=device) if cfg.normalize_rewards else None
    loop.start(learner.policy, learner=learner, optimizer=optimizer, reward_scale=scale)
    step = UpdateStep(lambda minibatch: ppo_loss(minibatch, learner, cfg), cfg, device)

    for batch in loop.batches():
        # ---- learn
        if cfg.anneal_lr:
            optimizer.param_groups[0]["lr"] = cfg.lr * max(0.0, 1.0 - loop.stats.frames / cfg.total_frames)
        fresh = to_device(fresh_steps(batch["next", "done"]), device) if learner.reuses_values else None
        batch = to_device(batch, device)  # on the learner's device, once, without waiting for it
        rows = estimate_advantages(batch, learner, cfg, scale, fresh).reshape(-1)
        losses = update(minibatches(rows, clients.replay, cfg), learner, optimizer, step, cfg)
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
    (`minibatches`).

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
