"""The behaviour policy run inside each collector worker (``components.collector.local_policy=true``).

Instead of asking an inference server, every worker builds its own copy of the policy where it runs and, before
each forward, copies in the newest weights the learner pushed through weight sync. No request crosses a process
boundary per step, so workers scale with cores the way a raw env loop does; what it costs is a policy (and its
memory) per worker and no batching across workers. Answers are the direct server's: the policy's outputs with
``policy_version`` stamped.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch
from tensordict import TensorDictBase

from .config import InferenceServerConfig
from .target import ServedPolicy


class PolicyReplica:
    """A copy of the policy, built on first use in the process (and thread) that calls it.

    Pickles as its factory, weight-sync client and devices, never as a module: each collector worker process builds
    its own. Workers sharing one replica (threads) share its module; calls are serialized.

    Args:
        build: picklable callable returning the policy (a TensorDict module), as an inference server takes it.
        weight_sync: a weight-sync client, polled before each forward (``None``: the weights it was built with).
        config: the inference config whose devices it uses (``policy_device``, ``output_device``); ``None``: its
            defaults.
    """

    inline = True  # the collector's worker calls it at once, with no future per step

    def __init__(self, build: Callable[[], torch.nn.Module], weight_sync: Any = None,
                 config: InferenceServerConfig | None = None):
        self.build, self.weight_sync = build, weight_sync
        self.config = config or InferenceServerConfig()
        self._served: ServedPolicy | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        return {"build": self.build, "weight_sync": self.weight_sync, "config": self.config}

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    @property
    def policy_version(self) -> int:
        """The version of the weights the last forward used (0 before any)."""
        return 0 if self._served is None else self._served.version()

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        served = self._served
        if served is None:
            with self._lock:
                if self._served is None:
                    self._served = ServedPolicy(self.build, None, self.config, self.weight_sync)
                served = self._served
        return served.forward(td)

    def __repr__(self) -> str:
        return f"PolicyReplica({getattr(self.build, '__qualname__', self.build)!r}, built={self._served is not None})"
