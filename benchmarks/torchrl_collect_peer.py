"""TorchRL's multi-process collectors, measured as ``benchmarks/collect.py`` measures ours; run with TorchRL's python.

TorchRL 0.14.1 needs tensordict<0.15, so it lives in its own virtual environment and this script stands alone: it
imports torch, tensordict, torchrl, gymnasium and the standard library, nothing from this project.
``benchmarks/collect.py --peer-python PATH`` runs it and prints its rows beside ours; it can also run alone:

    python -m venv /tmp/trl && /tmp/trl/bin/pip install torch==2.13.0 torchrl==0.14.1
    /tmp/trl/bin/python benchmarks/torchrl_collect_peer.py --frames 16:16384 64:32768 --rounds 3

Not yet run on the machine it was written on (no TorchRL environment there): the first run should be read with that
in mind; whatever fails is reported under ``skipped`` and the other rows still run.

For every total env count N (even) and round, it measures:

* ``MultiSyncCollector x2`` and ``MultiAsyncCollector x2``: ``create_env_fn=[make_env] * 2`` where each worker's env is
  N/2 CartPoles in one gymnasium ``SyncVectorEnv`` wrapped by ``GymWrapper`` (falling back to a ``SerialEnv`` of
  ``GymEnv`` if TorchRL refuses the vector env; the JSON says which); ``frames_per_batch=N x num_steps`` (TorchRL splits
  it over the workers), ``total_frames=-1``; the policy is the PPO actor of collect.py (4-64-64-2 MLP, tanh, the same
  weights, loaded from ``--weights``) sampling from a ``Categorical``, with its log-probability, as a
  ``TensorDictModule``;
* ``raw sync``: the same loop as collect.py's raw gymnasium sync row, in this interpreter.

Each row is started, warmed up (``--warmup`` batches), measured over whole batches until ``--frames`` frames or
``--cap`` seconds, and shut down, exactly as collect.py does; rows are interleaved within a round.

Prints one JSON object on stdout: ``{"torchrl", "tensordict", "env", "results": [{"row", "envs", "envs_label", "fps":
[per round], "start_s"}], "raw": [{"envs", "fps"}], "skipped": {row: reason}}``. Progress goes to stderr, and so does
anything a library or a child process writes to stdout.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import statistics
import sys
import time
import traceback

import torch
from torch import nn


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- the policy
def make_net() -> nn.Sequential:
    """The PPO recipe's actor network for CartPole (recipes/ppo.py ``_mlp(4, 2, 64, 0.01)``), weights loaded later."""
    return nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))


class Actor(nn.Module):
    """observation -> action sampled from a Categorical, and its log-probability (as PPO's behaviour policy)."""

    def __init__(self, weights: str):
        super().__init__()
        self.net = make_net()
        self.net.load_state_dict(torch.load(weights, weights_only=True))

    def forward(self, observation):
        dist = torch.distributions.Categorical(logits=self.net(observation))
        action = dist.sample()
        return action, dist.log_prob(action)


def make_policy(weights: str):
    from tensordict.nn import TensorDictModule

    return TensorDictModule(Actor(weights), in_keys=["observation"], out_keys=["action", "sample_log_prob"])


# ---------------------------------------------------------------------------------------------- envs
def vector_env(n: int):
    """N CartPoles in one gymnasium SyncVectorEnv, wrapped by TorchRL (integer actions)."""
    import gymnasium as gym
    from torchrl.envs import GymWrapper

    # TorchRL takes same-step (or disabled) autoreset only, as our collectors' envs step
    return GymWrapper(gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync",
                                   vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}),
                      categorical_action_encoding=True)


def serial_env(n: int):
    """The fallback: a SerialEnv of N GymEnv CartPoles (integer actions)."""
    from torchrl.envs import GymEnv, SerialEnv

    return SerialEnv(n, functools.partial(GymEnv, "CartPole-v1", categorical_action_encoding=True))


ENVS = {"GymWrapper(gymnasium SyncVectorEnv)": vector_env, "SerialEnv(GymEnv)": serial_env}


def choose_env(n: int, weights: str) -> str:
    """The first env kind of `ENVS` that TorchRL builds and the policy steps (a short rollout of N/2 envs)."""
    errors = []
    for name, make in ENVS.items():
        try:
            env = make(n)
            try:
                td = env.rollout(3, make_policy(weights))
                if td.batch_size[0] != n:
                    raise AssertionError(f"rollout batch {tuple(td.batch_size)}, expected ({n}, 3)")
            finally:
                env.close()
            return name
        except Exception as exc:  # noqa: BLE001 - the next kind is tried; all failing is raised below
            errors.append(f"{name}: {exc!r}")
            log(traceback.format_exc())
    raise RuntimeError("no env kind works: " + "; ".join(errors))


# ---------------------------------------------------------------------------------------------- measuring
def drive(next_batch, warmup: int, target: int, cap_s: float) -> tuple[int, float]:
    """collect.py's measurement: warm up, then whole batches until ``target`` frames or ``cap_s`` seconds."""
    warm_until = time.perf_counter() + cap_s
    for _ in range(warmup):
        next_batch()
        if time.perf_counter() > warm_until:
            break
    frames, t0 = 0, time.perf_counter()
    while frames < target:
        frames += next_batch()
        if time.perf_counter() - t0 >= cap_s:
            break
    return frames, time.perf_counter() - t0


def measure_collector(kind: str, env_kind: str, n: int, args) -> tuple[float, float]:
    """(frames/s, start seconds) of one round of a TorchRL multi-process collector with 2 workers of N/2 envs."""
    from torchrl.collectors import MultiAsyncCollector, MultiSyncCollector

    cls = MultiSyncCollector if kind == "sync" else MultiAsyncCollector
    t0 = time.perf_counter()
    make_env = functools.partial(ENVS[env_kind], n // 2)
    collector = cls(create_env_fn=[make_env, make_env], policy=make_policy(args.weights),
                    frames_per_batch=n * args.num_steps, total_frames=-1)
    try:
        start_s = time.perf_counter() - t0
        batches = iter(collector)
        frames, seconds = drive(lambda: next(batches).numel(), args.warmup, args.frames[n], args.cap)
    finally:
        collector.shutdown()
    return frames / seconds, start_s


def measure_raw(n: int, args) -> float:
    """collect.py's raw gymnasium sync loop, in this interpreter."""
    import gymnasium as gym

    actor = Actor(args.weights)
    env = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="sync",
                       vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    try:
        obs, _ = env.reset(seed=list(range(n)))

        def batch() -> int:
            nonlocal obs
            with torch.no_grad():
                for _ in range(args.num_steps):
                    dist = torch.distributions.Categorical(logits=actor.net(torch.as_tensor(obs)))
                    obs, _, _, _, _ = env.step(dist.sample().numpy())
            return n * args.num_steps

        frames, seconds = drive(batch, args.warmup, args.frames[n], args.cap)
    finally:
        env.close()
    return frames / seconds


# ---------------------------------------------------------------------------------------------- main
def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds the try/finally blocks above: collectors are shut down


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", required=True, help="state dict of the actor network (torch.save)")
    parser.add_argument("--frames", nargs="+", required=True, metavar="N:FRAMES",
                        help="total env count and the frames to measure at it, e.g. 16:16384 64:32768")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-steps", type=int, default=32, help="steps per env in one batch")
    parser.add_argument("--warmup", type=int, default=1, help="batches before the clock starts")
    parser.add_argument("--cap", type=float, default=1.0, help="most seconds of measuring per row")
    args = parser.parse_args()
    args.frames = {int(n): int(f) for n, f in (item.split(":") for item in args.frames)}
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # stdout carries the JSON alone: whatever else writes to file descriptor 1 goes to stderr
    json_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    torch.set_num_threads(1)

    import tensordict
    import torchrl

    log(f"torchrl {torchrl.__version__}, tensordict {tensordict.__version__}, torch {torch.__version__}")
    envs = [n for n in args.frames if n % 2 == 0]
    env_kind = choose_env(min(envs) // 2, args.weights)
    log(f"  env: {env_kind}")
    fps: dict = {}
    starts: dict = {}
    raw: dict = {}
    skipped: dict = {}
    rows = [("sync", "MultiSyncCollector x2"), ("async", "MultiAsyncCollector x2")]
    for r in range(args.rounds):
        for n in envs:
            raw.setdefault(n, []).append(measure_raw(n, args))
            log(f"  round {r + 1}/{args.rounds} {n:>3} envs  raw sync {raw[n][-1]:,.0f} frames/s")
            for kind, label in rows[r % 2:] + rows[:r % 2]:
                if label in skipped:
                    continue
                try:
                    value, start_s = measure_collector(kind, env_kind, n, args)
                except Exception as exc:  # noqa: BLE001 - reported in the JSON, the other row still runs
                    skipped[label] = f"failed: {exc!r}"
                    log(traceback.format_exc())
                    continue
                fps.setdefault((label, n), []).append(value)
                starts.setdefault((label, n), []).append(start_s)
                log(f"  round {r + 1}/{args.rounds} {n:>3} envs  torchrl {label} {value:,.0f} frames/s "
                    f"(start {start_s:.2f} s)")
    results = [{"row": label, "envs": n, "envs_label": f"2x{n // 2}", "fps": values,
                "start_s": statistics.median(starts[(label, n)])} for (label, n), values in fps.items()]
    json.dump({"torchrl": torchrl.__version__, "tensordict": tensordict.__version__, "env": env_kind,
               "results": results, "raw": [{"envs": n, "fps": v} for n, v in raw.items()], "skipped": skipped},
              json_out)
    json_out.write("\n")
    json_out.close()


if __name__ == "__main__":
    main()
