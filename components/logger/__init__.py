"""The logger service: acknowledged ``log_*`` calls into a backend opened where the logger lives.

`Logger` is the owner (``Logger(LoggerConfig(placement=...), backend=CSVLogger(log_dir))``); its backend is
`CSVLogger`, `TensorBoardLogger`, `WandbLogger`, `MlflowLogger` or a class of yours with the
small protocol of `LoggerBackend`, named by ``_target_`` in YAML. Its place in the compatibility table is
`components.logger.declaration` (imported without torch); the owner loads on first use.
"""

from __future__ import annotations

from ..exports import lazy_exports

_EXPORTS = {
    "Logger": "base",
    "CLIENT_OPERATIONS": "base",
    "LoggerBackend": "backend",
    "backend_class": "backend",
    "LoggerConfig": "config",
    "LoggerClient": "client",
    "CSVLogger": "csv",
    "TensorBoardLogger": "tensorboard",
    "WandbLogger": "wandb",
    "MlflowLogger": "mlflow",
    "VideoRecorder": "video",
    "video_frames": "video",
    "write_gif": "video",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(n for n in _EXPORTS if not n.startswith("_"))
