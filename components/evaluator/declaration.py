"""The evaluator's place in the compatibility table: acknowledged commands (a frame count in, results out)."""

from __future__ import annotations

from ..declaration import DIRECT, RAY, THREAD, Calls, Cell, Declaration, S, fixed
from .config import EvaluatorConfig

DECLARATION = Declaration(
    component="evaluator",
    cells=(
        Cell("evaluator", "direct", {"direct": S}, DIRECT),
        Cell("evaluator", "thread", {"thread": S}, THREAD),
        Cell("evaluator", "process", {"queue": S}, fixed("queue", "small commands: pickled over local sockets")),
        Cell("evaluator", "ray", {"ray": S}, RAY),
    ),
    depends_on=("weight_sync", "logger"),
    calls=(Calls("weight_sync"), Calls("logger")),
    config=EvaluatorConfig,
)
