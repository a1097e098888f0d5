"""The logger service: scalars, metric dicts, hyperparameters and videos, acknowledged.

``Logger`` is the owner base; concrete loggers build their SDK in :meth:`Logger._open` (called where the
owner lives: this process for ``direct``, a thread for ``thread``, a child process for ``process``) and
implement ``_write_scalar``. Every call returns after the concrete method ran, returns its value, and raises
its exception at the call site. Shutdown flushes and closes, also on error paths and after Ctrl-C.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import os
import threading
import time
from typing import Any, Mapping

import torch

from transports.errors import ConfigurationError

from .hosting import Allowed, CommandClient, Host, hosted
from .service import Owner

CLIENT_OPERATIONS = frozenset({"log_scalar", "log_metrics", "log_hparams", "log_video", "flush"})


def _as_float(name: str, value: Any) -> float:
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"log value for {name!r} must be a number or a one-element tensor, got {value!r}") from exc


def video_frames(video: torch.Tensor) -> torch.Tensor:
    """Check a uint8 ``T x C x H x W`` video (or ``N x T x C x H x W``, laid out as a grid); return ``T x H x W x C``.

    Raises:
        TypeError: not a uint8 tensor of 4 or 5 dimensions.
    """
    if not isinstance(video, torch.Tensor) or video.dtype != torch.uint8 or video.dim() not in (4, 5):
        got = f"{video.dtype} {list(video.shape)}" if isinstance(video, torch.Tensor) else type(video).__name__
        raise TypeError(f"log_video needs a uint8 tensor T x C x H x W or N x T x C x H x W, got {got}")
    video = video.detach().cpu()
    if video.dim() == 5:  # N videos side by side: a grid with ceil(sqrt(N)) columns
        n, t, c, h, w = video.shape
        cols = math.ceil(math.sqrt(n))
        rows = math.ceil(n / cols)
        grid = torch.zeros((t, c, rows * h, cols * w), dtype=torch.uint8)
        for i in range(n):
            r, q = divmod(i, cols)
            grid[:, :, r * h : (r + 1) * h, q * w : (q + 1) * w] = video[i]
        video = grid
    return video.permute(0, 2, 3, 1).contiguous()


def write_gif(frames: torch.Tensor, path: str, fps: int) -> str:
    """Write ``T x H x W x C`` uint8 frames (C = 1 or 3) as an animated GIF; return the path."""
    from PIL import Image

    images = [Image.fromarray(f.squeeze(-1).numpy() if f.shape[-1] == 1 else f.numpy()) for f in frames]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    images[0].save(path, save_all=True, append_images=images[1:], duration=max(1, int(1000 / fps)), loop=0)
    return path


class Logger(Owner["Logger"]):
    """Base class of logger owners.

    Args:
        log_dir: directory the logger writes into (created if missing).
        placement: where the logger lives; ``None`` takes the ``service_backend`` context, else ``direct``.
        transport: transport kind; ``None`` takes the ``transport_backend`` context, else ``auto``.
    """

    component = "logger"

    def __init__(self, log_dir: str = ".", *, placement: str | None = None, transport=None, **options: Any):
        super().__init__(placement=placement, transport=transport)
        self.log_dir = log_dir
        self._options = {"log_dir": log_dir, **options}
        self._lock = threading.Lock()
        self._remote = None
        self._host: Host | None = None

    def _start(self) -> None:
        if self.placement != "direct":
            # an absolute directory: a ray actor does not share the driver's working directory
            options = {**self._options, "log_dir": os.path.abspath(self.log_dir)}
            twin = functools.partial(type(self), **options, placement="direct", transport="direct")
            self._host = Host("logger", twin, self.placement, Allowed(CLIENT_OPERATIONS, prefixes=("log_",)),
                              resources=self.resources)
            self._host.start()
            self._remote = self._client()
            return
        os.makedirs(self.log_dir, exist_ok=True)
        self._open()

    def _shutdown(self, timeout: float | None) -> None:
        if self._host is not None:
            self._host.stop(timeout)  # the twin flushes and closes in its own shutdown
            self._host = None
            self._remote = None
            return
        self._close()

    def _alive(self) -> bool:
        return self._host is None or self._host.is_alive

    def _client(self) -> "LoggerClient":
        return LoggerClient(self._host.endpoint())

    # ------------------------------------------------------------------ domain operations
    @hosted
    def log_scalar(self, name: str, value: Any, step: int | None = None) -> None:
        """Log one scalar; returns once it is written."""
        self._require_running()
        v = _as_float(name, value)
        with self._lock:
            self._write_scalar(name, v, step)

    @hosted
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log several scalars at one step."""
        self._require_running()
        values = {k: _as_float(k, v) for k, v in metrics.items()}
        with self._lock:
            for k, v in values.items():
                self._write_scalar(k, v, step)

    @hosted
    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Record hyperparameters (numbers, strings and booleans; other values as their ``repr``)."""
        self._require_running()
        clean = {k: v if isinstance(v, (int, float, str, bool)) else repr(v) for k, v in hparams.items()}
        with self._lock:
            self._write_hparams(clean)

    @hosted
    def log_video(self, name: str, video: torch.Tensor, step: int | None = None, fps: int = 30) -> str:
        """Write a uint8 ``T x C x H x W`` video (``N x T x C x H x W``: a grid); returns the artifact's path
        once it is written. CUDA tensors are moved to CPU."""
        self._require_running()
        frames = video_frames(video)
        safe = name.replace("/", "_")
        path = os.path.join(self.log_dir, "videos", f"{safe}_{0 if step is None else int(step)}.gif")
        with self._lock:
            return write_gif(frames, path, fps)

    @hosted
    def flush(self) -> None:
        """Push buffered values to disk."""
        self._require_running()
        with self._lock:
            self._flush()

    # ------------------------------------------------------------------ for subclasses
    def _open(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def _write_scalar(self, name: str, value: float, step: int | None) -> None:
        raise NotImplementedError

    def _write_hparams(self, hparams: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def _flush(self) -> None:
        pass


def logger_class(node: Mapping[str, Any], path: str = "logger") -> type[Logger]:
    """The :class:`Logger` subclass a logger config names by ``_target_``, checked against the config's other keys
    (the launcher adds ``placement`` and ``transport``), so a wrong backend fails before anything starts.

    Raises:
        ConfigurationError: no ``_target_``, it does not import or is no ``Logger`` subclass, there is no
            ``log_dir`` (relative to the run directory), or the class does not take the config's keys.
    """
    import inspect

    from .targets import locate

    cls = locate(node, path)
    if not (isinstance(cls, type) and issubclass(cls, Logger)):
        raise ConfigurationError(f"{node['_target_']!r} is not a subclass of components.logger.Logger "
                                 "(subclass it and implement _open, _close, _write_scalar, _write_hparams)",
                                 path=f"{path}._target_")
    options = {k: v for k, v in node.items() if k != "_target_"}
    if "log_dir" not in options:
        raise ConfigurationError(f"{path}.log_dir is missing: the directory the logger writes, relative to the run "
                                 "directory (e.g. log_dir: .)", path=f"{path}.log_dir")
    try:
        inspect.signature(cls).bind(**options, placement=None, transport=None)
    except TypeError as exc:
        raise ConfigurationError(f"{node['_target_']} does not take the options {sorted(options)}: {exc}",
                                 path=path) from exc
    return cls


class LoggerClient(CommandClient):
    """The client of a thread- or process-placed logger: every ``log_*`` method of the concrete logger,
    acknowledged, with its return value."""

    def log_scalar(self, name: str, value: Any, step: int | None = None) -> None:
        return self._call("log_scalar", name, _as_float(name, value), step)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        return self._call("log_metrics", {k: _as_float(k, v) for k, v in metrics.items()}, step)

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        return self._call("log_hparams", dict(hparams))

    def log_video(self, name: str, video: torch.Tensor, step: int | None = None, fps: int = 30) -> str:
        video_frames(video)  # a wrong video fails here, before it travels
        return self._call("log_video", name, video.detach().cpu(), step, fps)

    def flush(self) -> None:
        return self._call("flush")

    def __getattr__(self, name: str):
        if name.startswith("log_"):
            return functools.partial(self._call, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __getstate__(self):
        return {"_endpoint": self._endpoint}

    def __setstate__(self, state):
        self.__dict__.update(state)


class CSVLogger(Logger):
    """Scalars to ``<log_dir>/metrics.csv`` (columns: tag, step, value, wall_time), hparams to ``hparams.json``,
    videos to ``<log_dir>/videos/*.gif``; with ``tensorboard`` also TensorBoard event files under
    ``<log_dir>/tensorboard`` when the tensorboard package is installed.

    Args:
        log_dir: output directory.
        flush_every: flush the file after this many rows (shutdown always flushes).
        tensorboard: also write TensorBoard event files (skipped quietly if tensorboard is not installed).
        placement: where the logger lives.
        transport: transport kind.
    """

    def __init__(self, log_dir: str = ".", flush_every: int = 100, tensorboard: bool = True, *,
                 placement: str | None = None, transport=None):
        if flush_every < 1:
            raise ConfigurationError(f"flush_every must be >= 1, got {flush_every!r}", path="logger.flush_every")
        super().__init__(log_dir, placement=placement, transport=transport, flush_every=flush_every,
                         tensorboard=tensorboard)
        self.flush_every = flush_every
        self.tensorboard = tensorboard
        self._file = None
        self._writer = None
        self._events = None  # a TensorBoard SummaryWriter beside the CSV, when the package is installed
        self._pending = 0

    @property
    def path(self) -> str:
        return os.path.join(self.log_dir, "metrics.csv")

    def _open(self) -> None:
        new = not os.path.exists(self.path)
        self._file = open(self.path, "a", newline="")
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(["tag", "step", "value", "wall_time"])
        if self.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                return
            self._events = SummaryWriter(log_dir=os.path.join(self.log_dir, "tensorboard"))

    def _close(self) -> None:
        if self._file is not None:
            self._file.flush()
            self._file.close()
            self._file = None
        if self._events is not None:
            self._events.close()
            self._events = None

    def _write_scalar(self, name: str, value: float, step: int | None) -> None:
        self._writer.writerow([name, "" if step is None else int(step), repr(value) if math.isfinite(value) else str(value),
                               f"{time.time():.3f}"])
        if self._events is not None:
            self._events.add_scalar(name, value, global_step=step)
        self._pending += 1
        if self._pending >= self.flush_every:
            self._flush()

    def _write_hparams(self, hparams: Mapping[str, Any]) -> None:
        with open(os.path.join(self.log_dir, "hparams.json"), "w") as f:
            json.dump(hparams, f, indent=2, sort_keys=True)
        if self._events is not None:
            self._events.add_text("hparams", json.dumps(hparams, indent=2, sort_keys=True))

    def _flush(self) -> None:
        if self._file is not None:
            self._file.flush()
        if self._events is not None:
            self._events.flush()
        self._pending = 0


class TensorBoardLogger(Logger):
    """Scalars and hparams to TensorBoard event files in ``log_dir`` (needs the ``tensorboard`` extra);
    videos to ``<log_dir>/videos/*.gif``.

    Args:
        log_dir: output directory of the event files.
        placement: where the logger lives.
        transport: transport kind.
    """

    def __init__(self, log_dir: str = ".", *, placement: str | None = None, transport=None):
        super().__init__(log_dir, placement=placement, transport=transport)
        self._writer = None

    def _open(self) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigurationError(
                "the tensorboard logger needs the tensorboard package: pip install '.[tensorboard]'",
                path="logger",
                alternatives=("csv",),
            ) from exc
        self._writer = SummaryWriter(log_dir=self.log_dir)

    def _close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None

    def _write_scalar(self, name: str, value: float, step: int | None) -> None:
        self._writer.add_scalar(name, value, global_step=step)

    def _write_hparams(self, hparams: Mapping[str, Any]) -> None:
        self._writer.add_text("hparams", json.dumps(hparams, indent=2, sort_keys=True))

    def _flush(self) -> None:
        self._writer.flush()


class VideoRecorder:
    """Collects environment frames and logs them as one video.

    Args:
        logger: a logger owner (its client is used) or a logger client.
        tag: the video's name.
        fps: frames per second of the written video.

    Example:
        >>> recorder = VideoRecorder(logger_owner, tag="eval/video", fps=30)
        >>> recorder.record(env.render())          # H x W x C uint8, or N x H x W x C for vector envs
        >>> path = recorder.flush(step=1000)
    """

    def __init__(self, logger: Any, tag: str, fps: int = 30):
        self.logger = logger.client() if isinstance(logger, Owner) else logger
        self.tag, self.fps = tag, fps
        self.frames: list[torch.Tensor] = []

    def record(self, frame) -> None:
        frame = torch.as_tensor(frame)
        if frame.dtype != torch.uint8 or frame.dim() not in (3, 4):
            raise TypeError(f"frames must be uint8 H x W x C (or N x H x W x C), got {frame.dtype} {list(frame.shape)}")
        self.frames.append(frame)

    def flush(self, step: int | None = None) -> str | None:
        """Log the recorded frames as a video (a grid for vector envs) and start afresh; returns the artifact path."""
        if not self.frames:
            return None
        video = torch.stack(self.frames)  # T x H x W x C or T x N x H x W x C
        video = video.permute(0, 3, 1, 2) if video.dim() == 4 else video.permute(1, 0, 4, 2, 3)
        self.frames = []
        return self.logger.log_video(self.tag, video.contiguous(), step=step, fps=self.fps)
