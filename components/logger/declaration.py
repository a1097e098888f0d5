"""The logger's place in the compatibility table: acknowledged commands, possibly carrying videos."""

from __future__ import annotations

from .config import LoggerConfig
from ..declaration import DIRECT, MONARCH, RAY, THREAD, Cell, Declaration, S, fixed

DECLARATION = Declaration(
    component="logger",
    cells=(
        Cell("logger", "direct", {"direct": S}, DIRECT),
        Cell("logger", "thread", {"thread": S}, THREAD),
        Cell("logger", "process", {"queue": S}, fixed("queue", "commands and videos of any shape: pickled over local sockets")),
        Cell("logger", "ray", {"ray": S}, RAY),
        Cell("logger", "monarch", {"monarch": S}, MONARCH),
    ),
    first=True,
    config=LoggerConfig,
)
