"""The logger service: scalars, metric dicts and hyperparameters, acknowledged.

``Logger`` is the owner base; concrete loggers build their SDK in :meth:`Logger._open` (called where the
owner lives) and implement ``_write_scalar``. Every call returns after the concrete method ran and raises
its exception at the call site. Shutdown flushes and closes, also on error paths.
"""

from __future__ import annotations

import csv
import json
import math
import os
import threading
import time
from typing import Any, Mapping

from transports.errors import ConfigurationError

from .service import Owner


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
    """

    component = "logger"

    def __init__(self, log_dir: str = ".", *, placement: str | None = None, transport=None):
        super().__init__(placement=placement, transport=transport)
        self.log_dir = log_dir
        self._lock = threading.Lock()

    def _start(self) -> None:
        os.makedirs(self.log_dir, exist_ok=True)
        self._open()

    def _shutdown(self, timeout: float | None) -> None:
        self._close()

    # ------------------------------------------------------------------ domain operations
    def log_scalar(self, name: str, value: Any, step: int | None = None) -> None:
        """Log one scalar; returns once it is written."""
        self._require_running()
        v = _as_float(name, value)
        with self._lock:
            self._write_scalar(name, v, step)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log several scalars at one step."""
        self._require_running()
        values = {k: _as_float(k, v) for k, v in metrics.items()}
        with self._lock:
            for k, v in values.items():
                self._write_scalar(k, v, step)

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Record hyperparameters (numbers, strings and booleans; other values as their ``repr``)."""
        self._require_running()
        clean = {k: v if isinstance(v, (int, float, str, bool)) else repr(v) for k, v in hparams.items()}
        with self._lock:
            self._write_hparams(clean)

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


class CSVLogger(Logger):
    """Scalars to ``<log_dir>/metrics.csv`` (columns: tag, step, value, wall_time), hparams to ``hparams.json``.

    Args:
        log_dir: output directory.
        flush_every: flush the file after this many rows (shutdown always flushes).
        placement: where the logger lives.
        transport: transport kind.
    """

    def __init__(self, log_dir: str = ".", flush_every: int = 100, *, placement: str | None = None, transport=None):
        if flush_every < 1:
            raise ConfigurationError(f"flush_every must be >= 1, got {flush_every!r}", path="logger.flush_every")
        super().__init__(log_dir, placement=placement, transport=transport)
        self.flush_every = flush_every
        self._file = None
        self._writer = None
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

    def _close(self) -> None:
        if self._file is not None:
            self._file.flush()
            self._file.close()
            self._file = None

    def _write_scalar(self, name: str, value: float, step: int | None) -> None:
        self._writer.writerow([name, "" if step is None else int(step), repr(value) if math.isfinite(value) else str(value), f"{time.time():.3f}"])
        self._pending += 1
        if self._pending >= self.flush_every:
            self._flush()

    def _write_hparams(self, hparams: Mapping[str, Any]) -> None:
        with open(os.path.join(self.log_dir, "hparams.json"), "w") as f:
            json.dump(hparams, f, indent=2, sort_keys=True)

    def _flush(self) -> None:
        if self._file is not None:
            self._file.flush()
        self._pending = 0


class TensorBoardLogger(Logger):
    """Scalars and hparams to TensorBoard event files in ``log_dir`` (needs the ``tensorboard`` extra).

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
