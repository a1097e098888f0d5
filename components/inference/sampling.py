"""Sampling seeds that travel with requests, so what a policy samples for a row does not depend on batching.

A collector worker writes one ``sample_seed`` (int64) per environment and step into each policy request, from a
stream of its own per environment (keyed by the env's seed, see `env_streams`). A stochastic policy that
draws its noise from those seeds (`uniform`) samples the same action for an environment's step whichever
requests it was batched with, in whichever placement and process, so a seeded run learns the same everywhere.
A row without a seed is sampled however the policy likes (usually torch's global generator, where it lives).

The numbers come from SplitMix64 on int64 tensors (two's-complement wrap-around): counter-based, so no generator
state has to live anywhere, and vectorized over the batch.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np
import torch

SAMPLE_SEED = "sample_seed"
"""The request key of the per-row sampling seed (int64, the request's batch shape)."""

_GOLDEN = -0x61C8864680B583EB  # 0x9E3779B97F4A7C15 as int64: SplitMix64's increment
_MUL1 = -0x40A7B892E31B1A47  # 0xBF58476D1CE4E5B9
_MUL2 = -0x6B2FB644ECCEEE15  # 0x94D049BB133111EB
_STREAM = 0x5EED5A3D1E  # sets the sampling streams apart from other uses of an env's seed


def _shr(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def mix(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64's finalizer: a well-spread int64 for each int64 of ``z``."""
    z = (z ^ _shr(z, 30)) * _MUL1
    z = (z ^ _shr(z, 27)) * _MUL2
    return z ^ _shr(z, 31)


def env_streams(env_seeds: Iterable[int]) -> torch.Tensor:
    """One sampling stream per environment, keyed by the environment's seed."""
    return mix(torch.tensor(list(env_seeds), dtype=torch.int64) + _STREAM)


def step_seeds(streams: torch.Tensor, first: int, count: int = 1) -> torch.Tensor:
    """The ``sample_seed`` of each environment of ``streams`` at steps ``first``... ``first + count - 1``: shape
    ``(count, num_envs)``, all at once (a rollout's seeds cost one call)."""
    steps = torch.arange(first + 1, first + count + 1, dtype=torch.int64).unsqueeze(-1)
    return mix(streams + steps * _GOLDEN)


def _mix_np(z: np.ndarray) -> np.ndarray:
    """`mix` on uint64 arrays (the same bits: numpy's uint64 arithmetic wraps as int64's does)."""
    z = (z ^ (z >> _U30)) * _U_MUL1
    z = (z ^ (z >> _U27)) * _U_MUL2
    return z ^ (z >> _U31)


_U_GOLDEN, _U_MUL1, _U_MUL2 = (np.uint64(c & (2 ** 64 - 1)) for c in (_GOLDEN, _MUL1, _MUL2))
_U27, _U30, _U31 = np.uint64(27), np.uint64(30), np.uint64(31)


def uniform(seed: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` uniform float64 numbers in ``(0, 1)`` per seed: shape ``seed.shape + (n,)``.

    CPU seeds are mixed in numpy (a few times faster on a policy call's few rows, bit for bit the same numbers)."""
    if seed.device.type == "cpu":
        s = seed.numpy().view(np.uint64)
        z = _mix_np(s + _U_GOLDEN)[..., None] if n == 1 else \
            _mix_np(s[..., None] + np.arange(1, n + 1, dtype=np.uint64) * _U_GOLDEN)
        return torch.from_numpy((z.view(np.int64) >> 11).astype(np.float64) * 2.0 ** -53 + (0.5 + 2.0 ** -54))
    return _uniform_torch(seed, n)


def _uniform_torch(seed: torch.Tensor, n: int) -> torch.Tensor:
    if n == 1:  # the common case (one draw per discrete action) without the broadcast
        z = mix(seed + _GOLDEN).unsqueeze(-1)
    else:
        z = mix(seed.unsqueeze(-1) + torch.arange(1, n + 1, device=seed.device) * _GOLDEN)
    # the top 53 bits, signed, scaled into [-1/2, 1/2) and moved to the open interval (0, 1)
    return (z >> 11).double() * 2.0 ** -53 + (0.5 + 2.0 ** -54)


def random_seeds(shape: torch.Size) -> torch.Tensor:
    """Seeds for rows that came without one, from torch's global generator of the calling process."""
    return torch.randint(-(2 ** 63), 2 ** 63 - 1, tuple(shape), dtype=torch.int64)


def with_seed_leaf(layout):
    """``layout`` (a `Layout` or a representative TensorDict) with a ``sample_seed`` leaf
    (int64 of its batch shape, on its first leaf's device), so fixed-layout transports carry the seeds."""
    from transports.layout import Layout, LeafSpec

    if not isinstance(layout, Layout):
        layout = Layout.from_tensordict(layout)
    if (SAMPLE_SEED,) in layout.keys:
        return layout
    device = layout.leaves[0].device if layout.leaves else "cpu"
    leaf = LeafSpec((SAMPLE_SEED,), tuple(layout.batch_size), torch.int64, device)
    return Layout(tuple(sorted((*layout.leaves, leaf), key=lambda spec: spec.key)), layout.batch_size)
