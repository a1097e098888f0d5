"""``TensorBoardLogger``: the logger backend that writes scalars and hyperparameters to TensorBoard event files (the
``tensorboard`` extra)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from transports.kernel.errors import ConfigurationError
from transports.kernel.options import bounded, check_instance

from .backend import installed, quiet_writer_threads


@dataclass
class TensorBoardLogger:
    """``logger=tensorboard``: scalars and hparams to TensorBoard event files in ``log_dir`` (needs the
    ``tensorboard`` extra). A logger backend (`LoggerBackend`), and the schema of
    ``logger=tensorboard`` in YAML.

    Attributes:
        log_dir: output directory of the event files (in YAML: relative to the run directory).
        flush_seconds: events reach the disk at least this often.
        resume_step: the step a resumed run continues after (set by the launcher): TensorBoard hides the events an
            earlier run wrote after it (``purge_step``).
    """

    log_dir: str = "tensorboard"
    flush_seconds: float = bounded(5.0, gt=0, unit="seconds")
    resume_step: Optional[int] = bounded(None, ge=0)

    def __post_init__(self):
        check_instance(self, path="logger")
        self._writer = None

    @classmethod
    def check_config(cls, options: Mapping[str, Any], path: str = "logger") -> None:
        """Refuse, while the run is planned, a machine without the tensorboard package.

        Raises:
            ConfigurationError: naming ``<path>._target_``.
        """
        if not installed("tensorboard"):
            raise ConfigurationError("the tensorboard logger needs the tensorboard package, which is not installed "
                                     "here: pip install '.[tensorboard]'", path=f"{path}._target_",
                                     alternatives=("csv",))

    def open(self) -> None:
        """Open the event writer.

        Raises:
            ConfigurationError: the tensorboard package is not installed.
        """
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

    def close(self) -> None:
        """Flush and close the writer."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()  # flushes first

    def write_scalar(self, name: str, value: float, step: int | None) -> None:
        """One scalar event."""
        self._writer.add_scalar(name, value, global_step=step)

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """The hparams as a text event."""
        self._writer.add_text("hparams", json.dumps(hparams, indent=2, sort_keys=True))

    def flush(self) -> None:
        """Push buffered events to disk."""
        self._writer.flush()
