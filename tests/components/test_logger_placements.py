"""Loggers in every placement: acknowledged calls, return values, remote errors, flush on every exit path."""

import csv
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from components.errors import PeerFailureError, RemoteError
from components.logger import CSVLogger, Logger, LoggerConfig, TensorBoardLogger, VideoRecorder

from tests.helpers import ROOT, decoded_video, default_sigint, wait_until
from tests.loggers import CustomLogger

PLACEMENTS = ["direct", "thread", "process"]


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_calls_are_acknowledged_with_return_values_and_errors(placement, tmp_path):
    with Logger(LoggerConfig(placement=placement), backend=CustomLogger(str(tmp_path), flush_every=1)) as owner:
        client = owner.client()
        assert client.log_scalar("loss", torch.tensor(1.5), step=3) is None
        # acknowledged: once the call returns, the row is on disk
        assert [(r["tag"], r["value"]) for r in _rows(tmp_path / "metrics.csv")] == [("loss", "1.5")]
        assert client.log_answer("forty-two") == 9  # a custom log_* method, with its return value
        with pytest.raises((KeyError, RemoteError), match="the SDK rejected this call") as info:
            client.log_broken()
        if placement != "direct":
            assert info.value.remote_type == "KeyError" and "log_broken" in info.value.remote_traceback
        client.log_metrics({"a": 1, "b": 2}, step=4)  # still serving
    assert [r["tag"] for r in _rows(tmp_path / "metrics.csv")] == ["loss", "answered", "a", "b"]


@pytest.mark.parametrize("placement", ["thread", "process"])
def test_clients_cannot_call_anything_but_logging(placement, tmp_path):
    with Logger(LoggerConfig(placement=placement), backend=CSVLogger(str(tmp_path))) as owner:
        client = owner.client()
        assert not hasattr(client, "shutdown") and not hasattr(client, "start")
        with pytest.raises(RemoteError, match="is not a client operation"):
            client._call("shutdown")
        assert owner.is_alive


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_shutdown_flushes_after_an_exception(placement, tmp_path):
    owner = Logger(LoggerConfig(placement=placement), backend=CSVLogger(str(tmp_path), flush_every=10_000)).start()
    with pytest.raises(ZeroDivisionError):
        try:
            client = owner.client()
            for step in range(20):
                client.log_scalar("x", step, step=step)
            1 / 0
        finally:
            owner.shutdown()
    assert [int(r["step"]) for r in _rows(tmp_path / "metrics.csv")] == list(range(20))


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_tensorboard_in_every_placement_reads_back(placement, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with Logger(LoggerConfig(placement=placement), backend=TensorBoardLogger(str(tmp_path))) as owner:
        client = owner.client()
        for step in range(3):
            client.log_scalar("r", float(step), step=step)
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("r")] == [(0, 0.0), (1, 1.0), (2, 2.0)]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_log_video_writes_the_artifact_before_returning(placement, tmp_path):
    with Logger(LoggerConfig(placement=placement), backend=CSVLogger(str(tmp_path))) as owner:
        client = owner.client()
        video = torch.randint(0, 255, (5, 3, 16, 12), dtype=torch.uint8)
        path = client.log_video("eval/video", video, step=7, fps=10)
        assert os.path.exists(path) and path.endswith("eval_video_7.mp4")  # the video extra's encoder is installed
        assert decoded_video(path) == (5, (12, 16))
        grid = client.log_video("eval/grid", torch.zeros((4, 2, 3, 8, 8), dtype=torch.uint8), step=1)
        assert decoded_video(grid) == (2, (16, 16))  # 4 videos as a 2 x 2 grid
        odd = client.log_video("eval/odd", torch.zeros((3, 1, 7, 9), dtype=torch.uint8), step=1)
        assert decoded_video(odd) == (3, (10, 8))  # padded to even sides for the encoder
        with pytest.raises(TypeError, match="uint8"):
            client.log_video("bad", torch.zeros(5, 3, 8, 8))


def test_video_recorder_uses_an_owners_client(tmp_path):
    with Logger(LoggerConfig(placement="process"), backend=CSVLogger(str(tmp_path))) as owner:
        recorder = VideoRecorder(owner, tag="rollout", fps=20)
        assert not hasattr(recorder.logger, "shutdown")
        for t in range(6):
            recorder.record(torch.full((2, 10, 10, 3), t * 20, dtype=torch.uint8))  # 2 envs at once
        path = recorder.flush(step=2)
        assert decoded_video(path) == (6, (20, 10))  # 2 envs side by side
        assert recorder.flush() is None


def test_without_an_mp4_encoder_videos_are_gifs(tmp_path, monkeypatch):
    from components.logger import video

    monkeypatch.setattr(video, "can_write_mp4", lambda: False)
    frames = torch.arange(4, dtype=torch.uint8).mul(60).view(4, 1, 1, 1).expand(4, 6, 6, 3).contiguous()
    path = video.write_video(frames, str(tmp_path / "clip"), fps=5)
    assert path.endswith("clip.gif") and decoded_video(path) == (4, (6, 6))


def test_peer_failure_after_kill_9(tmp_path):
    owner = Logger(LoggerConfig(placement="process"), backend=CSVLogger(str(tmp_path))).start()
    try:
        client = owner.client()
        client.log_scalar("a", 1.0)
        os.kill(owner.host.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(PeerFailureError):
            client.log_scalar("a", 2.0)
        assert time.monotonic() - start < 2.0
    finally:
        owner.shutdown()


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_rows_reach_the_disk_every_flush_seconds_and_survive_a_kill(placement, tmp_path):
    # flush_every alone would hold these rows in memory: the logger's own thread writes them out within
    # flush_seconds, so a logger process killed outright loses only its last seconds
    owner = Logger(LoggerConfig(placement=placement),
                   backend=CSVLogger(str(tmp_path), flush_every=1_000_000, flush_seconds=0.2)).start()
    try:
        client = owner.client()
        for step in range(5):
            client.log_scalar("x", step, step=step)
        wait_until(lambda: len(_rows(tmp_path / "metrics.csv")) == 5, timeout=10, what="rows flushed on the timer")
        if placement == "process":
            pid = owner.all_hosts()[0].pid
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not owner.is_alive, timeout=10, what="the logger's death")
            assert [int(r["step"]) for r in _rows(tmp_path / "metrics.csv")] == list(range(5))
    finally:
        owner.shutdown()


SIGINT_SCRIPT = """
import sys, time
from components.logger import CSVLogger, Logger, LoggerConfig
owner = Logger(LoggerConfig(placement="process"), backend=CSVLogger(sys.argv[1], flush_every=100000)).start()
client = owner.client()
try:
    for step in range(10**9):
        client.log_scalar("x", step, step=step)
        if step == 50:
            print("ready", flush=True)
        time.sleep(0.001)
finally:
    owner.shutdown()
"""


@pytest.mark.slow  # a real interpreter, interrupted like Ctrl-C
def test_sigint_flushes_a_process_logger(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", SIGINT_SCRIPT, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=default_sigint)
    try:
        assert proc.stdout.readline().strip() == "ready"
        os.killpg(proc.pid, signal.SIGINT)  # like Ctrl-C: the whole process group
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    steps = [int(r["step"]) for r in _rows(tmp_path / "metrics.csv")]
    assert len(steps) > 50 and steps == list(range(len(steps)))
