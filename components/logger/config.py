"""``components.logger``: where the logger owner lives and how clients reach it (`LoggerConfig`). What it
writes into is its backend (the ``logger`` group in YAML: `CSVLogger`,
`TensorBoardLogger` or a class of yours, see `components.logger.backend`), whose
dataclass holds its own options. Plain data: nothing heavy is imported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import ComponentConfig


@dataclass
class LoggerConfig(ComponentConfig):
    """``components.logger``: where the logger lives (its backend and options are the ``logger`` group's)."""

    component: ClassVar[str] = "logger"
