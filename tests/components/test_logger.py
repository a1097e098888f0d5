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
