"""Proximal Policy Optimization (clipped objective, GAE), written against service clients only.

Reads top to bottom: the config (``PPOConfig``, plain data in ``recipes/configs.py``), the networks,
advantage estimation, then ``run``: collect a batch through the collector (which calls the inference client),
estimate advantages, write the batch to the replay buffer, optimise on minibatches of each epoch the buffer
samples without replacement, push the new weights to the inference server.
Nothing here knows where those services live.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch
from torch import nn
from tensordict import TensorDictBase
from torch.distributions import Categorical, Normal

from components.inference.sampling import SAMPLE_SEED, uniform
from components.targets import instantiate_target

from .base import Clients, EpisodeStats, Recipe
from .configs import PPOConfig  # torch-free, so composing a config never imports torch
from .networks import RunningNorm, encoder, flat_features, layer


# ============================================================================ networks


def _mlp(inp: int, out: int, hidden: int, out_std: float) -> nn.Sequential:
    return nn.Sequential(layer(nn.Linear(inp, hidden)), nn.Tanh(), layer(nn.Linear(hidden, hidden)), nn.Tanh(),
                         layer(nn.Linear(hidden, out), out_std))


def _network(cfg: PPOConfig, spec, out: int, out_std: float, encoder: nn.Module | None = None) -> nn.Module:
    """The built-in network (``encoder`` and a linear head, or the MLP for flat observations), or the module
    ``cfg.network`` names by ``_target_`` (built here, where the policy lives)."""
    inp = math.prod(spec.observation_shape)
    if cfg.network is not None:  # takes flat float features, whatever the observations
        return flat_features(spec, instantiate_target(cfg.network, "recipe.network", expect=nn.Module,
                                                      in_features=inp, out_features=out))
    if encoder is not None:
        return nn.Sequential(encoder, layer(nn.Linear(encoder.out_features, out), out_std))
    return flat_features(spec, _mlp(inp, out, cfg.hidden, out_std))


class Actor(nn.Module):
    """The stochastic policy: logits for discrete actions, a Gaussian for continuous ones. With a convolutional
    encoder (images), :attr:`encoder` is the trunk the critic shares."""

    def __init__(self, cfg: PPOConfig, spec):
        super().__init__()
        self.discrete = spec.discrete
        self.encoder = None if cfg.network is not None else encoder(cfg.encoder, spec.observation_shape,
                                                                     spec.observation_scale)
        if self.discrete:
            self.net = _network(cfg, spec, spec.n_actions, 0.01, self.encoder)
        else:
            act_dim = math.prod(spec.action_shape)
            self.net = _network(cfg, spec, act_dim, 0.01, self.encoder)
            self.log_std = nn.Parameter(torch.full((act_dim,), cfg.init_log_std))
        self.norm = RunningNorm(spec.observation_shape) if cfg.normalize_observations else None
        if self.norm is not None:  # in front of the whole network: what the policy holds, weight sync ships
            self.net = nn.Sequential(self.norm, self.net)

    def dist(self, obs: torch.Tensor):
        return self.dist_of(self.net(obs))

    def dist_of(self, out: torch.Tensor):
        """The action distribution of the network's outputs."""
        if self.discrete:
            return Categorical(logits=out, validate_args=False)  # the network's outputs are valid logits
        return Normal(out, self.log_std.exp().expand_as(out), validate_args=False)

    def act(self, obs: torch.Tensor, seed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(action, log-probability)`` per row, drawn as :meth:`sample` does (from ``seed`` where given); for
        discrete actions straight from the log-softmax, without building a distribution (the collection hot path)."""
        if not self.discrete:
            dist = self.dist(obs)
            action = dist.sample() if seed is None else self.sample(dist, seed)
            return action, self.log_prob(dist, action)
        log_p = self.net(obs).log_softmax(-1)
        if seed is None:
            probs = log_p.exp()  # multinomial takes rows: any leading dimensions folded into one
            action = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1).reshape(probs.shape[:-1])
        else:
            cdf = log_p.exp().cumsum(-1)
            action = (cdf < uniform(seed, 1) * cdf[..., -1:]).sum(-1)
        return action, log_p.gather(-1, action.unsqueeze(-1)).squeeze(-1)

    def sample(self, dist, seed: torch.Tensor) -> torch.Tensor:
        """An action per row drawn from the row's ``sample_seed`` alone (so batching never changes it): the inverse
        CDF of one uniform for discrete actions, Box-Muller normals for continuous ones."""
        if self.discrete:
            cdf = dist.logits.exp().cumsum(-1)  # Categorical keeps its logits normalized: these are the probabilities
            return (cdf < uniform(seed, 1) * cdf[..., -1:]).sum(-1)  # never the last index past its probability
        n = dist.loc.shape[-1]
        u = uniform(seed, 2 * n)
        normal = (-2 * u[..., :n].log()).sqrt() * torch.cos(2 * math.pi * u[..., n:])
        return dist.loc + dist.scale * normal.to(dist.loc.dtype)

    def log_prob(self, dist, action: torch.Tensor) -> torch.Tensor:
        lp = dist.log_prob(action)
        return lp if self.discrete else lp.sum(-1)

    def entropy(self, dist) -> torch.Tensor:
        ent = dist.entropy()
        return ent if self.discrete else ent.sum(-1)


class BehaviourPolicy(nn.Module):
    """The TensorDict policy the inference server owns: ``observation`` -> ``action``, ``sample_log_prob``."""

    def __init__(self, actor: Actor):
        super().__init__()
        self.actor = actor

    def forward(self, td):
        # collectors send one seed per env and step: the same draw in every placement
        action, log_prob = self.actor.act(td.get("observation"), td.get(SAMPLE_SEED, None))
        td.set("action", action)
        td.set("sample_log_prob", log_prob)
        return td


def make_policy(cfg: PPOConfig, spec) -> BehaviourPolicy:
    """The behaviour policy for the inference server (same structure as the learner's ``policy``)."""
    return BehaviourPolicy(Actor(cfg, spec))


class Learner(nn.Module):
    """Actor (shared structure with the behaviour policy) and critic, trained together.

    Attributes:
        reuses_values: advantage estimation reads the value of each next observation from the next step's value
            where they are the same observation (with a CNN, where a forward pass costs; the MLP's path values
            every next observation, as it always has).
    """

    def __init__(self, cfg: PPOConfig, spec):
        super().__init__()
        self.policy = make_policy(cfg, spec)
        self.critic = _network(cfg, spec, 1, 1.0, self.policy.actor.encoder)  # the actor's trunk, when it has one
        if self.policy.actor.norm is not None:  # the same statistics as the actor's
            self.critic = nn.Sequential(self.policy.actor.norm, self.critic)
        self.reuses_values = self.policy.actor.encoder is not None
        # convolution weights channels-last in the learner only: on CPU oneDNN trains the Nature CNN 1.1-1.3x
        # faster so (benchmarks/impala_atari.py's learn phase), while the small batches of acting run faster on the
        # default layout; weights move between the two by copy, which keeps each side's layout
        self.to(memory_format=torch.channels_last)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    def optimizer(self, lr: float) -> torch.optim.Optimizer:
        """Adam as the recipes train with it: CleanRL's ``eps`` 1e-5, fused (one kernel per step: on one CPU thread
        the Nature CNN's step with its gradient clip takes 1.4 ms against 10 ms for torch's default multi-tensor
        Adam, which two threads speed up by a quarter only)."""
        return torch.optim.Adam(self.parameters(), lr=lr, eps=1e-5, fused=True)

    def fold_in(self, observations: torch.Tensor) -> None:
        """Fold observations ``[..., *observation_shape]`` into the policy's running statistics, where it normalises
        them (the recipes call it after learning from a batch, with the statistics it was acted with)."""
        if self.policy.actor.norm is not None:
            self.policy.actor.norm.update(observations)

    def dist_and_value(self, obs: torch.Tensor):
        """The action distribution and the value of ``obs``; a shared encoder runs once for both heads."""
        actor = self.policy.actor
        if actor.encoder is None:
            return actor.dist(obs), self.value(obs)
        features = actor.encoder(obs if actor.norm is None else actor.norm(obs))
        head, value_head = actor.net[-1], self.critic[-1]
        if actor.norm is not None:  # (norm, (encoder, head))
            head, value_head = head[1], value_head[1]
        return actor.dist_of(head(features)), value_head(features).squeeze(-1)


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
