"""Deep Q-learning (double DQN with n-step returns, prioritized replay, a target network and an epsilon schedule),
written against service clients only.

Reads top to bottom: the config (``DQNConfig``, plain data in ``recipes/configs.py``), the networks, the n-step
transitions, the loss, then ``run``: every collected batch is folded into n-step transitions that go into the
(prioritized) replay buffer; after ``learning_starts`` frames the learner samples minibatches, weights the TD
errors with the importance weights, updates the priorities, and periodically syncs the target network.
The behaviour policy (Q-network plus its epsilon) is pushed to the inference server after every batch.
Transitions older than ``max_policy_lag`` pushes are filtered out of sampling by the replay buffer.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from components.inference.modes import acts_deterministically
from components.inference.sampling import SAMPLE_SEED, uniform
from components.targets import instantiate_target

from .base import Clients, Loop, Recipe
from .configs import DQNConfig  # torch-free, so composing a config never imports torch
from .networks import encoder, flat_features
from .update import UpdateStep, learner_device, to_device


# ============================================================================ networks


def q_network(cfg: DQNConfig, spec) -> nn.Module:
    """The built-in network (a CNN encoder and a linear head for images, the MLP for flat observations), or the
    module ``cfg.network`` names by ``_target_`` (built here, where the policy lives).

    Args:
        cfg: the recipe's config.
        spec: the environment's spaces.
    """
    obs = math.prod(spec.observation_shape)
    if cfg.network is not None:  # takes flat float features, whatever the observations
        return flat_features(spec, instantiate_target(cfg.network, "recipe.network", expect=nn.Module,
                                                      in_features=obs, out_features=spec.n_actions))
    trunk = encoder(cfg.encoder, spec.observation_shape, spec.observation_scale, spec.encoder)
    if trunk is not None:
        return nn.Sequential(trunk, nn.Linear(trunk.out_features, spec.n_actions))
    return flat_features(spec, nn.Sequential(nn.Linear(obs, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, cfg.hidden),
                                             nn.ReLU(), nn.Linear(cfg.hidden, spec.n_actions)))


class EpsilonGreedy(nn.Module):
    """The behaviour policy the inference server owns: ``observation`` -> ``action`` (epsilon-greedy).

    ``epsilon`` is a buffer, so it travels with the weights through weight sync.

    Args:
        cfg: the recipe's config.
        spec: the environment's spaces.
    """

    def __init__(self, cfg: DQNConfig, spec):
        super().__init__()
        self.q = q_network(cfg, spec)
        self.register_buffer("epsilon", torch.tensor(cfg.eps_start))

    def forward(self, td):
        """Set each row's ``action``: greedy, or with probability ``epsilon`` one drawn uniformly (greedy always in a
        deterministic interaction mode, see `components.inference.modes`)."""
        q = self.q(td.get("observation"))
        greedy = q.argmax(-1)
        if acts_deterministically():
            td.set("action", greedy)
            return td
        seed = td.get(SAMPLE_SEED, None)
        if seed is None:  # a request without seeds: torch's generator of this process
            explore = torch.rand(greedy.shape, device=greedy.device) < self.epsilon
            other = torch.randint_like(greedy, q.shape[-1])
        else:  # each row's own draws, so batching never changes what an environment does
            u = uniform(seed, 2)
            explore, other = u[..., 0] < self.epsilon, (u[..., 1] * q.shape[-1]).long().clamp_(max=q.shape[-1] - 1)
        td.set("action", torch.where(explore, other, greedy))
        return td


def make_policy(cfg: DQNConfig, spec) -> EpsilonGreedy:
    """The behaviour policy for the inference server.

    Args:
        cfg: the recipe's config.
        spec: the environment's spaces.

    Raises:
        ValueError: the environment's actions are continuous.
    """
    if not spec.discrete:
        raise ValueError(f"dqn needs discrete actions; {spec.env_id} has continuous ones")
    return EpsilonGreedy(cfg, spec)


# ============================================================================ n-step transitions


def n_step_transitions(seq, cfg: DQNConfig):
    """Fold ``[time, env]`` steps into ``n_step`` transitions: one per start step whose next ``n_step`` steps
    are all in ``seq`` (the last ``n_step - 1`` steps start none yet). ``next`` gets the discounted reward sum,
    the observation and ``terminated`` of the window's last step (the episode's end if it comes first), and
    ``discount``: ``gamma ** steps`` for bootstrapping.

    Args:
        seq: ``[time, env]`` steps (the previous batch's pending tail first).
        cfg: the recipe's config (``n_step``, ``gamma``, ``clip_rewards``).
    """
    count = seq.shape[0] - (cfg.n_step - 1)
    out = seq[:count].clone()
    nxt = seq["next"]
    reward, discount = torch.zeros_like(out["next", "reward"]), torch.ones_like(out["next", "reward"])
    alive = torch.ones_like(out["next", "done"])
    for k in range(cfg.n_step):
        step = nxt[k : k + count]
        reward += alive * discount * (step["reward"].sign() if cfg.clip_rewards else step["reward"])
        keep = alive.reshape(*alive.shape, *(1,) * (step["observation"].dim() - alive.dim()))  # over the obs' dims
        out["next", "observation"] = torch.where(keep, step["observation"], out["next", "observation"])
        out["next", "terminated"] = torch.where(alive, step["terminated"], out["next", "terminated"])
        discount = torch.where(alive, discount * cfg.gamma, discount)
        alive = alive & ~step["done"]
    out["next", "reward"], out["next", "discount"] = reward, discount
    return out


# ============================================================================ loss


def td_loss(rows, weight: torch.Tensor, online: nn.Module, target: nn.Module,
            cfg: DQNConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Double-DQN TD loss weighted by importance weights.

    Args:
        rows: a minibatch of n-step transitions.
        weight: each transition's importance weight.
        online: the Q-network that learns (and picks the next action).
        target: the target Q-network (values the next action).
        cfg: the recipe's config.

    Returns:
        The loss and each transition's ``|TD error|`` (its new priority).
    """
    obs, nxt = rows["observation"], rows["next"]
    q = online(obs).gather(-1, rows["action"].unsqueeze(-1)).squeeze(-1).float()  # single precision under autocast
    with torch.no_grad():
        next_action = online(nxt["observation"]).argmax(-1, keepdim=True)
        next_q = target(nxt["observation"]).gather(-1, next_action).squeeze(-1).float()
        y = nxt["reward"] + nxt["discount"] * (~nxt["terminated"]).float() * next_q
    error = q - y
    loss = (weight * F.smooth_l1_loss(q, y, reduction="none")).mean()
    return loss, error.detach().abs()


def learn(replay: Any, step: UpdateStep, online: nn.Module, target: nn.Module, optimizer: torch.optim.Optimizer,
          updates: int, cfg: DQNConfig) -> dict:
    """One gradient step on a prioritized sample: the TD loss as ``step`` computes it (`td_loss`, under autocast
    or compiled as configured), the backward pass, the gradient clip and the optimizer step; the sample's new
    priorities back to the replay buffer; the target network moved towards the online one every ``target_every``
    steps (``updates`` counts the steps before this one).

    The sample moves to the learner's device in one copy that waits for nothing; the priorities come back to the host,
    where the buffer keeps them: the one wait for the device of a step.

    Returns:
        The step's loss and mean ``|TD error|`` (tensors, on the learner's device).
    """
    device = next(online.parameters()).device
    sample = replay.sample_prioritized(cfg.batch_size)
    loss, error = step(to_device(sample.rows, device), to_device(sample.weight, device))
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(online.parameters(), cfg.max_grad_norm)
    optimizer.step()
    replay.update_priority(sample.index, error.to("cpu"))
    if (updates + 1) % cfg.target_every == 0:
        with torch.no_grad():
            for t, o in zip(target.parameters(), online.parameters()):
                t.lerp_(o, cfg.tau)
    return {"loss/td": loss.detach(), "q/mean_abs_td": error.mean()}


# ============================================================================ training loop

TRANSITION_KEYS = ("observation", "action", "policy_version", ("next", "observation"), ("next", "reward"),
                   ("next", "terminated"), ("next", "done"))
"""What the learner keeps of each step."""


def run(cfg: DQNConfig, clients: Clients) -> dict:
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
    behaviour = make_policy(cfg, clients.env_spec).to(device)
    target = q_network(cfg, clients.env_spec).to(device)
    target.load_state_dict(behaviour.q.state_dict())
    optimizer = torch.optim.Adam(behaviour.q.parameters(), lr=cfg.lr)
    saved = loop.start(behaviour, behaviour=behaviour, target=target, optimizer=optimizer)
    step = UpdateStep(lambda rows, weight: td_loss(rows, weight, behaviour.q, target, cfg), cfg, device)
    updates, stored, losses = saved.get("updates", 0), saved.get("stored", 0), saved.get("losses", {})
    pending = saved.get("pending")  # the last n_step - 1 steps, which start no complete n-step window yet
    if pending is not None:  # the environments restart their episodes: the tail's windows end at its last step
        pending["next", "done"][-1] = True

    for batch in loop.batches():
        frames = loop.stats.frames
        seq = batch.select(*TRANSITION_KEYS)
        seq = seq if pending is None else torch.cat([pending, seq], dim=0)
        if seq.shape[0] >= cfg.n_step:
            transitions = n_step_transitions(seq, cfg).exclude(("next", "done")).reshape(-1)
            stored += len(clients.replay.extend(transitions))  # the positions written (filters may drop rows)
        pending = seq[max(0, seq.shape[0] - (cfg.n_step - 1)):]

        # ---- learn
        if frames >= cfg.learning_starts and stored:
            for _ in range(cfg.updates_per_batch):
                losses = learn(clients.replay, step, behaviour.q, target, optimizer, updates, cfg)
                updates += 1
        epsilon = max(cfg.eps_end, cfg.eps_start - (cfg.eps_start - cfg.eps_end) * frames / cfg.eps_frames)
        behaviour.epsilon.fill_(epsilon)
        version = loop.push(behaviour)

        # ---- report
        every = loop.stats.episodes and frames % (cfg.frames_per_batch * 25) == 0
        metrics = {**losses, "train/mean_return": loop.stats.mean_return, "train/fps": loop.stats.fps,
                   "train/epsilon": epsilon, "train/policy_version": version} if every else None
        if loop.end_batch(metrics, updates=updates, stored=stored, losses=losses, pending=pending):
            break

    clients.logger.log_metrics({"train/mean_return": loop.stats.mean_return}, step=loop.stats.frames)
    return loop.result()


def services(cfg: DQNConfig, spec) -> dict:
    """DQN's needs: small collector batches, and a prioritized buffer that drops transitions of stale policies
    at sampling time and keeps stacks of pixel frames one frame at a time.

    Args:
        cfg: the recipe's config.
        spec: the environment's spaces.

    Returns:
        Each service's options, by component.
    """
    if not spec.discrete:
        raise ValueError(f"dqn needs discrete actions; {spec.env_id} has continuous ones")
    frames = cfg.replay_frames
    if frames is None:  # stacks of pixel frames: uint8 [stack, height, width]
        frames = spec.observation_dtype == torch.uint8 and len(spec.observation_shape) == 3 and spec.observation_scale < 1
    return {
        "collector": {"num_envs": cfg.num_envs, "frames_per_batch": cfg.frames_per_batch, "total_frames": cfg.total_frames},
        "replay": {"capacity": cfg.buffer_size, "sampler": "prioritized", "batch_size": cfg.batch_size,
                   "alpha": cfg.alpha, "beta": cfg.beta, "max_policy_lag": cfg.max_policy_lag,
                   "frames": ["observation", "next.observation"] if frames else []},
    }


RECIPE = Recipe(name="dqn", config=DQNConfig, make_policy=make_policy, services=services, run=run)
