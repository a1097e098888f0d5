"""Every recipe's config dataclass: plain data that imports nothing heavy.

``launcher/schema.py`` registers these with Hydra's ConfigStore, so composing a config never imports torch;
each recipe (``recipes/<name>.py``) imports its config from here and reads on with its networks and loop.
A field declares the range it accepts with `bounded` (the one mechanism every config of the
project uses), and ``rules()`` states what must hold between fields (a minibatch count that divides the batch): the
launcher checks every composed config against both before anything starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from components.config import bounded, device_option, one_of

ENCODERS = ("auto", "mlp", "nature_cnn", "impala_cnn", "minatar_cnn")
"""The built-in encoders a recipe's ``encoder`` names (`recipes.networks`)."""


@dataclass
class RecipeConfig:
    """The fields every recipe's config holds; each recipe's config extends it (and may change a default).

    Attributes:
        num_envs: parallel environments (over every collector worker).
        total_frames: frame budget; training stops earlier once ``target_return`` is reached.
        target_return: stop when the mean return of the last ``window`` episodes reaches this (``None``: never).
        window: how many recent episodes the mean return covers.
        lr: Adam learning rate.
        gamma: discount factor.
        hidden: width of the two hidden layers of the built-in MLP.
        network: your own network instead of the built-in MLP: a node whose ``_target_`` names a callable
            ``(in_features: int, out_features: int, **kwargs) -> nn.Module``, called with the node's other keys where
            the policy is built (each recipe says for which of its networks). ``None``: the built-in MLP of
            ``hidden`` units.
        max_grad_norm: gradient norm clipping.
        encoder: the built-in network's encoder (`recipes.networks`): ``auto`` picks the MLP for flat
            observations, a CNN for images (``nature_cnn`` for Atari frames, ``minatar_cnn`` for MinAtar grids,
            ``impala_cnn`` for frames too small for the Nature CNN). Ignored when ``network`` is set.
        clip_rewards: learn from the sign of each reward (Atari's convention); episode returns still count the
            game's own rewards.
        device: where the learner trains (``cpu``, ``cuda``, ``cuda:1``); a CUDA device the machine that runs the
            plan lacks is refused before anything starts (a dry run plans it anywhere). The inference server's device
            is ``components.inference.policy_device``.
        amp: the learner's update in mixed precision: its forward pass and loss under bf16 autocast (the network's
            products in bf16; log-probabilities, values and losses in float32), the backward pass and the optimizer
            step outside it (weights, gradients and optimizer state stay float32). Meant for a CUDA learner; one
            without bf16 (before Ampere) is refused when the recipe starts. A CPU runs it too.
        compile: ``torch.compile`` the learner's update step (its forward pass and loss, at the fixed shapes of a
            minibatch, ``dynamic=False``; IMPALA's in two parts, the values of the steps where episodes ended
            between them); the backward pass runs compiled too, the optimizer step does not. The first updates wait
            for the compilation (seconds to tens of seconds on a few CPU cores). What is learned is that of the
            uncompiled update to within floating-point rounding.
    """

    num_envs: int = bounded(16, ge=1)
    total_frames: int = bounded(200_000, ge=1)
    target_return: Optional[float] = 475.0
    window: int = bounded(20, ge=1)
    lr: float = bounded(5e-3, gt=0)
    gamma: float = bounded(0.99, ge=0, le=1)
    hidden: int = bounded(64, ge=1)
    network: Optional[Any] = None  # a _target_ node (Any: a None Dict field cannot be set from the CLI)
    max_grad_norm: float = bounded(0.5, gt=0)
    encoder: str = one_of("auto", ENCODERS)
    clip_rewards: bool = False
    device: str = device_option("cpu")
    amp: bool = False
    compile: bool = False


@dataclass
class PPOConfig(RecipeConfig):
    """PPO hyperparameters, beside `RecipeConfig`'s (whose ``network`` is called once for the actor,
    ``out_features``: actions or action dimensions, and once for the critic, ``out_features`` = 1; with a CNN
    ``encoder`` the actor and the critic share it: one trunk, two heads).

    Attributes:
        num_steps: steps per environment per batch (a batch holds ``num_envs * num_steps`` frames).
        anneal_lr: decay the learning rate linearly to 0 over ``total_frames``.
        gae_lambda: GAE lambda.
        num_minibatches: minibatches per epoch.
        update_epochs: passes over each batch.
        clip_coef: PPO ratio clipping.
        ent_coef: entropy bonus coefficient.
        vf_coef: value loss coefficient.
        norm_adv: normalise advantages within each minibatch.
        reward_scale: rewards are multiplied by this before advantage estimation.
        init_log_std: initial log standard deviation of continuous actions.
        clip_vloss: clip the value loss around the values the batch was collected with, by ``clip_coef``.
        normalize_observations: standardise observations by running statistics the policy holds and weight sync
            ships (`RunningNorm`), as CleanRL's ``NormalizeObservation`` does per worker.
        normalize_rewards: scale rewards by the running standard deviation of each env's discounted return, in the
            learner (CleanRL's ``NormalizeReward``); episode returns still count the env's own rewards.
    """

    num_steps: int = bounded(32, ge=1)
    anneal_lr: bool = True
    gae_lambda: float = bounded(0.95, ge=0, le=1)
    num_minibatches: int = bounded(4, ge=1)
    update_epochs: int = bounded(4, ge=1)
    clip_coef: float = bounded(0.2, gt=0)
    ent_coef: float = bounded(0.01, ge=0)
    vf_coef: float = bounded(0.5, ge=0)
    norm_adv: bool = True
    reward_scale: float = bounded(1.0, gt=0)
    init_log_std: float = 0.0
    clip_vloss: bool = False
    normalize_observations: bool = False
    normalize_rewards: bool = False

    replay_keys: ClassVar[tuple[str, ...]] = ("num_envs", "num_steps")
    """The settings that size its replay buffer (one batch): named where the buffer does not fit the machine's memory
    (`launcher.footprint`)."""

    @property
    def frames_per_batch(self) -> int:
        """Frames per collected batch: ``num_envs * num_steps``."""
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        """Rows per minibatch: the batch over ``num_minibatches``."""
        return self.frames_per_batch // self.num_minibatches

    def rules(self) -> tuple[tuple[str, bool, str], ...]:
        """What must hold between fields (each in range), as ``(field to blame, holds, what is wrong)``."""
        return (("num_minibatches", self.frames_per_batch % self.num_minibatches == 0,
                 f"num_envs * num_steps = {self.frames_per_batch} must be divisible by "
                 f"num_minibatches={self.num_minibatches}"),)


@dataclass
class DQNConfig(RecipeConfig):
    """DQN hyperparameters, beside `RecipeConfig`'s (whose ``network`` is the Q-network, ``out_features``:
    actions, called for the online and the target network; 8 envs, lr 1e-3, 128 hidden units and gradients clipped
    at 10 by default).

    Attributes:
        num_steps: steps per environment per collected batch.
        buffer_size: replay capacity (transitions).
        batch_size: minibatch size.
        learning_starts: frames collected before learning begins.
        updates_per_batch: gradient steps after each collected batch.
        n_step: steps summed into each TD target (1: one-step Q-learning); an episode's end cuts the sum short.
        tau: soft target-network update rate per gradient step (1.0: hard copy every ``target_every`` steps).
        target_every: gradient steps between target updates.
        eps_start: initial exploration rate.
        eps_end: final exploration rate.
        eps_frames: frames over which epsilon decays linearly.
        alpha: prioritized replay exponent.
        beta: importance-sampling exponent.
        max_policy_lag: transitions from behaviour policies more than this many pushes old are not sampled.
        replay_frames: store observation stacks in replay one frame at a time (``components.replay.frames``):
            ``None`` does so for stacks of pixel frames (uint8 ``[stack, height, width]``, as ``env=atari``
            gives), about 1/8 of the memory of whole stacks.
    """

    num_envs: int = bounded(8, ge=1)
    lr: float = bounded(1e-3, gt=0)
    hidden: int = bounded(128, ge=1)
    max_grad_norm: float = bounded(10.0, gt=0)
    num_steps: int = bounded(8, ge=1)
    buffer_size: int = bounded(50_000, ge=1)
    batch_size: int = bounded(128, ge=1)
    learning_starts: int = bounded(1_000, ge=0)
    updates_per_batch: int = bounded(2, ge=1)
    n_step: int = bounded(20, ge=1)
    tau: float = bounded(0.01, gt=0, le=1)
    target_every: int = bounded(1, ge=1)
    eps_start: float = bounded(1.0, ge=0, le=1)
    eps_end: float = bounded(0.005, ge=0, le=1)
    eps_frames: int = bounded(10_000, ge=1)
    alpha: float = bounded(0.6, ge=0)
    beta: float = bounded(0.4, ge=0, le=1)
    max_policy_lag: int = bounded(2_000, ge=0)
    replay_frames: Optional[bool] = None

    replay_keys: ClassVar[tuple[str, ...]] = ("buffer_size",)
    """The setting that sizes its replay buffer, as `PPOConfig.replay_keys`."""

    @property
    def frames_per_batch(self) -> int:
        """Frames per collected batch: ``num_envs * num_steps``."""
        return self.num_envs * self.num_steps


@dataclass
class IMPALAConfig(RecipeConfig):
    """IMPALA hyperparameters, beside `RecipeConfig`'s (its ``network`` as `PPOConfig`'s; 300,000
    frames by default): an actor-critic learning from unrolls as they arrive, corrected for the lag of the
    policy that acted them by V-trace (`recipes.vtrace`); with ``clip_coef`` set, APPO (Sample Factory's
    asynchronous PPO: the clipped surrogate over V-trace's targets).

    Attributes:
        num_envs: environments over every collector worker.
        unroll_length: steps per environment per unroll (``T``): what a worker hands over at once is one unroll of
            each of its envs, and V-trace runs over each unroll.
        batch_size: unrolls per learner update (``batch_size * unroll_length`` frames); an update starts as soon as
            this many unrolls wait in the learner queue, whichever workers they came from.
        anneal_lr: decay the learning rate linearly to 0 over ``total_frames``.
        rho_bar: clip of the importance ratios in V-trace's value targets.
        c_bar: clip of V-trace's traces (how far a correction reaches back).
        pg_rho_bar: clip of the ratios weighting the policy-gradient advantages.
        vtrace_lambda: the traces' discount (1: the paper's V-trace).
        clip_coef: ``None``: IMPALA's policy gradient (advantages times ``log pi``); a number: APPO's clipped
            surrogate on the ratio ``pi / mu``, clipped to ``1 +/- clip_coef``.
        update_epochs: passes over each learner batch (V-trace recomputed with the current weights each time).
        num_minibatches: minibatches (of whole unrolls) per pass.
        norm_adv: normalise advantages within each minibatch.
        ent_coef: entropy bonus coefficient.
        vf_coef: value loss coefficient.
        push_every: learner updates between weight pushes to the actors' policy.
        max_policy_lag: unrolls whose oldest step was acted by a policy more than this many versions behind the
            learner's are dropped before learning (counted in ``lag/dropped``); ``None``: V-trace corrects any lag.
        prefetch: unrolls of its envs each collector worker may collect ahead of the learner
            (``components.collector.prefetch``). 1: a worker collects its next unroll while the learner trains; an
            update that takes ``k`` rounds of every env's unroll (``batch_size = k * num_envs``) finds them all
            waiting with ``k``, at up to ``k - 1`` more versions of lag.
        init_log_std: initial log standard deviation of continuous actions.
        normalize_observations: standardise observations by running statistics the policy holds, as
            `PPOConfig`'s.
    """

    total_frames: int = bounded(300_000, ge=1)
    unroll_length: int = bounded(32, ge=1)
    batch_size: int = bounded(16, ge=1)
    anneal_lr: bool = True
    rho_bar: float = bounded(1.0, gt=0)
    c_bar: float = bounded(1.0, gt=0)
    pg_rho_bar: float = bounded(1.0, gt=0)
    vtrace_lambda: float = bounded(1.0, ge=0, le=1)
    clip_coef: Optional[float] = bounded(None, gt=0)
    update_epochs: int = bounded(1, ge=1)
    num_minibatches: int = bounded(1, ge=1)
    norm_adv: bool = False
    ent_coef: float = bounded(0.01, ge=0)
    vf_coef: float = bounded(0.5, ge=0)
    push_every: int = bounded(1, ge=1)
    max_policy_lag: Optional[int] = bounded(10, ge=0)
    prefetch: int = bounded(1, ge=1)
    init_log_std: float = 0.0
    normalize_observations: bool = False

    collects_while_learning: ClassVar[bool] = True
    """Its collector runs ``sync: false`` (``recipes.impala.services``): known before torch loads, where the launcher
    chooses how torch's threads wait."""
    replay_keys: ClassVar[tuple[str, ...]] = ("batch_size", "num_envs", "unroll_length")
    """The settings that size its learner queue (``batch_size + num_envs`` unrolls), as
    `PPOConfig.replay_keys`."""

    @property
    def variant(self) -> str:
        """What the run is called in its summary and plot: ``appo`` with PPO's clipped surrogate, else ``impala``."""
        return "impala" if self.clip_coef is None else "appo"

    @property
    def frames_per_batch(self) -> int:
        """Frames the collector hands over per round of every worker: one unroll of each env."""
        return self.num_envs * self.unroll_length

    @property
    def replay_row_steps(self) -> int:
        """Env steps in one row of its replay buffer (a learner queue of whole unrolls), where the launcher sizes the
        buffer before anything starts (`launcher.footprint`); a recipe that says nothing stores one per row."""
        return self.unroll_length

    def rules(self) -> tuple[tuple[str, bool, str], ...]:
        """What must hold between fields (each in range), as ``(field to blame, holds, what is wrong)``."""
        return (("num_minibatches", self.batch_size % self.num_minibatches == 0,
                 f"batch_size={self.batch_size} unrolls must be divisible by num_minibatches={self.num_minibatches}"),)
