"""The client of a logger placed on a thread, in a process or in a Ray actor."""

from __future__ import annotations

import functools
from typing import Any, Mapping

import torch

from ..commands import CommandClient
from .backend import as_float
from .video import video_frames


class LoggerClient(CommandClient):
    """The client of a thread- or process-placed logger: every ``log_*`` operation of the logger (and of its
    backend), acknowledged, with its return value."""

    def log_scalar(self, name: str, value: Any, step: int | None = None) -> None:
        """Log one scalar (a number or a one-element tensor); returns once it is written."""
        return self._call("log_scalar", name, as_float(name, value), step)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log several scalars at one step."""
        return self._call("log_metrics", {k: as_float(k, v) for k, v in metrics.items()}, step)

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Record hyperparameters."""
        return self._call("log_hparams", dict(hparams))

    def log_video(self, name: str, video: torch.Tensor, step: int | None = None, fps: int = 30) -> str:
        """Write a uint8 video where the logger lives; returns the artifact's path."""
        video_frames(video)  # a wrong video fails here, before it travels
        return self._call("log_video", name, video.detach().cpu(), step, fps)

    def flush(self) -> None:
        """Push buffered values to disk."""
        return self._call("flush")

    def __getattr__(self, name: str):
        if name.startswith("log_"):
            return functools.partial(self._call, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __getstate__(self):
        return {"_endpoint": self._endpoint}

    def __setstate__(self, state):
        self.__dict__.update(state)


