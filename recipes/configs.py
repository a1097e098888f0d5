"""Every recipe's config dataclass: plain data that imports nothing heavy.

``launcher/schema.py`` registers these with Hydra's ConfigStore, so composing a config never imports torch;
each recipe (``recipes/<name>.py``) imports its config from here and reads on with its networks and loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class PPOConfig:
    """PPO hyperparameters.

    Attributes:
        num_envs: parallel environments in the collector's vector env.
        num_steps: steps per environment per batch (a batch holds ``num_envs * num_steps`` frames).
        total_frames: frame budget; training stops earlier once ``target_return`` is reached.
        target_return: stop when the mean return of the last ``window`` episodes reaches this (``None``: never).
        window: how many recent episodes the mean return covers.
        lr: Adam learning rate.
        anneal_lr: decay the learning rate linearly to 0 over ``total_frames``.
        gamma: discount factor.
        gae_lambda: GAE lambda.
        num_minibatches: minibatches per epoch.
        update_epochs: passes over each batch.
        clip_coef: PPO ratio clipping.
        ent_coef: entropy bonus coefficient.
        vf_coef: value loss coefficient.
        max_grad_norm: gradient norm clipping.
        hidden: width of the two hidden layers of the built-in actor and critic.
        network: your own network instead of the built-in MLP: a node whose ``_target_`` names a callable
            ``(in_features: int, out_features: int, **kwargs) -> nn.Module``, called with the node's other keys
            once for the actor (``out_features``: actions) and once for the critic (``out_features`` = 1), where
            the policy is built. ``None``: the built-in MLP of ``hidden`` units.
        norm_adv: normalise advantages within each minibatch.
        reward_scale: rewards are multiplied by this before advantage estimation.
        init_log_std: initial log standard deviation of continuous actions.
    """

    num_envs: int = 16
    num_steps: int = 32
    total_frames: int = 200_000
    target_return: Optional[float] = 475.0
    window: int = 20
    lr: float = 5e-3
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    clip_coef: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden: int = 64
    network: Optional[Any] = None  # a _target_ node (Any: a None Dict field cannot be set from the CLI)
    norm_adv: bool = True
    reward_scale: float = 1.0
    init_log_std: float = 0.0

    @property
    def frames_per_batch(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.frames_per_batch // self.num_minibatches


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
        hidden: width of the two hidden layers of the built-in Q-network.
        network: your own Q-network instead of the built-in MLP: a node whose ``_target_`` names a callable
            ``(in_features: int, out_features: int, **kwargs) -> nn.Module`` (``out_features``: actions), called
            with the node's other keys for the online and the target network. ``None``: the built-in MLP.
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
    network: Optional[Any] = None  # a _target_ node (Any: a None Dict field cannot be set from the CLI)
    max_grad_norm: float = 10.0

    @property
    def frames_per_batch(self) -> int:
        return self.num_envs * self.num_steps
