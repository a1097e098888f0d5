"""The replay buffer service: storage, samplers and policy-age filtering behind ``extend`` / ``sample``."""

from .buffer import ReplayBuffer
from .client import ReplayClient
from .filters import PolicyAgeFilter
from .samplers import SAMPLERS

__all__ = ["PolicyAgeFilter", "ReplayBuffer", "ReplayClient", "SAMPLERS"]
