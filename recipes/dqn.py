"""Deep Q-learning (double DQN with n-step returns, prioritized replay, a target network and an epsilon schedule),
written against service clients only.

Reads top to bottom: the config, the networks, the n-step transitions, the loss, then ``run``: every collected
batch is folded into n-step transitions that go into the (prioritized) replay buffer; after ``learning_starts``
frames the learner samples minibatches, weights the TD errors with the importance weights, updates the
priorities, and periodically syncs the target network.
The behaviour policy (Q-network plus its epsilon) is pushed to the inference server after every batch.
Transitions older than ``max_policy_lag`` pushes are filtered out of sampling by the replay buffer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from .base import Clients, EpisodeStats, Recipe


@dataclass
class DQNConfig:
    """DQN hyperparameters.

    Attributes:
        num_envs: parallel environments in the collector's vector env.
        num_steps: steps per environment per collected batch.
        total_frames: frame budget; training stops earlier once ``target_return`` is reached.
        target_return: stop when the mean return of the last ``window`` episodes reaches this (``None``: never).
        window: how many recent episodes the mean return covers.
        buffer_size: replay capacity (transitions).
        batch_size: minibatch size.
        learning_starts: frames collected before learning begins.
        updates_per_batch: gradient steps after each collected batch.
        lr: Adam learning rate.
        gamma: discount factor.
        n_step: steps summed into each TD target (1: one-step Q-learning); an episode's end cuts the sum short.
        tau: soft target-network update rate per gradient step (1.0: hard copy every ``target_every`` steps).
        target_every: gradient steps between target updates.
        eps_start: initial exploration rate.
        eps_end: final exploration rate.
        eps_frames: frames over which epsilon decays linearly.
        alpha: prioritized replay exponent.
        beta: importance-sampling exponent.
        max_policy_lag: transitions from behaviour policies more than this many pushes old are not sampled.
        hidden: width of the two hidden layers.
        max_grad_norm: gradient norm clipping.
    """

    num_envs: int = 8
    num_steps: int = 8
    total_frames: int = 200_000
    target_return: Optional[float] = 475.0
    window: int = 20
    buffer_size: int = 50_000
    batch_size: int = 128
    learning_starts: int = 1_000
    updates_per_batch: int = 2
    lr: float = 1e-3
    gamma: float = 0.99
    n_step: int = 20
    tau: float = 0.01
    target_every: int = 1
    eps_start: float = 1.0
    eps_end: float = 0.005
    eps_frames: int = 10_000
    alpha: float = 0.6
    beta: float = 0.4
    max_policy_lag: int = 2_000
    hidden: int = 128
    max_grad_norm: float = 10.0

    @property
    def frames_per_batch(self) -> int:
        return self.num_envs * self.num_steps


# ============================================================================ networks


def q_network(cfg: DQNConfig, spec) -> nn.Sequential:
    obs = math.prod(spec.observation_shape)
    return nn.Sequential(nn.Linear(obs, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(),
                         nn.Linear(cfg.hidden, spec.n_actions))


class EpsilonGreedy(nn.Module):
    """The behaviour policy the inference server owns: ``observation`` -> ``action`` (epsilon-greedy).

    ``epsilon`` is a buffer, so it travels with the weights through weight sync.
    """

    def __init__(self, cfg: DQNConfig, spec):
        super().__init__()
        self.q = q_network(cfg, spec)
        self.register_buffer("epsilon", torch.tensor(cfg.eps_start))

    def forward(self, td):
        q = self.q(td.get("observation"))
        greedy = q.argmax(-1)
        explore = torch.rand(greedy.shape) < self.epsilon
        td.set("action", torch.where(explore, torch.randint_like(greedy, q.shape[-1]), greedy))
        return td


def make_policy(cfg: DQNConfig, spec) -> EpsilonGreedy:
    if not spec.discrete:
        raise ValueError(f"dqn needs discrete actions; {spec.env_id} has continuous ones")
    return EpsilonGreedy(cfg, spec)


# ============================================================================ n-step transitions


def n_step_transitions(seq, cfg: DQNConfig):
    """Fold ``[time, env]`` steps into ``n_step`` transitions: one per start step whose next ``n_step`` steps
    are all in ``seq`` (the last ``n_step - 1`` steps start none yet). ``next`` gets the discounted reward sum,
    the observation and ``terminated`` of the window's last step (the episode's end if it comes first), and
    ``discount``: ``gamma ** steps`` for bootstrapping."""
    count = seq.shape[0] - (cfg.n_step - 1)
    out = seq[:count].clone()
    nxt = seq["next"]
    reward, discount = torch.zeros_like(out["next", "reward"]), torch.ones_like(out["next", "reward"])
    alive = torch.ones_like(out["next", "done"])
    for k in range(cfg.n_step):
        step = nxt[k : k + count]
        reward += alive * discount * step["reward"]
        out["next", "observation"] = torch.where(alive.unsqueeze(-1), step["observation"], out["next", "observation"])
        out["next", "terminated"] = torch.where(alive, step["terminated"], out["next", "terminated"])
        discount = torch.where(alive, discount * cfg.gamma, discount)
        alive = alive & ~step["done"]
    out["next", "reward"], out["next", "discount"] = reward, discount
    return out


# ============================================================================ loss


def td_loss(mb, online: nn.Module, target: nn.Module, cfg: DQNConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Double-DQN TD loss weighted by importance weights; returns (loss, |TD error|)."""
    obs, nxt = mb["observation"], mb["next"]
    q = online(obs).gather(-1, mb["action"].unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        next_action = online(nxt["observation"]).argmax(-1, keepdim=True)
        next_q = target(nxt["observation"]).gather(-1, next_action).squeeze(-1)
        y = nxt["reward"] + nxt["discount"] * (~nxt["terminated"]).float() * next_q
    error = q - y
    loss = (mb.get("_weight", torch.ones_like(error)) * F.smooth_l1_loss(q, y, reduction="none")).mean()
    return loss, error.detach().abs()


# ============================================================================ training loop


def run(cfg: DQNConfig, clients: Clients) -> dict:
    """Train until ``target_return`` or ``total_frames``; return the result and learning curve."""
    torch.manual_seed(clients.seed)
    behaviour = make_policy(cfg, clients.env_spec)
    target = q_network(cfg, clients.env_spec)
    target.load_state_dict(behaviour.q.state_dict())
    optimizer = torch.optim.Adam(behaviour.q.parameters(), lr=cfg.lr)
    clients.weight_sync.push(behaviour)
    clients.logger.log_hparams({k: getattr(cfg, k) for k in cfg.__dataclass_fields__})

    stats = EpisodeStats(cfg.window)
    updates, stored = 0, 0
    keys = ["observation", "action", "policy_version", ("next", "observation"), ("next", "reward"), ("next", "terminated"),
            ("next", "done")]
    pending = None  # the last n_step - 1 steps, which start no complete n-step window yet
    losses: dict = {}

    for batch in clients.collector:
        mean_return = stats.update(batch)
        frames = stats.frames
        seq = batch.select(*keys) if pending is None else torch.cat([pending, batch.select(*keys)], dim=0)
        if seq.shape[0] >= cfg.n_step:
            transitions = n_step_transitions(seq, cfg).exclude(("next", "done")).reshape(-1)
            clients.replay.extend(transitions)
            stored += transitions.numel()
        pending = seq[max(0, seq.shape[0] - (cfg.n_step - 1)):]

        # ---- learn
        if frames >= cfg.learning_starts and stored:
            for _ in range(cfg.updates_per_batch):
                mb = clients.replay.sample(cfg.batch_size)
                loss, error = td_loss(mb, behaviour.q, target, cfg)
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(behaviour.q.parameters(), cfg.max_grad_norm)
                optimizer.step()
                clients.replay.update_priority(mb["index"], error)
                updates += 1
                if updates % cfg.target_every == 0:
                    with torch.no_grad():
                        for t, o in zip(target.parameters(), behaviour.q.parameters()):
                            t.lerp_(o, cfg.tau)
            losses = {"loss/td": loss.item(), "q/mean_abs_td": error.mean().item()}
        behaviour.epsilon.fill_(max(cfg.eps_end, cfg.eps_start - (cfg.eps_start - cfg.eps_end) * frames / cfg.eps_frames))
        version = clients.weight_sync.push(behaviour)

        # ---- report
        if stats.episodes and frames % (cfg.frames_per_batch * 25) == 0:
            clients.logger.log_metrics({**losses, "train/mean_return": mean_return, "train/fps": stats.fps,
                                        "train/epsilon": float(behaviour.epsilon), "train/policy_version": version},
                                       step=frames)
        clients.progress.update(frames, mean_return=mean_return)
        if stats.reached(cfg.target_return) or frames >= cfg.total_frames:
            break

    clients.logger.log_metrics({"train/mean_return": stats.mean_return}, step=stats.frames)
    return stats.result()


def services(cfg: DQNConfig, spec) -> dict:
    """DQN's needs: small collector batches, and a prioritized buffer that drops transitions of stale policies
    at sampling time."""
    if not spec.discrete:
        raise ValueError(f"dqn needs discrete actions; {spec.env_id} has continuous ones")
    return {
        "collector": {"num_envs": cfg.num_envs, "frames_per_batch": cfg.frames_per_batch, "total_frames": cfg.total_frames},
        "replay": {"capacity": cfg.buffer_size, "sampler": "prioritized", "batch_size": cfg.batch_size,
                   "alpha": cfg.alpha, "beta": cfg.beta, "max_policy_lag": cfg.max_policy_lag},
    }


RECIPE = Recipe(name="dqn", config=DQNConfig, make_policy=make_policy, services=services, run=run)
