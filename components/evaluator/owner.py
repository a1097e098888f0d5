"""The evaluator service: episodes of the newest policy in envs of its own, placed like any other service.

``Evaluator`` is the owner; what it runs where it is placed is an `EvaluatorCore`
(built there: the envs, a copy of the policy, the evaluating thread). Its client has the domain operations only:
``notify(frames)`` (answered at once: the caller never waits for an evaluation), ``results()``, ``evaluate()`` and
``wait_idle()``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

from ..commands import Allowed, CommandClient, CommandTarget
from ..inference.config import InferenceServerConfig
from ..resolution import Resolved
from ..service import Owner
from .config import EvaluatorConfig
from .core import EvaluatorCore

CLIENT_OPERATIONS = frozenset({"notify", "results", "evaluate", "wait_idle"})


class EvaluatorClient(CommandClient):
    """The client of an evaluator placed on a thread, in a process or in a Ray actor."""

    def notify(self, frames: int) -> bool:
        """The run has collected ``frames`` frames (see `EvaluatorCore.notify`); returns at once."""
        return self._call("notify", int(frames))

    def results(self) -> list:
        """Every evaluation so far, oldest first."""
        return self._call("results")

    def evaluate(self, frames: int | None = None) -> dict:
        """Evaluate now and return the result (waits for it)."""
        return self._call("evaluate", frames)

    def wait_idle(self, timeout: float | None = 60.0) -> bool:
        """Wait until no evaluation runs or waits."""
        return self._call("wait_idle", timeout)


class Evaluator(Owner["EvaluatorClient"]):
    """The evaluator owner.

    Args:
        config: where it lives and what it plays (`EvaluatorConfig`; ``None``: its defaults).
        env: the run's ``env`` config (a mapping, as the ``env`` node holds it).
        policy_factory: picklable callable returning the policy, called where the evaluator lives.
        weight_sync: a weight-sync client (the newest weights are taken from it before each evaluation).
        logger: a logger client (``eval/...`` scalars and videos go to it).
        inference: the inference config whose devices the policy uses (``None``: the CPU).
        transport: a transport kind or instance instead of ``config.transport``.
        resolved: the plan's resolution of ``components.evaluator``.

    Examples:
        >>> with Evaluator(EvaluatorConfig(placement="process", eval_every=10_000), env={"id": "CartPole-v1"},
        ...                policy_factory=make_policy, weight_sync=sync.client(), logger=logger.client()) as ev:
        ...     ev.client().notify(10_000)
    """

    component = "evaluator"

    def __init__(self, config: EvaluatorConfig | None = None, *, env: Mapping[str, Any],
                 policy_factory: Callable[[], Any], weight_sync: Any = None, logger: Any = None,
                 inference: InferenceServerConfig | None = None, transport: Any = None,
                 resolved: Resolved | None = None):
        super().__init__(config, transport=transport, resolved=resolved)
        self._build = functools.partial(EvaluatorCore, self.config, dict(env), policy_factory, weight_sync, logger,
                                        inference)

    def _target(self, server_side: Any) -> Callable[[], Any]:
        if server_side is None:
            return self._build
        return functools.partial(CommandTarget, self._build, server_side, Allowed(CLIENT_OPERATIONS))

    def _wrap(self, endpoint: Any) -> EvaluatorClient:
        return EvaluatorClient(endpoint)

    # ------------------------------------------------------------------ in the caller: the owner is the client
    def _core(self) -> EvaluatorCore:
        self._require_running()
        if not self.inline:
            raise TypeError(f"call the client (owner.client()) of an evaluator placed {self.placement!r}")
        return self._host.target

    def notify(self, frames: int) -> bool:
        """The run has collected ``frames`` frames; returns at once."""
        return self._core().notify(frames)

    def results(self) -> list:
        """Every evaluation so far, oldest first."""
        return self._core().results()

    def evaluate(self, frames: int | None = None) -> dict:
        """Evaluate now and return the result."""
        return self._core().evaluate(frames)

    def wait_idle(self, timeout: float | None = 60.0) -> bool:
        """Wait until no evaluation runs or waits."""
        return self._core().wait_idle(timeout)
