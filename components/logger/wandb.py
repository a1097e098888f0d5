"""``WandbLogger``: the logger backend that writes into a Weights & Biases run, offline by default (the ``wandb``
extra): no account and no network, the run's files under the log directory, for ``wandb sync`` later."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional

from transports.kernel.errors import ConfigurationError
from transports.kernel.options import check_instance, one_of

from .backend import installed, save_run_id, saved_run_id

STEP = "global_step"
"""The key every record carries its step in: W&B's own ``_step`` counts records and only grows, while a logger's steps
(frames) may come in any order from several clients; every metric is plotted against this one instead."""

RUN_ID_FILE = "wandb_run_id"
"""The file in ``log_dir`` that keeps the run's id: a logger that opens there again (a resumed run) goes on in the
same W&B run."""


@dataclass
class WandbLogger:
    """``logger=wandb``: scalars, hyperparameters and videos into a W&B run (needs the ``wandb`` extra). Offline by
    default: the run's files, ``<log_dir>/wandb/offline-run-<time>-<id>/run-<id>.wandb``, wait there for
    ``wandb sync``. A logger backend (`LoggerBackend`), and the schema of ``logger=wandb``
    in YAML.

    Every record carries its step as ``global_step``, the x-axis of every metric. The run's resolved config is the
    W&B run's config; what a recipe logs as hyperparameters is added to it. A video is the file the logger wrote (MP4 or
    GIF), as a ``wandb.Video``.

    Attributes:
        log_dir: the directory W&B writes its ``wandb/`` folder into (in YAML: relative to the run directory).
        mode: ``offline`` (no account, no network) or ``online`` (needs ``wandb login`` or ``WANDB_API_KEY``).
        project: the W&B project.
        entity: the W&B user or team (``None``: the account's default).
        name: the run's display name (``None``: W&B picks one).
        group: a group to put the run in (``None``: none).
        run_config: set by the launcher: the run's resolved config, the W&B run's config.
    """

    log_dir: str = "."
    mode: str = one_of("offline", ("offline", "online"))
    project: str = "rl-services"
    entity: Optional[str] = None
    name: Optional[str] = None
    group: Optional[str] = None
    run_config: Optional[Dict[str, Any]] = None

    def __post_init__(self):
        check_instance(self, path="logger")
        self._run = None

    @classmethod
    def check_config(cls, options: Mapping[str, Any], path: str = "logger") -> None:
        """Refuse, while the run is planned, a machine without the wandb package.

        Raises:
            ConfigurationError: naming ``<path>._target_``.
        """
        if not installed("wandb"):
            raise ConfigurationError("logger=wandb needs the wandb package, which is not installed here: "
                                     "pip install '.[wandb]'", path=f"{path}._target_",
                                     alternatives=("csv", "tensorboard", "mlflow"))

    @property
    def run_id(self) -> str | None:
        """The W&B run's id (``None`` before the first ``open``)."""
        return saved_run_id(self.log_dir, RUN_ID_FILE)

    def open(self) -> None:
        """Start the W&B run (continuing the one this directory holds, if any); its config is ``run_config``.

        Raises:
            ConfigurationError: the wandb package is not installed.
        """
        try:
            import wandb
        except ImportError as exc:  # pragma: no cover - refused while planning (check_config)
            raise ConfigurationError("logger=wandb needs the wandb package: pip install '.[wandb]'",
                                     path="logger._target_") from exc
        if self.mode == "offline":  # the process's W&B settings too: no telemetry threads, nothing sent
            wandb.setup(settings=wandb.Settings(mode="offline"))
        previous = self.run_id
        hooks = sys.excepthook, sys.exit
        self._run = wandb.init(dir=os.path.abspath(self.log_dir), mode=self.mode, project=self.project,
                               entity=self.entity, name=self.name, group=self.group, config=self.run_config,
                               id=previous, resume="allow" if previous else None, reinit="create_new",
                               settings=wandb.Settings(console="off", silent=True))
        sys.excepthook, sys.exit = hooks  # W&B's exit hooks record an exit code for a run we finish ourselves
        if previous is None:
            save_run_id(self.log_dir, RUN_ID_FILE, self._run.id)
        self._run.define_metric(STEP)
        self._run.define_metric("*", step_metric=STEP)

    def close(self) -> None:
        """Finish the run; the W&B service process stops with the process's last run."""
        run, self._run = self._run, None
        if run is None:
            return
        import wandb

        run.finish()
        if wandb.setup().most_recent_active_run is None:
            wandb.teardown()

    def write_scalar(self, name: str, value: float, step: int | None) -> None:
        """One record: the scalar (and its step)."""
        self.write_metrics({name: value}, step)

    def write_metrics(self, values: Mapping[str, float], step: int | None) -> None:
        """One record: every scalar of the step."""
        self._run.log({**values, **({} if step is None else {STEP: int(step)})})

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Added to the run's config (a value set before is replaced)."""
        self._run.config.update(dict(hparams), allow_val_change=True)

    def write_video(self, name: str, path: str, step: int | None, fps: int) -> None:
        """One record: the video file as a ``wandb.Video`` (its frame rate is the file's)."""
        import wandb

        self._run.log({name: wandb.Video(path), **({} if step is None else {STEP: int(step)})})
