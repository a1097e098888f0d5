"""The logger service: acknowledged ``log_*`` calls into a logging SDK built where the logger lives.

Its place in the compatibility table is :mod:`components.logger.declaration` (imported without torch); the
loggers load on first use. Name your own logger class (a subclass of :class:`Logger`) by ``_target_`` in YAML.
"""

from __future__ import annotations

from ..exports import lazy_exports

_EXPORTS = {
    "Logger": "base",
    "logger_class": "base",
    "CLIENT_OPERATIONS": "base",
    "_as_float": "base",
    "LoggerClient": "client",
    "CSVLogger": "csv",
    "TensorBoardLogger": "tensorboard",
    "VideoRecorder": "video",
    "video_frames": "video",
    "write_gif": "video",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(n for n in _EXPORTS if not n.startswith("_"))
