"""``MlflowLogger``: the logger backend that writes into an MLflow run, in a local store by default (the ``mlflow``
extra): a SQLite database and an artifact folder under the log directory, no server."""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Mapping, Optional

from transports.kernel.errors import ConfigurationError
from transports.kernel.options import check_instance

from .backend import installed, save_run_id, saved_run_id

log = logging.getLogger(__name__)

DATABASES = ("sqlite", "postgresql", "mysql", "mssql")
"""The tracking URI schemes of MLflow's SQL stores (through SQLAlchemy; ``postgresql+psycopg2`` names a driver)."""

SCHEMES = ("file", "http", "https", "databricks", "databricks-uc", "uc") + DATABASES
"""The tracking URI schemes MLflow itself serves (a plugin may add more: the ``mlflow.tracking_store`` entry points)."""

RUN_ID_FILE = "mlflow_run_id"
"""The file in ``log_dir`` that keeps the run's id: a logger that opens there again (a resumed run) goes on in the
same MLflow run."""

MAX_BATCH = 100
"""Params one ``log_batch`` call takes at most (MLflow's limit; metrics: 1000)."""

MAX_VALUE = 6000
"""Characters of a param's value MLflow keeps at most (a longer one is cut, ending in ``...``)."""


@dataclass
class MlflowLogger:
    """``logger=mlflow``: scalars, hyperparameters and videos into an MLflow run (needs the ``mlflow`` extra). By
    default a local store: ``sqlite:///<log_dir>/mlflow.db`` with the artifacts in ``<log_dir>/mlartifacts``, read by
    ``mlflow.tracking.MlflowClient`` or ``mlflow ui --backend-store-uri sqlite:///<log_dir>/mlflow.db``. A logger
    backend (`LoggerBackend`), and the schema of ``logger=mlflow`` in YAML.

    Scalars are metrics (a step of ``None`` is step 0, as in MLflow), hyperparameters and the run's resolved config
    (flattened: ``recipe.lr``) are params, and a video is an artifact under ``videos/``.

    Attributes:
        log_dir: where the default store and the artifacts go (in YAML: relative to the run directory).
        tracking_uri: the MLflow tracking URI (``None``: ``sqlite:///<log_dir>/mlflow.db``). A relative path in a
            ``sqlite:///`` or ``file:`` URI is relative to ``log_dir``. A directory (``file:``) store needs
            ``MLFLOW_ALLOW_FILE_STORE=true``, MLflow's own opt-in.
        experiment: the experiment the run belongs to (made if missing).
        run_name: the run's name (``None``: MLflow picks one).
        run_config: set by the launcher: the run's resolved config, logged as params when the logger opens.
    """

    log_dir: str = "."
    tracking_uri: Optional[str] = None
    experiment: str = "rl-services"
    run_name: Optional[str] = None
    run_config: Optional[Dict[str, Any]] = None

    def __post_init__(self):
        check_instance(self, path="logger")
        self._client = None
        self._run_id: str | None = None

    @classmethod
    def check_config(cls, options: Mapping[str, Any], path: str = "logger") -> None:
        """Refuse, while the run is planned, a machine without the packages and a tracking URI MLflow cannot use.

        Raises:
            ConfigurationError: naming ``<path>._target_`` (a package) or ``<path>.tracking_uri``.
        """
        if not installed("mlflow"):
            raise ConfigurationError("logger=mlflow needs the mlflow package, which is not installed here: "
                                     "pip install '.[mlflow]'", path=f"{path}._target_",
                                     alternatives=("csv", "tensorboard", "wandb"))
        check_tracking_uri(options.get("tracking_uri"), f"{path}.tracking_uri")

    def store_uri(self) -> str:
        """The tracking URI this logger opens: ``tracking_uri`` with a relative local path made relative to
        ``log_dir``, or the default SQLite store there."""
        uri = self.tracking_uri or "sqlite:///mlflow.db"
        scheme = urllib.parse.urlparse(uri).scheme.split("+")[0]
        if scheme == "sqlite":
            where = uri[len("sqlite:///"):]
            return f"sqlite:///{os.path.join(os.path.abspath(self.log_dir), where)}"
        if scheme in ("", "file"):
            where = urllib.parse.urlparse(uri).path if scheme else uri
            return _file_uri(os.path.join(os.path.abspath(self.log_dir), where))
        return uri

    @property
    def run_id(self) -> str | None:
        """The MLflow run's id (``None`` before the first ``open``)."""
        return saved_run_id(self.log_dir, RUN_ID_FILE)

    def open(self) -> None:
        """Open the store and start the run (continuing the one this directory holds, if any); log ``run_config``.

        Raises:
            ConfigurationError: the mlflow package is not installed.
        """
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as exc:  # pragma: no cover - refused while planning (check_config)
            raise ConfigurationError("logger=mlflow needs the mlflow package: pip install '.[mlflow]'",
                                     path="logger._target_") from exc
        client = MlflowClient(tracking_uri=self.store_uri())
        previous = self.run_id
        if previous is not None:
            client.update_run(previous, status="RUNNING")
            self._run_id = previous
        else:
            found = client.get_experiment_by_name(self.experiment)
            experiment = found.experiment_id if found is not None else client.create_experiment(
                self.experiment, artifact_location=_file_uri(os.path.join(os.path.abspath(self.log_dir),
                                                                          "mlartifacts")))
            self._run_id = client.create_run(experiment, run_name=self.run_name).info.run_id
            save_run_id(self.log_dir, RUN_ID_FILE, self._run_id)
        self._client = client
        if self.run_config:
            self.write_hparams(dict(flatten(self.run_config)))

    def close(self) -> None:
        """End the run (``FINISHED``)."""
        client, self._client = self._client, None
        if client is not None:
            client.set_terminated(self._run_id)

    def write_scalar(self, name: str, value: float, step: int | None) -> None:
        """One metric value."""
        self.write_metrics({name: value}, step)

    def write_metrics(self, values: Mapping[str, float], step: int | None) -> None:
        """Every scalar of the step, in one batch."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._client.log_batch(self._run_id, metrics=[Metric(k, float(v), now, 0 if step is None else int(step))
                                                      for k, v in values.items()])

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Params (strings in MLflow). A param is set once: one logged again with the same value is skipped, and
        one with another value (a resumed run whose config changed) keeps the first and says so."""
        from mlflow.entities import Param

        before = self._client.get_run(self._run_id).data.params
        new = {k: _param_value(v) for k, v in hparams.items()}
        changed = sorted(k for k, v in new.items() if k in before and before[k] != v)
        if changed:
            log.warning("mlflow: the run's params %s keep their first values (an MLflow param is set once)",
                        ", ".join(changed))
        params = [Param(k, v) for k, v in new.items() if k not in before]
        for i in range(0, len(params), MAX_BATCH):
            self._client.log_batch(self._run_id, params=params[i:i + MAX_BATCH])

    def write_video(self, name: str, path: str, step: int | None, fps: int) -> None:
        """The video file, as an artifact under ``videos/``."""
        self._client.log_artifact(self._run_id, path, artifact_path="videos")


def check_tracking_uri(uri: Any, path: str) -> None:
    """Refuse a tracking URI MLflow has no store for, a ``sqlite`` URI without its path, and a directory store that
    MLflow would refuse (it needs ``MLFLOW_ALLOW_FILE_STORE=true``). ``None`` (the default store) passes.

    Raises:
        ConfigurationError: naming ``path``.
    """
    if uri is None:
        uri = "sqlite:///mlflow.db"
    if not isinstance(uri, str) or not uri.strip():
        raise ConfigurationError(f"{path} must be an MLflow tracking URI, got {uri!r}", path=path)
    scheme = urllib.parse.urlparse(uri).scheme
    base = scheme.split("+")[0]
    plugins = _plugin_schemes()
    if base not in SCHEMES and scheme not in plugins and not (scheme == "" and "://" not in uri):
        raise ConfigurationError(f"{path}={uri!r}: MLflow has no tracking store for the scheme {scheme!r}", path=path,
                                 alternatives=tuple(f"{s}:" for s in SCHEMES + tuple(plugins)))
    if base in DATABASES and not (installed("sqlalchemy") and installed("alembic")):
        raise ConfigurationError(f"{path}={uri!r}: MLflow's SQL stores need sqlalchemy and alembic: "
                                 "pip install '.[mlflow]'", path=path)
    if base == "sqlite" and not (uri.startswith("sqlite:///") and len(uri) > len("sqlite:///")):
        raise ConfigurationError(f"{path}={uri!r}: a SQLite store is sqlite:///<file> (relative to logger.log_dir) "
                                 "or sqlite:////<absolute file>", path=path)
    if scheme in ("", "file") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
        raise ConfigurationError(f"{path}={uri!r}: MLflow keeps its directory store for those who opt in "
                                 "(MLFLOW_ALLOW_FILE_STORE=true in the environment); the default is a SQLite file, "
                                 "sqlite:///mlflow.db", path=path)


def flatten(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` for every leaf of a nested mapping (``{"recipe": {"lr": 1}}`` -> ``recipe.lr``)."""
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flatten(value, f"{name}.")
        else:
            yield name, value


def _param_value(value: Any) -> str:
    """A param's text as MLflow stores it: numbers and strings as ``str``, the rest as JSON."""
    if value is None or isinstance(value, (str, int, float, bool)):
        text = str(value)
    else:
        try:
            text = json.dumps(value, sort_keys=True)
        except TypeError:
            text = repr(value)
    return text if len(text) <= MAX_VALUE else text[:MAX_VALUE - 3] + "..."


def _file_uri(path: str) -> str:
    return "file://" + urllib.parse.quote(path)


def _plugin_schemes() -> tuple[str, ...]:
    """The schemes of installed MLflow tracking store plugins."""
    from importlib.metadata import entry_points

    return tuple(ep.name for ep in entry_points(group="mlflow.tracking_store"))
