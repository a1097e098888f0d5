"""``components.weight_sync``: where the versions of the weights live and how receivers reach them
(`WeightSyncConfig`). Plain data: nothing heavy is imported."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..config import ComponentConfig


@dataclass
class WeightSyncConfig(ComponentConfig):
    """``components.weight_sync``: where the versions of the weights live and how receivers reach them."""

    component: ClassVar[str] = "weight_sync"
