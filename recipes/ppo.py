"""Proximal Policy Optimization (clipped objective, GAE), written against service clients only.

Reads top to bottom: the config (``PPOConfig``, plain data in ``recipes/configs.py``; the actor and critic are
:mod:`recipes.actor_critic`'s), advantage estimation, the loss, then ``run``: collect a batch through the collector (which calls the inference client),
estimate advantages, write the batch to the replay buffer, optimise on minibatches of each epoch the buffer
samples without replacement, push the new weights to the inference server.
Nothing here knows where those services live.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import nn
from tensordict import TensorDictBase

from .actor_critic import Learner, make_policy
from .base import Clients, EpisodeStats, Recipe
from .configs import PPOConfig  # torch-free, so composing a config never imports torch
from .networks import RunningNorm


# ============================================================================ advantages


class ReturnScale:
    """Rewards divided by the running standard deviation of each env's discounted return (the learner's own
    statistics: it sees every batch, env columns in the same order each time)."""

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
        return {"returns": self.returns, "stats": self.stats.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.returns = state["returns"]
        self.stats.load_state_dict(state["stats"])


@torch.no_grad()
def estimate_advantages(batch, learner: Learner, cfg: PPOConfig, scale: ReturnScale | None = None):
    """GAE over a ``[time, env]`` batch; bootstraps from the final observation on truncation, not on termination;
    ``scale`` (``normalize_rewards``) divides the rewards by the running spread of the discounted return."""
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
    """Clipped surrogate + value loss - entropy bonus on one minibatch."""
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


SAMPLE_BYTES = 64 << 20
"""The most bytes :func:`minibatches` asks the replay buffer for in one call."""


def rows_per_call(batch_rows: int, cfg: PPOConfig, row_bytes: int = 0) -> int:
    """How many rows :func:`minibatches` asks the buffer for at once, from the run's first batch (``row_bytes``: the
    bytes of one of its rows). When minibatches tile the batch: as many of an update's minibatches as fit in
    :data:`SAMPLE_BYTES` (every one of them, with small observations: a buffer in another process then costs one
    round trip per update), a number that divides them; else one minibatch. Fixed for the run (a shared-memory or
    distributed endpoint binds its sample layout on the first call)."""
    if batch_rows % cfg.minibatch_size:
        return cfg.minibatch_size
    count = cfg.update_epochs * cfg.num_minibatches
    fit = max(1, SAMPLE_BYTES // max(1, row_bytes * cfg.minibatch_size))
    return max(m for m in range(1, count + 1) if count % m == 0 and m <= fit) * cfg.minibatch_size


def minibatches(replay, cfg: PPOConfig, per_call: int) -> Iterator[TensorDictBase]:
    """The ``update_epochs * num_minibatches`` minibatches of one update, in order.

    The buffer samples without replacement, one permutation of what it holds at a time, and a call for more rows
    than it holds continues through the next permutations (see
    :class:`~components.replay.samplers.WithoutReplacementSampler`). It holds the batch just written (or with
    ``sync=false`` and several workers also the batches before it, up to its capacity: a multiple of a batch), so
    ``per_call`` rows (several minibatches, see :func:`rows_per_call`) at once, split here, are the rows
    ``minibatch_size`` calls would give one by one, in the same order; a replay buffer in another process then
    costs a round trip per update (or per :data:`SAMPLE_BYTES`) rather than per minibatch.
    """
    left = cfg.update_epochs * cfg.num_minibatches
    while left > 0:
        for minibatch in replay.sample(per_call).split(cfg.minibatch_size)[:left]:
            left -= 1
            yield minibatch


def run(cfg: PPOConfig, clients: Clients) -> dict:
    """Train until ``target_return`` or ``total_frames``; return the result and learning curve."""
    torch.manual_seed(clients.seed)
    device = torch.device(cfg.device)
    learner = Learner(cfg, clients.env_spec).to(device)
    optimizer = learner.optimizer(cfg.lr)
    stats = EpisodeStats(cfg.window)
    scale = ReturnScale(cfg.gamma) if cfg.normalize_rewards else None
    restored = clients.checkpoint.restore()  # None for a fresh start
    if restored is not None:
        learner.load_state_dict(restored["learner"])  # onto the learner's device (observation statistics too)
        optimizer.load_state_dict(restored["optimizer"])
        stats.load_state_dict(restored["stats"])
        torch.set_rng_state(restored["rng"])
        if scale is not None:
            scale.load_state_dict(restored["reward_scale"])
    clients.weight_sync.push(learner.policy)  # the server starts from the learner's (initial or restored) weights
    clients.logger.log_hparams({k: getattr(cfg, k) for k in cfg.__dataclass_fields__})

    def state() -> dict:  # what a checkpoint keeps at a batch boundary
        return {"learner": learner.state_dict(), "optimizer": optimizer.state_dict(), "stats": stats.state_dict(),
                "rng": torch.get_rng_state(), **({"reward_scale": scale.state_dict()} if scale is not None else {})}

    per_call = 0  # rows per replay sample: set by the first batch
    for batch in clients.collector:
        mean_return = stats.update(batch)

        # ---- learn
        if cfg.anneal_lr:
            optimizer.param_groups[0]["lr"] = cfg.lr * max(0.0, 1.0 - stats.frames / cfg.total_frames)
        # on the learner's device, once (.to is a no-op on the CPU); the replay buffer holds the rows on the host
        batch = batch.to(device)
        rows = estimate_advantages(batch, learner, cfg, scale).reshape(-1).to("cpu")
        clients.replay.extend(rows)
        losses = {}
        per_call = per_call or rows_per_call(rows.numel(), cfg, rows.bytes() // max(1, rows.numel()))
        for minibatch in minibatches(clients.replay, cfg, per_call):
            loss, losses = ppo_loss(minibatch.to(device), learner, cfg)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(learner.parameters(), cfg.max_grad_norm)
            optimizer.step()
        learner.fold_in(batch["observation"])  # after learning from the batch with the statistics it was acted with
        version = clients.weight_sync.push(learner.policy)

        # ---- report
        clients.logger.log_metrics(
            {**losses, "train/mean_return": mean_return, "train/fps": stats.fps, "train/policy_version": version},
            step=stats.frames,
        )
        clients.progress.update(stats.frames, mean_return=mean_return)
        done = stats.reached(cfg.target_return) or stats.frames >= cfg.total_frames
        clients.checkpoint.step(stats.frames, state, policy_version=version)
        if done:
            break
    return stats.result()


def services(cfg: PPOConfig, spec) -> dict:
    """PPO's needs: a collector batch of ``num_envs * num_steps`` frames, and a replay buffer holding exactly
    one batch, sampled without replacement (see :func:`minibatches`)."""
    if cfg.frames_per_batch % cfg.num_minibatches:
        raise ValueError(
            f"num_envs * num_steps = {cfg.frames_per_batch} must be divisible by num_minibatches={cfg.num_minibatches}"
        )
    return {
        "collector": {"num_envs": cfg.num_envs, "frames_per_batch": cfg.frames_per_batch, "total_frames": cfg.total_frames},
        "replay": {"capacity": cfg.frames_per_batch, "sampler": "without_replacement", "batch_size": cfg.minibatch_size},
    }


RECIPE = Recipe(name="ppo", config=PPOConfig, make_policy=make_policy, services=services, run=run)
