"""The evaluator service: the newest policy played in envs of its own, off the learner's path.

Its place in the compatibility table is `components.evaluator.declaration` (imported without torch); the owner,
its client and the episodes load on first use.
"""

from __future__ import annotations

from ..exports import lazy_exports

_EXPORTS = {
    "Evaluation": "episodes",
    "play": "episodes",
    "EvaluatorConfig": "config",
    "Evaluator": "owner",
    "EvaluatorClient": "owner",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
