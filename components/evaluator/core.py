"""What runs where the evaluator is placed: its env maker, its copy of the policy, and a thread that evaluates.

The run tells it how many frames it has collected (`EvaluatorCore.notify`, answered at once); each time the
count passes the next multiple of ``eval_every`` the thread copies the newest weights from weight sync into its own
policy, plays ``episodes`` episodes (`play`) and logs ``eval/...`` through the
logger client at that frame count, with the policy version it played and, on request, the first episode as a video.
Nobody waits for it: a notification that comes while an evaluation runs replaces the one waiting (the newest frame
count is evaluated next; ``skipped`` counts the others). An evaluation that fails is raised at the next call.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Mapping

import torch

from ..inference.config import InferenceServerConfig
from ..inference.target import ServedPolicy
from .config import EvaluatorConfig
from .episodes import Evaluation, evaluation_env_node, play

log = logging.getLogger(__name__)


class EvaluatorCore:
    """The evaluator's resource.

    Args:
        config: episodes, mode, video and cadence (`EvaluatorConfig`).
        env: the run's ``env`` config node (as a mapping).
        policy_factory: picklable callable returning the policy (the behaviour policy the inference server runs).
        weight_sync: a weight-sync client to take the newest weights from (``None``: the policy as built).
        logger: a logger client (``None``: results are kept, not logged).
        inference: the inference config whose devices the policy uses (``None``: the CPU).
    """

    def __init__(self, config: EvaluatorConfig, env: Mapping[str, Any], policy_factory: Callable[[], Any],
                 weight_sync: Any = None, logger: Any = None, inference: InferenceServerConfig | None = None):
        from ..envs import EnvMaker

        self.config = config
        self.maker = EnvMaker.from_config(evaluation_env_node(env, render=config.video))
        self.served = ServedPolicy(policy_factory, None, inference or InferenceServerConfig())
        self.weight_sync, self.logger = weight_sync, logger
        self.version: int | None = None
        self.skipped = 0
        self._results: list[dict] = []
        self._next_at = config.eval_every
        self._pending: int | None = None
        self._busy = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="evaluator", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ operations
    def notify(self, frames: int) -> bool:
        """The run has collected ``frames`` frames: queue an evaluation if that passes the next ``eval_every``.

        Returns:
            Whether an evaluation was queued.

        Raises:
            RuntimeError: the last evaluation failed (its error is the cause).
        """
        with self._cond:
            self._raise_failure()
            if self._next_at is None or frames < self._next_at:
                return False
            if self._pending is not None:
                self.skipped += 1
            every = self.config.eval_every
            self._next_at = (frames // every + 1) * every
            self._pending = int(frames)
            self._cond.notify_all()
            return True

    def evaluate(self, frames: int | None = None) -> dict:
        """Evaluate now, in the caller's thread (after any queued evaluation), and return the result.

        Args:
            frames: the frame count to log it at (``None``: not logged through the logger).
        """
        self.wait_idle(None)
        with self._cond:
            self._busy = True
        try:
            return self._evaluate(frames)
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def results(self) -> list:
        """Every evaluation so far, oldest first (`Evaluation.summary` and ``video``, the video's path)."""
        with self._cond:
            return list(self._results)

    def wait_idle(self, timeout: float | None = 60.0) -> bool:
        """Wait until no evaluation runs or waits; ``False`` after ``timeout`` seconds.

        Raises:
            RuntimeError: the last evaluation failed.
        """
        with self._cond:
            done = self._cond.wait_for(lambda: (self._pending is None and not self._busy) or self._error is not None,
                                       timeout)
            self._raise_failure()
            return done

    def close(self) -> None:
        """Stop: an evaluation under way is abandoned at its next step."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout=60)

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending is not None or self._stop.is_set())
                if self._stop.is_set():
                    return
                frames, self._pending, self._busy = self._pending, None, True
            try:
                self._evaluate(frames)
            except BaseException as exc:  # noqa: BLE001 - raised again at the next call of the run
                log.error("evaluator: the evaluation at frame %d failed: %s: %s", frames, type(exc).__name__, exc)
                with self._cond:
                    self._error = exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _evaluate(self, frames: int | None) -> dict:
        if self.weight_sync is not None:
            version = self.weight_sync.poll(-1 if self.version is None else self.version, into=self.served.policy)
            if version is not None:
                self.version = version
        cfg = self.config
        result: Evaluation = play(self.maker, self.served.forward, cfg.episodes, cfg.seed, mode=cfg.mode,
                                  video=cfg.video, max_episode_steps=cfg.max_episode_steps,
                                  should_stop=self._stop.is_set)
        result.policy_version, result.frames = self.version, frames
        if not result.returns:  # stopped before an episode ended
            return {}
        summary = result.summary()
        if self.logger is not None and frames is not None:
            self.logger.log_metrics(result.metrics(), step=frames)
        if result.video is not None and self.logger is not None:
            video = torch.from_numpy(result.video).permute(0, 3, 1, 2).contiguous()
            summary["video"] = self.logger.log_video("eval/video", video, step=frames, fps=cfg.video_fps)
        log.info("evaluator: frame %s, policy version %s: return %.2f +- %.2f over %d episodes (%.1f s)", frames,
                 self.version, result.mean_return, result.return_std, len(result.returns), result.seconds)
        with self._cond:
            self._results.append(summary)
        return summary

    def _raise_failure(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"the evaluator's last evaluation failed: {type(error).__name__}: {error}") from error
