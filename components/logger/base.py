"""The logger service: scalars, metric dicts, hyperparameters and videos, acknowledged, into a backend.

``Logger`` is the owner; what it writes into is its *backend* (`components.logger.backend`: ``CSVLogger``,
``TensorBoardLogger`` or a class of yours), an object it holds and opens where the logger lives: on this owner in the
caller's thread for ``direct``, on a twin of it on a thread, in a child process or in a Ray actor otherwise. Every
call returns after the backend's method ran, returns its value, and raises its exception at the call site. Shutdown
flushes and closes, also on error paths and after Ctrl-C.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
import os
import threading
from typing import Any, Callable, Iterator, Mapping

import torch

from transports.kernel.errors import NO_SPACE

from ..commands import Allowed, CommandTarget, hosted
from ..resolution import Resolved
from ..service import Owner
from .backend import as_float, check_backend
from .client import LoggerClient
from .config import LoggerConfig
from .video import video_frames, write_video

log = logging.getLogger(__name__)

CLIENT_OPERATIONS = frozenset({"log_scalar", "log_metrics", "log_hparams", "log_video", "flush"})


class Logger(Owner["Logger"]):
    """The logger owner: acknowledged ``log_*`` calls into the backend it holds.

    Args:
        config: where the logger lives (``components.logger``); ``None``: the defaults (``service_backend`` and
            ``transport_backend`` scopes, else ``direct`` and ``auto``).
        backend: what it writes into (`LoggerBackend`), not opened yet: it opens where the
            logger lives. Methods of the backend named ``log_*`` are operations of the logger too.
        transport: a transport kind or instance instead of ``config.transport``.
        resolved: the plan's resolution of ``components.logger`` (then ``config`` and ``transport`` are its).

    Raises:
        ConfigurationError: ``backend`` lacks a method of the protocol.

    Examples:
        >>> from components.logger import CSVLogger, Logger, LoggerConfig
        >>> with Logger(LoggerConfig(placement="thread"), backend=CSVLogger("runs/a")) as logger:
        ...     logger.log_scalar("loss", 0.5, step=1)
    """

    component = "logger"

    def __init__(self, config: LoggerConfig | None = None, *, backend: Any, transport: Any = None,
                 resolved: Resolved | None = None):
        check_backend(backend)
        super().__init__(config, transport=transport, resolved=resolved)
        self.backend = backend
        self._lock = threading.Lock()
        self._remote = None

    @property
    def log_dir(self) -> str:
        """The directory the backend writes into."""
        return self.backend.log_dir

    # ------------------------------------------------------------------ hosting
    def _target(self, server_side: Any) -> Callable[[], Any]:
        if server_side is None:  # the backend opens right here, on this owner
            return functools.partial(_InPlace, self)
        # a twin of this logger, placed in the caller of its host; an absolute directory, since a Ray actor does
        # not share the driver's working directory
        twin = functools.partial(_started_twin, _with_absolute_dir(self.backend))
        return functools.partial(CommandTarget, twin, server_side, Allowed(CLIENT_OPERATIONS, prefixes=("log_",)))

    def _ready(self) -> None:
        if self._transport is not None:
            self._remote = self._client()

    def _shutdown(self, timeout: float | None) -> None:
        self._remote = None
        super()._shutdown(timeout)  # a hosted twin flushes and closes in its own shutdown

    def _wrap(self, endpoint: Any) -> LoggerClient:
        return LoggerClient(endpoint)

    def __getattr__(self, name: str) -> Any:
        # a backend's own log_* method: through the client where the backend lives elsewhere, else run like the
        # logger's operations (under its lock, once it runs)
        backend = self.__dict__.get("backend")
        if name.startswith("log_") and callable(getattr(backend, name, None)):
            remote = self.__dict__.get("_remote")
            return getattr(remote, name) if remote is not None else functools.partial(self._backend_call, name)
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def _backend_call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self._require_running()
        with self._lock, self._writing():
            return getattr(self.backend, name)(*args, **kwargs)

    # ------------------------------------------------------------------ domain operations
    @hosted
    def log_scalar(self, name: str, value: Any, step: int | None = None) -> None:
        """Log one scalar; returns once it is written."""
        self._require_running()
        v = as_float(name, value)
        with self._lock, self._writing():
            self.backend.write_scalar(name, v, step)

    @hosted
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log several scalars at one step."""
        self._require_running()
        values = {k: as_float(k, v) for k, v in metrics.items()}
        together = getattr(self.backend, "write_metrics", None)  # optional: one record for the step
        with self._lock, self._writing():
            if together is not None:
                together(values, step)
                return
            for k, v in values.items():
                self.backend.write_scalar(k, v, step)

    @hosted
    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Record hyperparameters (numbers, strings and booleans; other values as their ``repr``)."""
        self._require_running()
        clean = {k: v if isinstance(v, (int, float, str, bool)) else repr(v) for k, v in hparams.items()}
        with self._lock, self._writing():
            self.backend.write_hparams(clean)

    @hosted
    def log_video(self, name: str, video: torch.Tensor, step: int | None = None, fps: int = 30) -> str:
        """Write a uint8 ``T x C x H x W`` video (``N x T x C x H x W``: a grid) as MP4 (GIF without ``imageio-ffmpeg``,
        the ``video`` extra); returns the artifact's path
        once it is written (and handed to the backend's ``write_video``, where it has one). CUDA tensors are moved
        to CPU."""
        self._require_running()
        frames = video_frames(video)
        safe = name.replace("/", "_")
        path = os.path.join(self.log_dir, "videos", f"{safe}_{0 if step is None else int(step)}")
        carry = getattr(self.backend, "write_video", None)  # optional: the backend's own store takes the file too
        with self._lock, self._writing():
            written = write_video(frames, path, fps)
            if carry is not None:
                carry(name, written, step, fps)
            return written

    @hosted
    def flush(self) -> None:
        """Push buffered values to disk."""
        self._require_running()
        with self._lock, self._writing():
            _flush(self.backend)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A write of this logger. One that fails for want of space raises ``OSError`` naming the log directory
        (the disk's own error names no file), and every later write fails alike, at once."""
        full = getattr(self, "_full", None)
        if full is not None:
            raise OSError(full.errno, full.strerror, full.filename)
        try:
            yield
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                raise
            self._full = OSError(exc.errno, os.strerror(exc.errno), os.path.abspath(self.log_dir))
            raise OSError(exc.errno, self._full.strerror, self._full.filename) from None


class _InPlace:
    """The target of a logger in the caller's thread: its backend, opened on the owner itself, flushed every
    ``backend.flush_seconds`` (where it has them) by a thread of its own, so that a process killed outright loses only
    what it was told in those last seconds."""

    def __init__(self, owner: Logger):
        os.makedirs(owner.log_dir, exist_ok=True)
        owner.backend.open()
        self.owner = owner
        self._stop = threading.Event()
        self._flusher = None
        seconds = getattr(owner.backend, "flush_seconds", None)
        if seconds:
            self._flusher = threading.Thread(target=self._flush_every, args=(float(seconds),), daemon=True,
                                             name="logger-flush")
            self._flusher.start()

    def _flush_every(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            try:
                with self.owner._lock, self.owner._writing():
                    _flush(self.owner.backend)
            except OSError as exc:  # kept by the logger: the next call it serves raises it
                log.info("logger: cannot flush into %s: %s", self.owner.log_dir, exc.strerror)
                return

    def close(self) -> None:
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
        try:
            self.owner.backend.close()
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                raise
            log.info("logger: %s: what was not flushed into %s before is lost", exc.strerror, self.owner.log_dir)


def _flush(backend: Any) -> None:
    flush = getattr(backend, "flush", None)  # optional in the protocol
    if flush is not None:
        flush()


def _with_absolute_dir(backend: Any) -> Any:
    """A copy of ``backend`` whose ``log_dir`` is absolute."""
    where = os.path.abspath(backend.log_dir)
    if dataclasses.is_dataclass(backend):
        return dataclasses.replace(backend, log_dir=where)
    twin = copy.copy(backend)
    twin.log_dir = where
    return twin


def _started_twin(backend: Any) -> Logger:
    """The logger that does the work where a remote logger lives: the same backend, placed in its host's caller."""
    return Logger(LoggerConfig(placement="direct", transport="direct"), backend=backend).start()
