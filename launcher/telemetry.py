"""Per-edge figures, logged while a recipe trains: how full inference batches are, how long requests wait,
how far the served policy lags the learner, how much the replay buffer holds.

A background thread of the launcher reads the owners (never the recipe) every ``every`` seconds and logs
through the logger client. The step is the frame count the recipe last reported (the progress line's, which the
summary reports too), not the collector's: workers that collect ahead are a batch further, and a run that stops would
otherwise log its last edges at a step the summary and the recipe's own rows never reach.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Mapping

log = logging.getLogger(__name__)


def edge_metrics(owners: Mapping[str, Any]) -> dict[str, float]:
    """One reading of every edge the owners expose. An edge whose owner died (or dies while it is read) is left
    out: the last reading, taken as a run ends, still logs the others."""
    out: dict[str, float] = {}
    for read in (_inference_edges, _lag_edge, _replay_edge):
        try:
            out.update(read(owners))
        except Exception as exc:  # noqa: BLE001 - a dead owner's edge is skipped, the others are read
            log.debug("edge skipped: %s", exc)
    return out


def _inference_edges(owners: Mapping[str, Any]) -> dict[str, float]:
    inference = owners.get("inference")
    if inference is None or inference.inline or not inference.is_alive:
        return {}
    stats = inference.stats()
    if not stats["batches"]:
        return {}
    return {"edge/inference/batch_fill": stats["mean_batch_size"] / inference.config.max_batch_size,
            "edge/inference/mean_batch_size": stats["mean_batch_size"],
            "edge/inference/queue_wait_p50_ms": 1000 * stats["queue_wait_p50"],
            "edge/inference/forward_p50_ms": 1000 * stats["forward_p50"]}


def _lag_edge(owners: Mapping[str, Any]) -> dict[str, float]:
    inference, sync = owners.get("inference"), owners.get("weight_sync")
    if inference is None or sync is None or not (inference.is_alive and sync.is_alive):
        return {}
    return {"edge/policy_lag": float(max(0, sync.version - inference.policy_version))}


def _replay_edge(owners: Mapping[str, Any]) -> dict[str, float]:
    replay = owners.get("replay")
    if replay is None or not replay.is_alive:
        return {}
    return {"edge/replay/size": float(len(replay))}


class EdgeReporter:
    """Logs `edge_metrics` every ``every`` seconds until stopped; errors are logged, never raised.

    Args:
        owners: the run's owners, by component.
        logger: the logger client.
        step: the step to log at (the frames the recipe has reported); ``None``: the collector's frame count.
        every: seconds between readings.
    """

    def __init__(self, owners: Mapping[str, Any], logger: Any, every: float = 5.0,
                 step: Callable[[], int] | None = None):
        self.owners, self.logger, self.every, self._step = owners, logger, every, step
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="edge-reporter", daemon=True)

    def start(self) -> "EdgeReporter":
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.report()

    def report(self) -> None:
        try:
            metrics = edge_metrics(self.owners)
            if metrics:
                step = self._step() if self._step is not None else getattr(self.owners.get("collector"), "frames", None)
                self.logger.log_metrics(metrics, step=step)
        except Exception as exc:  # noqa: BLE001 - telemetry must never break training
            log.warning("edge metrics skipped: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
