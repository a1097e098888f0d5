"""The actor-critic both PPO and IMPALA train: the stochastic actor, the behaviour policy the inference server owns,
and the learner that trains actor and critic together (their networks built from `recipes.networks`, or the
module ``network`` names by ``_target_``).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributions import Categorical, Normal

from components.inference.modes import acts_deterministically
from components.inference.sampling import SAMPLE_SEED, uniform
from components.targets import instantiate_target

from .configs import IMPALAConfig, PPOConfig
from .networks import RunningNorm, encoder, flat_features, layer
ActorCriticConfig = PPOConfig | IMPALAConfig
"""The configs whose fields the networks read (``hidden``, ``network``, ``encoder``, ``init_log_std``,
``normalize_observations``)."""


def _mlp(inp: int, out: int, hidden: int, out_std: float) -> nn.Sequential:
    return nn.Sequential(layer(nn.Linear(inp, hidden)), nn.Tanh(), layer(nn.Linear(hidden, hidden)), nn.Tanh(),
                         layer(nn.Linear(hidden, out), out_std))


def _network(cfg: ActorCriticConfig, spec, out: int, out_std: float, encoder: nn.Module | None = None) -> nn.Module:
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
    encoder (images), `encoder` is the trunk the critic shares.

    Args:
        cfg: the recipe's config (its network fields).
        spec: the environment's spaces (`components.envs.EnvSpec`).
    """

    def __init__(self, cfg: ActorCriticConfig, spec):
        super().__init__()
        self.discrete = spec.discrete
        self.encoder = None if cfg.network is not None else encoder(cfg.encoder, spec.observation_shape,
                                                                     spec.observation_scale, spec.encoder)
        if self.discrete:
            self.net = _network(cfg, spec, spec.n_actions, 0.01, self.encoder)
        else:
            act_dim = math.prod(spec.action_shape)
            self.net = _network(cfg, spec, act_dim, 0.01, self.encoder)
            self.log_std = nn.Parameter(torch.full((act_dim,), cfg.init_log_std))
        self.norm = (RunningNorm(spec.observation_shape, scale=spec.observation_scale)
                     if cfg.normalize_observations else None)
        if self.norm is not None:  # in front of the whole network: what the policy holds, weight sync ships
            self.net = nn.Sequential(self.norm, self.net)

    def dist(self, obs: torch.Tensor):
        """The action distribution at ``obs``."""
        return self.dist_of(self.net(obs))

    def dist_of(self, out: torch.Tensor):
        """The action distribution of the network's outputs, in single precision (the outputs of a pass under bf16
        autocast, ``recipe.amp``, are cast: log-probabilities and entropies are not computed in bf16)."""
        out = out.float()
        if self.discrete:
            return Categorical(logits=out, validate_args=False)  # the network's outputs are valid logits
        return Normal(out, self.log_std.exp().expand_as(out), validate_args=False)

    def act(self, obs: torch.Tensor, seed: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(action, log-probability)`` per row, drawn as `sample` does (from ``seed`` where given); for
        discrete actions straight from the log-softmax, without building a distribution (the collection hot path).
        In a deterministic interaction mode (`components.inference.modes`): the most likely action, the mean."""
        greedy = acts_deterministically()
        if not self.discrete:
            dist = self.dist(obs)
            action = dist.mean if greedy else dist.sample() if seed is None else self.sample(dist, seed)
            return action, self.log_prob(dist, action)
        log_p = self.net(obs).log_softmax(-1)
        if greedy:
            action = log_p.argmax(-1)
        elif seed is None:
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
        """The log-probability of ``action`` per row (summed over a continuous action's dimensions)."""
        lp = dist.log_prob(action)
        return lp if self.discrete else lp.sum(-1)

    def entropy(self, dist) -> torch.Tensor:
        """The entropy of ``dist`` per row (summed over a continuous action's dimensions)."""
        ent = dist.entropy()
        return ent if self.discrete else ent.sum(-1)


class BehaviourPolicy(nn.Module):
    """The TensorDict policy the inference server owns: ``observation`` -> ``action``, ``sample_log_prob``.

    Args:
        actor: the actor it acts with.
    """

    def __init__(self, actor: Actor):
        super().__init__()
        self.actor = actor

    def forward(self, td):
        """Set ``action`` and ``sample_log_prob`` of each row of ``td`` from its ``observation``."""
        # collectors send one seed per env and step: the same draw in every placement
        action, log_prob = self.actor.act(td.get("observation"), td.get(SAMPLE_SEED, None))
        td.set("action", action)
        td.set("sample_log_prob", log_prob)
        return td


def make_policy(cfg: ActorCriticConfig, spec) -> BehaviourPolicy:
    """The behaviour policy for the inference server (same structure as the learner's ``policy``).

    Args:
        cfg: the recipe's config.
        spec: the environment's spaces.
    """
    return BehaviourPolicy(Actor(cfg, spec))


class Learner(nn.Module):
    """Actor (shared structure with the behaviour policy) and critic, trained together.

    Attributes:
        reuses_values: advantage estimation reads the value of each next observation from the next step's value
            where they are the same observation (with a CNN, where a forward pass costs; the MLP's path values
            every next observation).

    Args:
        cfg: the recipe's config.
        spec: the environment's spaces.
    """

    def __init__(self, cfg: ActorCriticConfig, spec):
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
        """The critic's value of each row of ``obs``, in single precision (cast from bf16 under autocast)."""
        return self.critic(obs).squeeze(-1).float()

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
        return actor.dist_of(head(features)), value_head(features).squeeze(-1).float()


def fresh_steps(done: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The steps of a ``[time, env]`` batch whose next observation is not the next step's observation, as ``(time,
    env)`` index tensors: the batch's last step, and where an episode ended (its final observation, which a
    cut-short episode bootstraps from). A learner that `reuses_values` values only these apart.
    Read where ``done`` is, which should be the host (on a device, reading which steps they are waits for it).

    Args:
        done: ``[time, env]``, whether each step ended its episode.
    """
    fresh = done.clone()
    fresh[-1] = True
    return fresh.nonzero(as_tuple=True)
