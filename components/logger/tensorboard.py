"""``TensorBoardLogger``: scalars and hyperparameters to TensorBoard event files (the ``tensorboard`` extra)."""

from __future__ import annotations

import json
from typing import Any, Mapping

from transports.kernel.errors import ConfigurationError

from ..resolution import Resolved
from .base import Logger, quiet_writer_threads
from .config import TensorBoardLoggerConfig


class TensorBoardLogger(Logger):
    """Scalars and hparams to TensorBoard event files in ``log_dir`` (needs the ``tensorboard`` extra);
    videos to ``<log_dir>/videos/*.gif``.

    Args:
        log_dir: output directory of the event files.
        resume_step: the step a resumed run continues after (set by the launcher): TensorBoard hides the events
            an earlier run wrote after it (``purge_step``).
        flush_seconds: events reach the disk at least this often.
        placement: where the logger lives.
        transport: transport kind.
    """

    def __init__(self, log_dir: str = TensorBoardLoggerConfig.log_dir,
                 resume_step: int | None = TensorBoardLoggerConfig.resume_step,
                 flush_seconds: float = TensorBoardLoggerConfig.flush_seconds, *, placement: str | None = None,
                 transport=None, resolved: Resolved | None = None):
        super().__init__(log_dir, placement=placement, transport=transport, resolved=resolved, resume_step=resume_step,
                         flush_seconds=flush_seconds)
        self.resume_step, self.flush_seconds = resume_step, flush_seconds
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
        after = None if self.resume_step is None else self.resume_step + 1  # events from there on are hidden
        quiet_writer_threads()
        self._writer = SummaryWriter(log_dir=self.log_dir, purge_step=after)

    def _close(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()  # flushes first

    def _write_scalar(self, name: str, value: float, step: int | None) -> None:
        self._writer.add_scalar(name, value, global_step=step)

    def _write_hparams(self, hparams: Mapping[str, Any]) -> None:
        self._writer.add_text("hparams", json.dumps(hparams, indent=2, sort_keys=True))

    def _flush(self) -> None:
        self._writer.flush()


