"""The logger service: scalars, metric dicts, hyperparameters and videos, acknowledged.

``Logger`` is the owner base; concrete loggers build their SDK in :meth:`Logger._open` (called where the
logger lives: this owner in the caller's thread for ``direct``, a twin of it on a thread, in a child process or
in a Ray actor otherwise) and implement ``_write_scalar``. Every call returns after the concrete method ran,
returns its value, and raises its exception at the call site. Shutdown flushes and closes, also on error paths
and after Ctrl-C.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping

import torch

from transports.kernel.errors import NO_SPACE, ConfigurationError

from ..commands import Allowed, CommandTarget, hosted
from ..config import LoggerConfig
from ..resolution import Resolved
from ..service import Owner
from .video import video_frames, write_gif

if TYPE_CHECKING:
    from .client import LoggerClient

log = logging.getLogger(__name__)

CLIENT_OPERATIONS = frozenset({"log_scalar", "log_metrics", "log_hparams", "log_video", "flush"})


def _as_float(name: str, value: Any) -> float:
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"log value for {name!r} must be a number or a one-element tensor, got {value!r}") from exc



class Logger(Owner["Logger"]):
    """Base class of logger owners.

    Args:
        log_dir: directory the logger writes into (created if missing).
        placement: where the logger lives; ``None`` takes the ``service_backend`` context, else ``direct``.
        transport: transport kind; ``None`` takes the ``transport_backend`` context, else ``auto``.
        resolved: the plan's resolution of ``components.logger`` (then placement and transport are its).
        options: the concrete logger's own options (``logger.*`` in YAML besides ``_target_``).
    """

    component = "logger"

    def __init__(self, log_dir: str = ".", *, placement: str | None = None, transport=None,
                 resolved: Resolved | None = None, **options: Any):
        super().__init__(LoggerConfig(placement=placement), transport=transport, resolved=resolved)
        self.log_dir = log_dir
        self._options = {"log_dir": log_dir, **options}
        self._lock = threading.Lock()
        self._remote = None

    # ------------------------------------------------------------------ hosting
    def _target(self, server_side: Any) -> Callable[[], Any]:
        if server_side is None:  # the SDK opens right here, on this owner
            return functools.partial(_InPlace, self)
        # a twin of this logger, placed in the caller of its host; an absolute directory, since a Ray actor does
        # not share the driver's working directory
        options = {**self._options, "log_dir": os.path.abspath(self.log_dir)}
        twin = functools.partial(_started_twin, type(self), options)
        return functools.partial(CommandTarget, twin, server_side, Allowed(CLIENT_OPERATIONS, prefixes=("log_",)))

    def _ready(self) -> None:
        if self._transport is not None:
            self._remote = self._client()

    def _shutdown(self, timeout: float | None) -> None:
        self._remote = None
        super()._shutdown(timeout)  # a hosted twin flushes and closes in its own shutdown

    def _wrap(self, endpoint: Any) -> "LoggerClient":
        from .client import LoggerClient

        return LoggerClient(endpoint)

    # ------------------------------------------------------------------ domain operations
    @hosted
    def log_scalar(self, name: str, value: Any, step: int | None = None) -> None:
        """Log one scalar; returns once it is written."""
        self._require_running()
        v = _as_float(name, value)
        with self._lock, self._writing():
            self._write_scalar(name, v, step)

    @hosted
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log several scalars at one step."""
        self._require_running()
        values = {k: _as_float(k, v) for k, v in metrics.items()}
        with self._lock, self._writing():
            for k, v in values.items():
                self._write_scalar(k, v, step)

    @hosted
    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Record hyperparameters (numbers, strings and booleans; other values as their ``repr``)."""
        self._require_running()
        clean = {k: v if isinstance(v, (int, float, str, bool)) else repr(v) for k, v in hparams.items()}
        with self._lock, self._writing():
            self._write_hparams(clean)

    @hosted
    def log_video(self, name: str, video: torch.Tensor, step: int | None = None, fps: int = 30) -> str:
        """Write a uint8 ``T x C x H x W`` video (``N x T x C x H x W``: a grid); returns the artifact's path
        once it is written. CUDA tensors are moved to CPU."""
        self._require_running()
        frames = video_frames(video)
        safe = name.replace("/", "_")
        path = os.path.join(self.log_dir, "videos", f"{safe}_{0 if step is None else int(step)}.gif")
        with self._lock, self._writing():
            return write_gif(frames, path, fps)

    @hosted
    def flush(self) -> None:
        """Push buffered values to disk."""
        self._require_running()
        with self._lock, self._writing():
            self._flush()

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



class _InPlace:
    """The target of a logger in the caller's thread: its SDK, opened on the owner itself, flushed every
    ``owner.flush_seconds`` (where it has them) by a thread of its own, so that a process killed outright loses only
    what it was told in those last seconds."""

    def __init__(self, owner: Logger):
        os.makedirs(owner.log_dir, exist_ok=True)
        owner._open()
        self.owner = owner
        self._stop = threading.Event()
        self._flusher = None
        seconds = getattr(owner, "flush_seconds", None)
        if seconds:
            self._flusher = threading.Thread(target=self._flush_every, args=(float(seconds),), daemon=True,
                                             name="logger-flush")
            self._flusher.start()

    def _flush_every(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            try:
                with self.owner._lock, self.owner._writing():
                    self.owner._flush()
            except OSError as exc:  # kept by the logger: the next call it serves raises it
                log.info("logger: cannot flush into %s: %s", self.owner.log_dir, exc.strerror)
                return

    def close(self) -> None:
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
        try:
            self.owner._close()
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                raise
            log.info("logger: %s: what was not flushed into %s before is lost", exc.strerror, self.owner.log_dir)


def quiet_writer_threads() -> None:
    """TensorBoard's writer thread keeps a failed write for the writer, which raises it at its next call (named by
    :meth:`Logger._writing`), and then re-raises it in the thread as well: a full disk is said once, at the call, not
    as a thread's traceback too. Installed once per process, before the first writer opens."""
    previous = threading.excepthook
    if getattr(previous, "quiet_full_disk", False):
        return

    def hook(args) -> None:
        if not (isinstance(args.exc_value, OSError) and args.exc_value.errno in NO_SPACE
                and type(args.thread).__module__.startswith("tensorboard")):
            previous(args)

    hook.quiet_full_disk = True
    threading.excepthook = hook


def _started_twin(cls: type, options: dict) -> Logger:
    """The logger that does the work where a remote logger lives: the same class, placed in its host's caller."""
    return cls(**options, placement="direct", transport="direct").start()


def logger_class(node: Mapping[str, Any], path: str = "logger") -> type[Logger]:
    """The :class:`Logger` subclass a logger config names by ``_target_``, checked against the config's other keys
    (the launcher adds ``placement`` and ``transport``), so a wrong backend fails before anything starts.

    Raises:
        ConfigurationError: no ``_target_``, it does not import or is no ``Logger`` subclass, there is no
            ``log_dir`` (relative to the run directory), or the class does not take the config's keys.
    """
    import inspect

    from ..targets import locate

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
