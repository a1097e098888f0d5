"""Loggers write real files; the tests read them back (CSV, and TensorBoard event files)."""

import csv
import json
import math

import pytest
import torch

from components.logger import CSVLogger, Logger, LoggerConfig, TensorBoardLogger


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_csv_logger_writes_scalars_metrics_and_hparams(tmp_path):
    with Logger(LoggerConfig(), backend=CSVLogger(str(tmp_path), flush_every=1000)) as logger:
        logger.log_scalar("train/loss", torch.tensor(0.5), step=1)
        logger.log_metrics({"a": 1, "b": 2.5}, step=2)
        logger.log_hparams({"lr": 0.001, "layers": [64, 64]})
    rows = _rows(tmp_path / "metrics.csv")
    assert [(r["tag"], r["step"], float(r["value"])) for r in rows] == [("train/loss", "1", 0.5), ("a", "2", 1.0), ("b", "2", 2.5)]
    assert json.loads((tmp_path / "hparams.json").read_text()) == {"lr": 0.001, "layers": "[64, 64]"}


def test_csv_logger_flushes_on_shutdown_after_an_exception(tmp_path):
    logger = Logger(LoggerConfig(), backend=CSVLogger(str(tmp_path), flush_every=1000)).start()
    with pytest.raises(ZeroDivisionError):
        try:
            for step in range(10):
                logger.log_scalar("x", step, step=step)
            1 / 0
        finally:
            logger.shutdown()
    assert [int(r["step"]) for r in _rows(tmp_path / "metrics.csv")] == list(range(10))


def test_csv_logger_raises_at_the_call_site_and_keeps_serving(tmp_path):
    with Logger(LoggerConfig(), backend=CSVLogger(str(tmp_path))) as logger:
        with pytest.raises(TypeError, match="must be a number"):
            logger.log_scalar("bad", "not a number")
        logger.log_scalar("good", float("nan"), step=0)
    rows = _rows(tmp_path / "metrics.csv")
    assert len(rows) == 1 and rows[0]["tag"] == "good" and math.isnan(float(rows[0]["value"]))


def test_tensorboard_logger_event_files_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Logger(LoggerConfig(), backend=TensorBoardLogger(str(tmp_path))) as logger:
        for step in range(5):
            logger.log_scalar("train/return", step * 10.0, step=step)
        logger.log_metrics({"loss/value": 3.0}, step=4)
        logger.log_hparams({"lr": 0.01})
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/return")] == [(s, s * 10.0) for s in range(5)]
    assert [e.value for e in acc.Scalars("loss/value")] == [3.0]


def test_csv_logger_also_writes_tensorboard_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Logger(LoggerConfig(), backend=CSVLogger(str(tmp_path))) as logger:
        logger.log_metrics({"train/mean_return": 10.0}, step=5)
    assert _rows(tmp_path / "metrics.csv")[0]["value"] == "10.0"
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/mean_return")] == [(5, 10.0)]
    with Logger(LoggerConfig(), backend=CSVLogger(str(tmp_path / "plain"), tensorboard=False)) as logger:
        logger.log_scalar("x", 1.0)
    assert not (tmp_path / "plain" / "tensorboard").exists()


USER_BACKEND = '''
import os


class Lines:
    """A user's logger backend: one line per scalar."""

    def __init__(self, log_dir=".", prefix=""):
        self.log_dir, self.prefix, self.file = log_dir, prefix, None

    def open(self):
        self.file = open(os.path.join(self.log_dir, "lines.txt"), "a")

    def close(self):
        self.file.close()

    def write_scalar(self, name, value, step):
        self.file.write(f"{self.prefix}{name} {value} {step}\\n")

    def write_hparams(self, hparams):
        self.file.write(f"{self.prefix}hparams {sorted(hparams)}\\n")

    def log_twice(self, name, value):
        self.write_scalar(name, value, None)
        self.write_scalar(name, value, None)
        return 2
'''


@pytest.mark.parametrize("placement", ["direct", "thread"])
def test_a_user_backend_from_a_module_of_its_own_is_selected_in_yaml_written_to_and_read_back(
        compose_cfg, tmp_path, monkeypatch, placement):
    from components.logger import Logger, LoggerConfig, backend_class
    from components.targets import instantiate_target

    module = f"user_backend_{placement}"
    (tmp_path / f"{module}.py").write_text(USER_BACKEND)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "conf" / "logger").mkdir(parents=True)
    (tmp_path / "conf" / "logger" / "lines.yaml").write_text(f"_target_: {module}.Lines\nlog_dir: .\nprefix: 'u/'\n")
    cfg = compose_cfg("+recipe=ppo", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "logger=lines")
    assert backend_class(cfg.logger).__module__ == module
    backend = instantiate_target(cfg.logger, "logger", log_dir=str(tmp_path / "run"))
    with Logger(LoggerConfig(placement=placement), backend=backend) as logger:
        client = logger.client()
        client.log_scalar("loss", torch.tensor(0.5), step=3)
        client.log_hparams({"lr": 0.1})
        assert client.log_twice("x", 1.0) == 2  # the backend's own log_* method, through the client
    lines = (tmp_path / "run" / "lines.txt").read_text().splitlines()
    assert lines == ["u/loss 0.5 3", "u/hparams ['lr']", "u/x 1.0 None", "u/x 1.0 None"]


def test_an_object_without_the_backend_protocol_is_refused(tmp_path):
    from components.errors import ConfigurationError
    from components.logger import Logger

    with pytest.raises(ConfigurationError, match="lacks open, close, write_scalar, write_hparams"):
        Logger(backend=object())
