"""``CSVLogger``: the logger backend that writes scalars to a CSV file (and TensorBoard event files beside it, when
tensorboard is installed)."""

from __future__ import annotations

import csv
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from transports.kernel.options import bounded, check_instance

from .backend import quiet_writer_threads


@dataclass
class CSVLogger:
    """``logger=csv``: scalars to ``<log_dir>/metrics.csv`` (columns: tag, step, value, wall_time), hparams to
    ``hparams.json``; with ``tensorboard`` also TensorBoard event files under ``<log_dir>/tensorboard`` when the
    tensorboard package is installed. A logger backend (`LoggerBackend`), and the schema of
    ``logger=csv`` in YAML.

    Attributes:
        log_dir: output directory (in YAML: relative to the run directory).
        flush_every: rows between flushes (shutdown always flushes).
        flush_seconds: and at least this often, on a thread where the logger lives: a logger whose process is killed
            loses at most the rows of its last ``flush_seconds`` (and never more than ``flush_every``).
        tensorboard: also TensorBoard event files under ``<log_dir>/tensorboard``, if tensorboard is installed
            (skipped quietly if not).
        resume_step: the step a resumed run continues after (set by the launcher): rows of an existing
            ``metrics.csv`` with a later step are dropped when it opens, and TensorBoard hides later events.
    """

    log_dir: str = "."
    flush_every: int = bounded(100, ge=1)
    flush_seconds: float = bounded(5.0, gt=0, unit="seconds")
    tensorboard: bool = True
    resume_step: Optional[int] = bounded(None, ge=0)

    def __post_init__(self):
        check_instance(self, path="logger")
        self._file = None
        self._writer = None
        self._events = None  # a TensorBoard SummaryWriter beside the CSV, when the package is installed
        self._pending = 0

    @property
    def path(self) -> str:
        """The CSV file's path."""
        return os.path.join(self.log_dir, "metrics.csv")

    def open(self) -> None:
        """Open ``metrics.csv`` (dropping rows after ``resume_step``) and the TensorBoard writer."""
        new = not os.path.exists(self.path)
        if not new and self.resume_step is not None:
            drop_rows_after(self.path, self.resume_step)
        self._file = open(self.path, "a", newline="")
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(["tag", "step", "value", "wall_time"])
        if self.tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                return
            after = None if self.resume_step is None else self.resume_step + 1  # events from there on are hidden
            quiet_writer_threads()
            self._events = SummaryWriter(log_dir=os.path.join(self.log_dir, "tensorboard"), purge_step=after,
                                         flush_secs=max(1, math.ceil(self.flush_seconds)))

    def close(self) -> None:
        """Flush and close the file and the writer."""
        file, events, self._file, self._events = self._file, self._events, None, None
        try:
            if file is not None:
                file.close()  # flushes first
        finally:
            if events is not None:
                events.close()

    def write_scalar(self, name: str, value: float, step: int | None) -> None:
        """One CSV row (and one TensorBoard scalar)."""
        self._writer.writerow([name, "" if step is None else int(step), repr(value) if math.isfinite(value) else str(value),
                               f"{time.time():.3f}"])
        if self._events is not None:
            self._events.add_scalar(name, value, global_step=step)
        self._pending += 1
        if self._pending >= self.flush_every:
            self.flush()

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """``hparams.json`` (and a TensorBoard text)."""
        with open(os.path.join(self.log_dir, "hparams.json"), "w") as f:
            json.dump(hparams, f, indent=2, sort_keys=True)
        if self._events is not None:
            self._events.add_text("hparams", json.dumps(hparams, indent=2, sort_keys=True))

    def flush(self) -> None:
        """Push buffered rows and events to disk."""
        if self._file is not None:
            self._file.flush()
        if self._events is not None:
            self._events.flush()
        self._pending = 0


def drop_rows_after(path: str, step: int) -> int:
    """Rewrite the CSV at ``path`` without the rows whose step is after ``step`` (rows without a step stay);
    atomically, so an interrupted rewrite leaves the file as it was. Returns how many rows were dropped."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head, body = rows[:1], rows[1:]
    kept = [r for r in body if len(r) < 2 or r[1] == "" or not r[1].lstrip("-").isdigit() or int(r[1]) <= step]
    if len(kept) == len(body):
        return 0
    tmp = f"{path}.resume-tmp"
    with open(tmp, "w", newline="") as f:
        csv.writer(f).writerows(head + kept)
    os.replace(tmp, path)
    return len(body) - len(kept)
