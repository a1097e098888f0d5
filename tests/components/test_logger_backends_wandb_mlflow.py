"""``logger=wandb`` and ``logger=mlflow``: what the logger service writes is read back through each library's own
reader (W&B's offline transaction log, decoded into W&B's own protobuf records; MLflow's ``MlflowClient``), in the
placements the table allows; a missing package or a tracking URI MLflow cannot use is refused while planning."""

from __future__ import annotations

import glob
import json
import os
import struct
import sys
import urllib.parse
import zlib

import pytest
import torch

from components.logger import Logger, LoggerConfig, MlflowLogger, WandbLogger
from transports.kernel.errors import ConfigurationError

from tests.helpers import cli_in_process, decoded_video, wait_until

TINY = ("+recipe=ppo", "recipe.num_envs=4", "recipe.num_steps=16", "recipe.total_frames=128",
        "recipe.target_return=null", "launcher.progress=false", "launcher.plot=false")
RUN_CONFIG = {"recipe": {"lr": 0.001, "network": {"_target_": "my_pkg.nets.make_net", "width": 64}},
              "env": {"id": "CartPole-v1"}, "seed": 3, "layers": [64, 64]}
VIDEO = torch.arange(4 * 3 * 8 * 8, dtype=torch.int64).remainder(251).to(torch.uint8).reshape(4, 3, 8, 8)


def _write(client) -> None:
    """What a recipe and an evaluator write: scalars at steps out of order, a step's metrics, hparams, a video."""
    client.log_scalar("train/loss", 0.5, step=200)
    client.log_scalar("train/loss", 1.0, step=100)  # an older step, from another client
    client.log_metrics({"train/mean_return": 9.5, "train/fps": 1000}, step=200)
    client.log_hparams({"lr": 0.001, "name": "ppo"})
    client.log_video("eval/video", VIDEO, step=300, fps=4)


# ---------------------------------------------------------------------------------------------- W&B offline files
LEVELDB_BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: str) -> list:
    """The records of an offline run's ``run-<id>.wandb`` file, as W&B's own ``Record`` protobufs.

    The ``.wandb`` transaction log is what ``wandb sync`` uploads: a 7-byte header (``:W&B``, 0xBEE1, version 0)
    then LevelDB's log format (32 KiB blocks of records with a CRC-32, a length and a type; a record split over
    blocks comes in FIRST/MIDDLE/LAST pieces). Every checksum is checked."""
    from wandb.proto import wandb_internal_pb2

    data = open(path, "rb").read()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(data):  # each pass moves pos forward
        left = LEVELDB_BLOCK - pos % LEVELDB_BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"bad checksum at byte {pos}"
        pos += 7 + length
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    assert pos == len(data)
    return records


def _items(items) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def _wandb_runs(run_dir: str) -> list[dict]:
    """What each offline run directory under ``run_dir`` holds (one per time the logger opened there)."""
    return [_wandb_run(os.path.dirname(path))
            for path in glob.glob(os.path.join(run_dir, "wandb", "offline-run-*", "run-*.wandb"))]


def _one_wandb_run(run_dir: str) -> dict:
    (run,) = _wandb_runs(run_dir)
    return run


def _wandb_run(offline_dir: str) -> dict:
    """What one offline run directory holds: its config, its history rows, whether it ended, its files directory."""
    (path,) = glob.glob(os.path.join(offline_dir, "run-*.wandb"))
    records = wandb_records(path)
    kinds = [r.WhichOneof("record_type") for r in records]
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = _items(run.config.update)
    for r in records:
        if r.WhichOneof("record_type") == "config":
            config.update(_items(r.config.update))
    files = os.path.join(offline_dir, "files")
    return {"id": run.run_id, "config": config, "ended": "exit" in kinds, "files": files,
            "history": [_items(r.history.item) for r in records if r.WhichOneof("record_type") == "history"]}


def _wandb_services() -> dict[int, int]:
    """W&B service processes on this machine: ``{pid: the pid of the process it serves}``."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"wandb-core") and b"--pid" in argv:
            found[int(pid)] = int(argv[argv.index(b"--pid") + 1])
    return found


def _no_wandb_service_left() -> None:
    """None serves this process, and none is left serving a process that is gone (a logger process's)."""
    wait_until(lambda: not [p for p, served in _wandb_services().items()
                            if served == os.getpid() or not os.path.exists(f"/proc/{served}")],
               timeout=30, what="the W&B service processes to end")


def _check_wandb_run(run_dir: str) -> None:
    run = _one_wandb_run(run_dir)
    assert run["ended"] and run["id"] == open(os.path.join(run_dir, "wandb_run_id")).read()
    assert run["config"]["recipe"] == RUN_CONFIG["recipe"] and run["config"]["layers"] == [64, 64]  # resolved config
    assert run["config"]["lr"] == 0.001 and run["config"]["name"] == "ppo"  # log_hparams
    rows = run["history"]
    assert [(r["global_step"], r["train/loss"]) for r in rows if "train/loss" in r] == [(200, 0.5), (100, 1.0)]
    (step,) = [r for r in rows if "train/mean_return" in r]  # one record for the step's metrics
    assert (step["global_step"], step["train/mean_return"], step["train/fps"]) == (200, 9.5, 1000)
    (video,) = [r for r in rows if "eval/video/_type" in r]
    assert video["eval/video/_type"] == "video-file" and video["global_step"] == 300
    assert decoded_video(os.path.join(run["files"], video["eval/video/path"])) == (4, (8, 8))


@pytest.mark.parametrize("placement", ["direct", "thread"])
def test_wandb_offline_run_carries_scalars_config_hparams_and_a_video(placement, tmp_path):
    backend = WandbLogger(str(tmp_path), run_config=RUN_CONFIG)
    with Logger(LoggerConfig(placement=placement), backend=backend) as owner:
        hooks = sys.excepthook, sys.exit
        _write(owner.client())
        assert (sys.excepthook, sys.exit) == hooks  # W&B's exit hooks are not left in this process
    _check_wandb_run(str(tmp_path))
    _no_wandb_service_left()


@pytest.mark.slow
def test_wandb_offline_run_from_a_logger_process(tmp_path):
    with Logger(LoggerConfig(placement="process"), backend=WandbLogger(str(tmp_path), run_config=RUN_CONFIG)) as owner:
        _write(owner.client())
    _check_wandb_run(str(tmp_path))
    _no_wandb_service_left()


def test_wandb_logger_opened_again_goes_on_in_the_same_run(tmp_path):
    with Logger(backend=WandbLogger(str(tmp_path), run_config={"seed": 1})) as owner:
        owner.log_scalar("x", 1.0, step=1)
    with Logger(backend=WandbLogger(str(tmp_path), run_config={"seed": 1})) as owner:  # a resumed run
        owner.log_scalar("x", 2.0, step=2)
    runs = _wandb_runs(str(tmp_path))  # one offline directory per opening, both of the one run, for wandb sync
    assert len(runs) == 2 and {run["id"] for run in runs} == {open(tmp_path / "wandb_run_id").read()}
    assert sorted((row["global_step"], row["x"]) for run in runs for row in run["history"]) == [(1, 1.0), (2, 2.0)]
    assert all(run["ended"] and run["config"]["seed"] == 1 for run in runs)
    _no_wandb_service_left()


# ---------------------------------------------------------------------------------------------- MLflow local store
def _check_mlflow_run(backend: MlflowLogger) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=backend.store_uri())
    run = client.get_run(backend.run_id)
    assert run.info.status == "FINISHED" and run.info.run_id == open(os.path.join(backend.log_dir,
                                                                                  "mlflow_run_id")).read()
    params = run.data.params
    assert params["recipe.lr"] == "0.001" and params["recipe.network._target_"] == "my_pkg.nets.make_net"
    assert params["layers"] == "[64, 64]" and params["seed"] == "3"  # the resolved config, flattened
    assert params["lr"] == "0.001" and params["name"] == "ppo"  # log_hparams
    history = {name: [(m.step, m.value) for m in client.get_metric_history(backend.run_id, name)]
               for name in ("train/loss", "train/mean_return", "train/fps")}
    assert history == {"train/loss": [(200, 0.5), (100, 1.0)], "train/mean_return": [(200, 9.5)],
                       "train/fps": [(200, 1000.0)]}
    (video,) = client.list_artifacts(backend.run_id, "videos")
    assert os.path.splitext(video.path)[0] == "videos/eval_video_300"  # MP4, or GIF without an encoder
    where = urllib.parse.urlparse(run.info.artifact_uri)  # a file: URI: the local store's artifacts
    assert where.scheme == "file" and where.path.startswith(os.path.abspath(backend.log_dir))
    assert decoded_video(os.path.join(urllib.parse.unquote(where.path), video.path)) == (4, (8, 8))


@pytest.mark.parametrize("placement", ["direct", "thread"])
def test_mlflow_local_store_carries_scalars_config_hparams_and_a_video(placement, tmp_path):
    backend = MlflowLogger(str(tmp_path), run_config=RUN_CONFIG)
    with Logger(LoggerConfig(placement=placement), backend=backend) as owner:
        _write(owner.client())
    assert backend.store_uri() == f"sqlite:///{tmp_path}/mlflow.db"  # the default store, in the log directory
    assert os.path.isdir(tmp_path / "mlartifacts")
    _check_mlflow_run(backend)


@pytest.mark.slow
def test_mlflow_local_store_from_a_logger_process(tmp_path):
    backend = MlflowLogger(str(tmp_path), run_config=RUN_CONFIG, tracking_uri="sqlite:///store/runs.db")
    with Logger(LoggerConfig(placement="process"), backend=backend) as owner:
        _write(owner.client())
    assert os.path.exists(tmp_path / "store" / "runs.db")  # a relative path: relative to the log directory
    _check_mlflow_run(backend)


def test_mlflow_logger_opened_again_goes_on_in_the_same_run(tmp_path):
    from mlflow.tracking import MlflowClient

    first = MlflowLogger(str(tmp_path), run_config={"seed": 1})
    with Logger(backend=first) as owner:
        owner.log_scalar("x", 1.0, step=1)
    again = MlflowLogger(str(tmp_path), run_config={"seed": 2})  # a resumed run whose seed changed
    with Logger(backend=again) as owner:
        owner.log_scalar("x", 2.0, step=2)
    assert again.run_id == first.run_id
    client = MlflowClient(tracking_uri=again.store_uri())
    assert [(m.step, m.value) for m in client.get_metric_history(again.run_id, "x")] == [(1, 1.0), (2, 2.0)]
    run = client.get_run(again.run_id)
    assert run.data.params["seed"] == "1" and run.info.status == "FINISHED"  # a param is set once


# ---------------------------------------------------------------------------------------------- through the launcher
@pytest.mark.parametrize("backend", ["wandb", "mlflow"])
def test_a_run_logs_its_resolved_config_and_learning_curve(backend, compose_cfg, tmp_path):
    from launcher.cli import launch

    result = launch(compose_cfg(*TINY, f"logger={backend}"), str(tmp_path))
    curve = [(int(frames), float(value)) for frames, value in result["curve"]]
    assert len(curve) >= 1
    if backend == "wandb":
        run = _one_wandb_run(str(tmp_path))
        config, rows = run["config"], run["history"]
        assert config["recipe"]["total_frames"] == 128 and config["logger"]["_target_"].endswith("WandbLogger")
        assert config["total_frames"] == 128  # the recipe's own hparams beside it
        logged = [(r["global_step"], r["train/mean_return"]) for r in rows if "train/mean_return" in r]
        _no_wandb_service_left()
    else:
        from mlflow.tracking import MlflowClient

        store = MlflowLogger(str(tmp_path))
        client = MlflowClient(tracking_uri=store.store_uri())
        params = client.get_run(store.run_id).data.params
        assert params["recipe.total_frames"] == "128" and params["total_frames"] == "128"
        assert params["logger._target_"].endswith("MlflowLogger")
        logged = [(m.step, m.value) for m in client.get_metric_history(store.run_id, "train/mean_return")]
    assert [(f, v) for f, v in logged if v == v] == curve  # the learning curve, point for point (NaN: no episode yet)


# ---------------------------------------------------------------------------------------------- refused while planning
def _planning_error(*argv: str) -> ConfigurationError:
    from launcher.plan import build_plan
    from launcher.preflight import check_argv

    with pytest.raises(ConfigurationError) as info:
        for cfg in check_argv(["+recipe=ppo", *argv]):
            build_plan(cfg)
    return info.value


@pytest.mark.parametrize("backend, package, key", [
    ("wandb", "wandb", "logger._target_"), ("mlflow", "mlflow", "logger._target_"),
    ("mlflow", "sqlalchemy", "logger.tracking_uri"),  # the default store is a SQLite file
    ("tensorboard", "tensorboard", "logger._target_"),  # refused the same way, no longer only once it opens
])
def test_a_missing_package_is_refused_while_planning_naming_the_key(backend, package, key, monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)  # as if it were not installed: importing it fails
    error = _planning_error(f"logger={backend}")
    assert error.path == key and "pip install '.[" in str(error), str(error)


@pytest.mark.parametrize("uri, said", [
    ("bogus://host/x", "no tracking store for the scheme 'bogus'"),
    ("sqlite://runs.db", "a SQLite store is sqlite:///<file>"),
    ("file:mlruns", "MLFLOW_ALLOW_FILE_STORE=true"),
    ("mlruns", "MLFLOW_ALLOW_FILE_STORE=true"),
])
def test_a_tracking_uri_mlflow_cannot_use_is_refused_while_planning(uri, said, monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    error = _planning_error("logger=mlflow", f"logger.tracking_uri={uri}")
    assert error.path == "logger.tracking_uri" and said in str(error), str(error)


def test_a_directory_store_plans_once_opted_in_and_the_cli_names_a_bad_uri(monkeypatch, tmp_path):
    from launcher.plan import build_plan
    from launcher.preflight import check_argv

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    (cfg,) = check_argv(["+recipe=ppo", "logger=mlflow", "logger.tracking_uri=file:mlruns"])
    assert build_plan(cfg).logger["tracking_uri"] == "file:mlruns"
    proc = cli_in_process("+recipe=ppo", "logger=mlflow", "logger.tracking_uri=bogus://x", "launcher.dry_run=true",
                          cwd=str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.rstrip().endswith("full_key: logger.tracking_uri"), proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing started

