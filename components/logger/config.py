"""The built-in loggers' options (the ``logger`` group in YAML: ``logger=csv``, ``logger=tensorboard``): each
dataclass is the schema of its option and holds the one default of every keyword its logger's constructor takes.
Where the logger lives is ``components.logger`` (:class:`components.config.LoggerConfig`). Plain data: nothing heavy
is imported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from transports.kernel.options import bounded


@dataclass
class CSVLoggerConfig:
    """``logger=csv``: every scalar as a CSV row, and TensorBoard event files beside them when tensorboard is
    installed."""

    _target_: str = "components.logger.CSVLogger"
    log_dir: str = "."  # relative to the run directory
    flush_every: int = bounded(100, ge=1)  # rows between flushes (shutdown always flushes)
    flush_seconds: float = bounded(5.0, gt=0, unit="seconds")  # and at least this often: a killed logger loses no more
    tensorboard: bool = True  # also TensorBoard event files under <run dir>/tensorboard, if tensorboard is installed
    resume_step: Optional[int] = bounded(None, ge=0)  # set by the launcher on resume: rows after this step are dropped


@dataclass
class TensorBoardLoggerConfig:
    """``logger=tensorboard``: TensorBoard event files only."""

    _target_: str = "components.logger.TensorBoardLogger"
    log_dir: str = "tensorboard"  # relative to the run directory
    flush_seconds: float = bounded(5.0, gt=0, unit="seconds")  # events reach the disk at least this often
    resume_step: Optional[int] = bounded(None, ge=0)  # set by the launcher on resume: later events are hidden
