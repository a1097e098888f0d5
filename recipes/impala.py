"""IMPALA (Espeholt et al., 2018): an actor-critic that learns from unrolls as they arrive, corrected by V-trace for
the lag of the policy that acted them; with ``clip_coef`` set, APPO (Sample Factory's asynchronous PPO). Written
against service clients only.

Reads top to bottom: the config (``IMPALAConfig``, plain data in ``recipes/configs.py``), unrolls and their lag, the
loss, then ``run``. Each worker of the collector hands over one unroll of ``unroll_length`` steps of each of its envs
as soon as it has it (the collector runs asynchronously: a worker collects its next unroll while the learner trains);
the recipe queues the unrolls in the replay buffer, used as a FIFO learner queue (sampler ``fifo``), and updates as
soon as ``batch_size`` of them wait, whichever workers they came from. Every step carries the ``policy_version``
that acted it and the behaviour log-probability; V-trace weighs each step by ``pi / mu``, and unrolls more than
``max_policy_lag`` versions behind are dropped, counted. The actors' policy (the inference server's, or each worker's
replica) gets the learner's weights every ``push_every`` updates. Nothing here knows where those services live.
"""

from __future__ import annotations

import dataclasses
import time

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from .base import Clients, Loop, Recipe
from .configs import IMPALAConfig  # torch-free, so composing a config never imports torch
from .actor_critic import Learner, fresh_steps, make_policy  # PPO's actor and critic (sample_log_prob)
from .update import UpdateStep, learner_device, to_device
from .vtrace import vtrace

# ============================================================================ unrolls and their lag

UNROLL_KEYS = ("observation", "action", "sample_log_prob", "policy_version", ("next", "observation"),
               ("next", "reward"), ("next", "terminated"), ("next", "done"))
"""What the learner keeps of each step."""

LAG_BUCKETS = 4
"""The lag histogram's buckets: 0, 1, ..., ``LAG_BUCKETS - 1`` versions behind, and ``LAG_BUCKETS`` or more."""


def unrolls_of(chunk: TensorDictBase) -> TensorDict:
    """A collected ``[time, env]`` chunk as one row per env: ``[env]`` rows whose leaves are ``[time, ...]`` (what
    the learner queue stores and hands back whole)."""
    steps = chunk.select(*UNROLL_KEYS)
    return steps.apply(lambda leaf: leaf.transpose(0, 1).contiguous(), batch_size=steps.batch_size[1:2])


def time_major(unrolls: TensorDictBase) -> TensorDict:
    """``[unroll]`` rows of ``[time, ...]`` leaves back to a ``[time, unroll]`` batch."""
    count, length = unrolls.get("action").shape[:2]
    return unrolls.apply(lambda leaf: leaf.transpose(0, 1), batch_size=[length, count])


def unroll_by_unroll(leaf: torch.Tensor) -> torch.Tensor:
    """A ``[time, unroll, ...]`` leaf as one dim of steps, unroll after unroll: a view where the unrolls are the
    queue's rows (`time_major`), so the network's input is not copied to be flattened."""
    return leaf.transpose(0, 1).flatten(0, 1)


def unrolls_at(steps: TensorDictBase, columns: torch.Tensor) -> TensorDict:
    """The unrolls ``columns`` of a ``[time, unroll]`` batch, each copied whole: one block per unroll where the batch
    is a view of the learner queue's rows (`time_major`), where indexing the time-major view copies each step
    apart (4 unrolls of 32 Atari frame stacks: 0.1 ms against 2.2 ms on one thread)."""
    return steps.apply(lambda leaf: leaf.transpose(0, 1).index_select(0, columns).transpose(0, 1),
                       batch_size=[steps.shape[0], len(columns)])


def within_lag(unrolls: TensorDictBase, version: int, max_policy_lag: int | None) -> tuple[TensorDictBase, torch.Tensor,
                                                                                           int]:
    """The unrolls no step of which was acted more than ``max_policy_lag`` versions behind ``version``, the lag of
    every step of the batch (``version - policy_version``), and how many unrolls were dropped.

    Args:
        unrolls: ``[unroll]`` rows of ``[time, ...]`` leaves.
        version: the learner's policy version.
        max_policy_lag: the most versions behind a kept unroll's steps may be (``None``: every unroll is kept).
    """
    lags = version - unrolls.get("policy_version")
    if max_policy_lag is None:
        return unrolls, lags, 0
    fresh = lags.amax(dim=1) <= max_policy_lag
    kept = int(fresh.sum())
    return (unrolls if kept == len(fresh) else unrolls[fresh]), lags, len(fresh) - kept


def lag_metrics(lags: torch.Tensor) -> dict:
    """The batch's policy lag: mean, max, and the share of its steps in each bucket (``lag/hist_<k>``, the last
    bucket ``lag/hist_<LAG_BUCKETS>+``)."""
    counts = torch.bincount(lags.reshape(-1).clamp(0, LAG_BUCKETS), minlength=LAG_BUCKETS + 1).double()
    shares = (counts / counts.sum()).tolist()
    hist = {f"lag/hist_{k}" + ("+" if k == LAG_BUCKETS else ""): share for k, share in enumerate(shares)}
    return {"lag/mean": lags.double().mean().item(), "lag/max": int(lags.max()), **hist}


# ============================================================================ loss


def forward(steps: TensorDictBase, learner: Learner) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The learner's pass over a ``[time, unroll]`` batch: ``log pi`` of each step's action and each step's value
    (``[time, unroll]``), and the mean entropy."""
    actor = learner.policy.actor
    length, width = steps.shape
    dist, values = learner.dist_and_value(unroll_by_unroll(steps.get("observation")))
    values = values.reshape(width, length).t()
    log_pi = actor.log_prob(dist, unroll_by_unroll(steps.get("action"))).reshape(width, length).t()
    return log_pi, values, actor.entropy(dist).mean()


@torch.no_grad()
def bootstrap(steps: TensorDictBase, values: torch.Tensor, learner: Learner,
              fresh: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The value after each step (``[time, unroll]``): the next step's value, except at the ``fresh`` steps
    (`fresh_steps`), valued from their own next observation."""
    next_values = torch.cat([values[1:], values[-1:]]).detach()
    next_values[fresh] = learner.value(steps.get(("next", "observation"))[fresh])
    return next_values


def loss_of(steps: TensorDictBase, log_pi: torch.Tensor, values: torch.Tensor, entropy: torch.Tensor,
            next_values: torch.Tensor, cfg: IMPALAConfig) -> tuple[torch.Tensor, dict]:
    """V-trace's targets and the loss of a ``[time, unroll]`` batch from the learner's pass over it (`forward`)
    and the values after each step (`bootstrap`): the policy gradient (or APPO's clipped surrogate) with
    V-trace's advantages, the value regressed onto V-trace's targets, minus the entropy bonus.

    Returns:
        The loss and its parts (and V-trace's ratios) as metrics (tensors, on the learner's device).
    """
    nxt = steps.get("next")
    with torch.no_grad():
        reward = nxt.get("reward").sign() if cfg.clip_rewards else nxt.get("reward")
        targets = vtrace(steps.get("sample_log_prob"), log_pi.detach(), reward, values.detach(), next_values[-1],
                         cfg.gamma * (~nxt.get("terminated")).to(values.dtype), rho_bar=cfg.rho_bar, c_bar=cfg.c_bar,
                         pg_rho_bar=cfg.pg_rho_bar, lambda_=cfg.vtrace_lambda, next_values=next_values,
                         continues=~nxt.get("done"))
    if cfg.clip_coef is None:  # IMPALA: advantages weighted by the clipped ratios, times log pi
        advantages = targets.advantages
        if cfg.norm_adv:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        pg_loss = -(advantages * log_pi).mean()
    else:  # APPO: the clipped surrogate weighs the unweighted advantages by its own ratio
        advantages = targets.q_values - values.detach()
        if cfg.norm_adv:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        ratio = (log_pi - steps.get("sample_log_prob")).exp()
        pg_loss = torch.max(-advantages * ratio,
                            -advantages * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
    v_loss = 0.5 * (values - targets.vs).pow(2).mean()
    loss = pg_loss + cfg.vf_coef * v_loss - cfg.ent_coef * entropy
    return loss, {"loss/policy": pg_loss.detach(), "loss/value": v_loss.detach(), "loss/entropy": entropy.detach(),
                  "vtrace/rho_mean": targets.rhos.mean(),
                  "vtrace/rho_clipped": (targets.rhos > cfg.rho_bar).double().mean()}


class ImpalaLoss:
    """The V-trace actor-critic loss of a ``[time, unroll]`` batch as the config asks it computed: the learner's pass
    (`forward`) and V-trace with the loss (`loss_of`), each an `UpdateStep` (under
    bf16 autocast with ``amp``, compiled at the minibatch's fixed shapes with ``compile``); between them the values
    of the steps whose next observation is not the next step's (`bootstrap`), as many as episodes ended: a
    shape that changes from batch to batch, run as it comes.

    Args:
        learner: the actor and critic being trained.
        cfg: the recipe's config.
        device: the learner's device.
    """

    def __init__(self, learner: Learner, cfg: IMPALAConfig, device: torch.device):
        self.learner, self.cfg, self.device = learner, cfg, device
        # a function of its own for each (torch.compile keeps one cache per function's code)
        self.forward = UpdateStep(lambda steps: forward(steps, learner), cfg, device)
        self.loss = UpdateStep(lambda *args: loss_of(*args, cfg), cfg, device)

    def __call__(self, steps: TensorDictBase,
                 fresh: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, dict]:
        """The loss and its parts as metrics.

        Args:
            steps: a ``[time, unroll]`` batch on the learner's device.
            fresh: `fresh_steps` of the batch, on its device (default: read from it, which waits for a CUDA
                device).
        """
        log_pi, values, entropy = self.forward(steps)
        if fresh is None:
            fresh = fresh_steps(steps.get(("next", "done")))
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.amp):
            next_values = bootstrap(steps, values, self.learner, fresh)
        return self.loss(steps, log_pi, values, entropy, next_values)


def impala_loss(steps: TensorDictBase, learner: Learner, cfg: IMPALAConfig) -> tuple[torch.Tensor, dict]:
    """V-trace actor-critic loss on a ``[time, unroll]`` batch (`ImpalaLoss`, neither autocast nor compiled).

    Args:
        steps: a ``[time, unroll]`` batch.
        learner: the actor and critic being trained.
        cfg: the recipe's config.

    Returns:
        The loss and its parts (and V-trace's ratios) as metrics.
    """
    return ImpalaLoss(learner, dataclasses.replace(cfg, amp=False, compile=False), steps.device)(steps)


def learn(steps: TensorDictBase, learner: Learner, optimizer: torch.optim.Optimizer, cfg: IMPALAConfig,
          loss: ImpalaLoss | None = None) -> dict:
    """One learner update on a ``[time, unroll]`` batch: ``update_epochs`` passes of ``num_minibatches`` minibatches
    of whole unrolls (V-trace recomputed with the current weights each time), then the batch's observations folded
    into the policy's running statistics where it normalises them (after learning with the statistics it was acted
    with); the last minibatch's losses, on the learner's device.

    The batch moves to the learner's device once. Which unrolls each minibatch takes and which of its steps
    `bootstrap` values are drawn and read on the host, from the batch as the learner queue hands it over, and
    reach the device in one copy that waits for nothing: the passes wait for nothing either.

    Args:
        steps: a ``[time, unroll]`` batch (on the host, as `time_major` gives it, or on the learner's device).
        learner: the actor and critic being trained.
        optimizer: the learner's optimizer.
        cfg: the recipe's config.
        loss: the loss as the run computes it (default: `ImpalaLoss` as ``cfg`` asks, built for this call).
    """
    device = next(learner.parameters()).device
    loss = ImpalaLoss(learner, cfg, device) if loss is None else loss
    done = steps.get(("next", "done")).cpu()
    per_minibatch = steps.shape[1] // cfg.num_minibatches
    picks = [(columns, fresh_steps(done[:, columns])) for _ in range(cfg.update_epochs)
             for columns in torch.randperm(steps.shape[1]).split(per_minibatch)]
    flat = [tensor for columns, fresh in picks for tensor in (columns, *fresh)]  # three per minibatch
    moved = to_device(torch.cat(flat), device).split([len(tensor) for tensor in flat])
    steps = to_device(steps, device)
    losses: dict = {}
    for k in range(0, len(moved), 3):
        columns, fresh = moved[k], (moved[k + 1], moved[k + 2])
        value, losses = loss(unrolls_at(steps, columns), fresh)
        optimizer.zero_grad()
        value.backward()
        nn.utils.clip_grad_norm_(learner.parameters(), cfg.max_grad_norm)
        optimizer.step()
    learner.fold_in(steps.get("observation"))
    return losses


# ============================================================================ training loop


def run(cfg: IMPALAConfig, clients: Clients) -> dict:
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
    saved = loop.start(learner.policy, learner=learner, optimizer=optimizer)  # the actors start from these weights
    loss = ImpalaLoss(learner, cfg, device)
    updates, dropped, idle = saved.get("updates", 0), saved.get("dropped", 0), 0.0

    metrics: dict = {}
    waiting_since = time.perf_counter()
    for chunk in loop.batches():  # one worker's unrolls, as soon as they are collected
        idle += time.perf_counter() - waiting_since
        clients.replay.extend(unrolls_of(chunk))
        depth = waiting = len(clients.replay)  # the queue's only reader: one question per chunk, not per batch

        # ---- learn from every full batch of unrolls waiting
        while waiting >= cfg.batch_size:
            waiting -= cfg.batch_size
            unrolls, lags, gone = within_lag(clients.replay.take(cfg.batch_size), loop.version, cfg.max_policy_lag)
            dropped += gone
            metrics.update(lag_metrics(lags))
            if len(unrolls):
                if cfg.anneal_lr:
                    optimizer.param_groups[0]["lr"] = cfg.lr * max(0.0, 1.0 - loop.stats.frames / cfg.total_frames)
                metrics.update(learn(time_major(unrolls), learner, optimizer, cfg, loss))
            updates += 1
            if updates % cfg.push_every == 0:
                loop.push(learner.policy)

        # ---- report
        done = loop.end_batch({
            **metrics, "lag/dropped": dropped, "queue/depth": depth, "train/mean_return": loop.stats.mean_return,
            "train/fps": loop.stats.fps, "train/policy_version": loop.version, "train/updates": updates,
            "learner/idle_fraction": idle / max(1e-9, time.perf_counter() - loop.stats.start),
        }, progress={"lag": metrics.get("lag/mean", 0.0)}, updates=updates, dropped=dropped)
        if done:
            break
        waiting_since = time.perf_counter()
    return loop.result()


def services(cfg: IMPALAConfig, spec) -> dict:
    """IMPALA's needs: collector workers that each hand over an unroll of their envs as soon as it is collected
    (``sync: false``), up to ``prefetch`` of them collected ahead, and a learner queue: a FIFO replay buffer of
    whole unrolls, room for a batch and a round of every worker's unrolls.

    Args:
        cfg: the recipe's config.
        spec: the environment's spaces.

    Returns:
        Each service's options, by component.
    """
    return {
        "collector": {"num_envs": cfg.num_envs, "frames_per_batch": cfg.frames_per_batch,
                      "total_frames": cfg.total_frames, "sync": False, "prefetch": cfg.prefetch},
        "replay": {"capacity": cfg.batch_size + cfg.num_envs, "sampler": "fifo", "batch_size": cfg.batch_size},
    }


RECIPE = Recipe(name="impala", config=IMPALAConfig, make_policy=make_policy, services=services, run=run)
