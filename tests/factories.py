"""Small, real building blocks the tests share: a policy, env factories and one owner per component."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from components.collectors import Collector, CollectorConfig
from components.envs import make_vector_env
from components.inference import InferenceServer, InferenceServerConfig
from components.logger import CSVLogger, Logger, LoggerConfig, TensorBoardLogger
from components.replay import ReplayBuffer, ReplayConfig
from components.weight_sync import WeightSync, WeightSyncConfig


class CartPolePolicy(nn.Module):
    """A real (tiny) CartPole policy: ``observation`` -> ``action`` (sampled), ``logits``."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Linear(4, 2)

    def forward(self, td):
        logits = self.net(td["observation"])
        td["logits"] = logits
        td["action"] = torch.distributions.Categorical(logits=logits).sample()
        return td


def cartpole_envs(num_envs: int = 4):
    return partial(make_vector_env, "CartPole-v1", num_envs)


def owner_factories(tmp_path, placement: str = "direct") -> dict:
    """One not-yet-started owner factory per component, all at ``placement``."""
    return {
        "inference": lambda: InferenceServer(InferenceServerConfig(placement=placement), policy_factory=CartPolePolicy),
        "replay": lambda: ReplayBuffer(ReplayConfig(capacity=64, batch_size=8, placement=placement)),
        "logger/csv": lambda: Logger(LoggerConfig(placement=placement), backend=CSVLogger(str(tmp_path / "csv"))),
        "logger/tensorboard": lambda: Logger(LoggerConfig(placement=placement),
                                             backend=TensorBoardLogger(str(tmp_path / "tb"))),
        "weight_sync": lambda: WeightSync(WeightSyncConfig(placement=placement), template=CartPolePolicy()),
        "collector": lambda: Collector(CollectorConfig(frames_per_batch=8, total_frames=16, placement=placement),
                                       create_env_fn=cartpole_envs(2), policy=_direct_policy()),
    }


class LocalPolicy:
    """A picklable callable policy that runs its own copy of the network (no server)."""

    def __init__(self):
        self.policy = CartPolePolicy()

    @torch.no_grad()
    def __call__(self, td):
        return self.policy(td)


def _direct_policy():
    return LocalPolicy()


SLOW_PASS_S = 0.2
"""How long :class:`EchoPolicy` takes over a request marked slow."""


class EchoPolicy(nn.Module):
    """A real policy for server tests: ``action = 2 * observation``; records which pass served each request.

    Markers in the observation: a value below -1000 raises ``ValueError`` (a failing batch); a value above
    1e6 blocks for 30 s (a hung server, to be killed; ``hang_marker``, a file path, is created when it starts
    blocking, so a test can wait for that); a value in [1e5, 1e6] takes :data:`SLOW_PASS_S` (a slow answer, not a
    hung one); ``delay`` slows every pass down (to force batching).
    """

    def __init__(self, delay: float = 0.0, hang_marker: str | None = None):
        super().__init__()
        self.delay = delay
        self.hang_marker = hang_marker
        self.scale = nn.Parameter(torch.tensor(2.0))
        self.calls = 0

    def forward(self, td):
        import time

        obs = td["observation"]
        if (obs < -1000).any():
            raise ValueError("negative marker in the batch")
        if (obs > 1e6).any():
            if self.hang_marker:
                open(self.hang_marker, "w").close()
            time.sleep(30)
        elif (obs >= 1e5).any():
            time.sleep(SLOW_PASS_S)
        if self.delay:
            time.sleep(self.delay)
        self.calls += 1
        td["action"] = obs * self.scale
        td["served"] = torch.full(td.batch_size, self.calls, dtype=torch.long)
        return td


def echo_factory(delay: float = 0.0, hang_marker: str | None = None):
    return EchoPolicy(delay, hang_marker)


def failing_factory():
    raise RuntimeError("cannot build this policy here")


class CrashAfter:
    """Builds CartPole envs whose step raises after ``steps`` steps (a worker crash to surface)."""

    def __init__(self, steps: int):
        self.steps = steps

    def __call__(self):
        import gymnasium as gym

        steps = self.steps

        class Crash(gym.Wrapper):
            count = 0

            def step(self, action):
                Crash.count += 1
                if Crash.count > steps:
                    raise RuntimeError("the environment simulator crashed")
                return self.env.step(action)

        return Crash(gym.make("CartPole-v1"))


def crashing_envs(num_envs: int = 2, steps: int = 5):
    import gymnasium as gym

    return gym.vector.SyncVectorEnv([CrashAfter(steps)] * num_envs, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def ppo_cartpole_policy():
    """The PPO recipe's CartPole policy, built from seed 0 (the same weights wherever it is built); it samples
    from each request's seeds, so its answers depend only on the request."""
    from components.envs import spec_of
    from recipes.configs import PPOConfig
    from recipes.ppo import make_policy

    with torch.random.fork_rng():
        torch.manual_seed(0)
        return make_policy(PPOConfig(), spec_of("CartPole-v1"))
