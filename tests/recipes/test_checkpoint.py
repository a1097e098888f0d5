"""Checkpoint and resume: the :class:`~launcher.checkpointing.Checkpoint` a recipe gets (snapshots, atomic files,
what it refuses), the services a resumed run starts where the checkpoint left off, and whole runs through the launcher:
in this process (see test_every_placement.py) and one real ``python -m launcher`` stopped with Ctrl-C, then resumed.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from components.errors import ConfigurationError
from components.logger.csv import drop_rows_after
from components.weight_sync import WeightSync, WeightSyncConfig
from launcher.checkpointing import Checkpoint, decode, encode, load, resolve
from launcher.cli import launch
from launcher.failures import Terminated
from launcher.plan import build_plan
from launcher.preflight import check_argv
from launcher.run import execute
from recipes.base import EpisodeStats
from tests.helpers import ROOT, popen_cli, wait_until


# ---------------------------------------------------------------------------------------------- the recipe's side
def test_a_checkpoint_writes_every_n_frames_a_copy_taken_at_the_boundary(tmp_path):
    path = str(tmp_path / "checkpoint.pt")
    weights = torch.zeros(3)
    checkpoint = Checkpoint(path, every=100)
    assert checkpoint.step(60, lambda: {"w": weights}, policy_version=1) is False  # not due yet
    assert not os.path.exists(path)
    assert checkpoint.step(120, lambda: {"w": weights}, policy_version=2) is True
    weights += 7  # training goes on after the boundary: the snapshot keeps the boundary's values
    assert checkpoint.save() is True
    saved = load(path)
    assert (saved["frames"], saved["policy_version"], saved["finished"]) == (120, 2, None)
    assert torch.equal(saved["recipe"]["w"], torch.zeros(3))
    resumed = Checkpoint(path, every=100, restored=saved)
    assert torch.equal(resumed.restore()["w"], torch.zeros(3)) and resumed.frames == 120
    assert resumed.step(180, lambda: {"w": weights}) is False  # the next write is due at 200, not at 220
    assert resumed.step(200, lambda: {"w": weights}) is True and load(path)["policy_version"] == 2


def test_the_default_checkpoint_never_writes_and_restores_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    checkpoint = Checkpoint()
    assert checkpoint.restore() is None
    assert checkpoint.step(10**6, lambda: {"w": torch.ones(1)}) is False and checkpoint.save() is False
    assert os.listdir(tmp_path) == []


def test_state_that_is_not_plain_data_is_refused_before_anything_is_written(tmp_path):
    checkpoint = Checkpoint(str(tmp_path / "checkpoint.pt"), every=1)
    with pytest.raises(TypeError, match=r"recipe\['net'\] is a Linear"):
        checkpoint.step(1, lambda: {"net": torch.nn.Linear(2, 2)})
    with pytest.raises(TypeError, match=r"recipe\['hooks'\]\[0\] is a function"):
        checkpoint.step(1, lambda: {"hooks": [lambda: None]})
    assert os.listdir(tmp_path) == []


def test_tensordicts_and_numpy_arrays_come_back_and_loading_runs_no_pickled_code(tmp_path):
    td = TensorDict({"obs": torch.randn(4, 2), "next": {"done": torch.zeros(4, dtype=torch.bool)}}, [4])
    state = {"td": td, "tree": np.arange(5.0), "pair": (1, 2.5), "none": None, "n": np.int64(3)}
    back = decode(encode(state))
    assert (back["td"] == td).all() and back["td"].batch_size == td.batch_size
    assert np.array_equal(back["tree"], np.arange(5.0)) and back["pair"] == (1, 2.5) and back["n"] == 3
    torch.save({"format": 1, "payload": Pickled()}, tmp_path / "evil.pt")  # an object that would run code on load
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load(str(tmp_path / "evil.pt"))
    assert not (tmp_path / "ran").exists()


class Pickled:
    def __reduce__(self):
        return (open, (os.path.join(os.getcwd(), "ran"), "w"))


WRITE_PAST_A_SIZE_LIMIT = """
import os, resource, signal, sys, torch
from launcher.checkpointing import Checkpoint
path = sys.argv[1]
Checkpoint(path, every=1).step(1, lambda: {"w": torch.zeros(10)})  # a small, good checkpoint
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit, a write fails with EFBIG (as on a full disk)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    Checkpoint(path, every=1).step(2, lambda: {"w": torch.zeros(1_000_000)})
except OSError as exc:
    print("failed:", exc)
"""


@pytest.mark.slow  # a spawned interpreter imports torch: seconds
def test_a_write_that_fails_midway_leaves_the_previous_checkpoint_whole(tmp_path):
    path = tmp_path / "checkpoint.pt"
    proc = subprocess.run([sys.executable, "-c", WRITE_PAST_A_SIZE_LIMIT, str(path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "File too large" in proc.stdout, proc.stderr
    saved = load(str(path))
    assert saved["frames"] == 1 and torch.equal(saved["recipe"]["w"], torch.zeros(10))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt"]  # no partial temporary file either


def test_episode_stats_continue_where_they_stopped():
    stats = EpisodeStats(window=3)
    stats.frames, stats.episodes, stats.solved_at = 640, 9, None
    stats.returns.extend([10.0, 20.0, 30.0])
    stats.curve = [(320, 12.0), (640, 20.0)]
    state = stats.state_dict()
    other = EpisodeStats(window=3)
    other.load_state_dict(decode(encode(state)))
    assert (other.frames, other.episodes, list(other.returns), other.curve) == (640, 9, [10.0, 20.0, 30.0],
                                                                                  [(320, 12.0), (640, 20.0)])
    assert other.result()["wall_seconds"] >= state["elapsed"] > 0  # frames/s counts the earlier time too


def test_steady_frames_per_second_leave_out_the_first_batch():
    stats = EpisodeStats(window=3)
    now = [100.0]
    stats._clock = lambda: now[0]
    stats.start = now[0]
    batch = TensorDict({"next": {"episode_return": torch.zeros(4, 2), "done": torch.zeros(4, 2, dtype=torch.bool)}},
                       batch_size=[4, 2])
    now[0] += 10.0  # a slow start: the first batch of 8 frames takes 10 s
    stats.update(batch)
    now[0] += 1.0
    stats.update(batch)
    assert stats.result()["steady_fps"] is None  # no whole round after the start yet
    for _ in range(3):  # then 8 frames every second
        now[0] += 1.0
        stats.update(batch)
    now[0] += 5.0  # the last batch learned from, the services stopped: not a round
    result = stats.result()
    assert result["fps"] == pytest.approx(40 / 19)
    assert result["steady_fps"] == pytest.approx(24 / 3)  # from the second batch's count to the last's


def test_metrics_after_the_resume_step_are_dropped(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("tag,step,value,wall_time\na,512,1.0,1\nb,,2.0,1\na,1024,3.0,2\na,1536,4.0,3\n")
    assert drop_rows_after(str(path), 1024) == 1
    assert path.read_text().splitlines() == ["tag,step,value,wall_time", "a,512,1.0,1", "b,,2.0,1", "a,1024,3.0,2"]


SYNCS = [("direct", None), ("process", None), pytest.param("process", "distributed", marks=pytest.mark.slow),
         pytest.param("ray", None, marks=pytest.mark.slow)]


@pytest.mark.parametrize("placement, transport", SYNCS, ids=["direct", "process", "process-distributed", "ray"])
def test_weight_sync_versions_go_on_from_the_checkpoints(placement, transport, request):
    if placement == "ray":
        request.getfixturevalue("ray_cluster")
    weights = {"w": torch.ones(2)}
    with WeightSync(WeightSyncConfig(placement=placement), template=weights, first_version=41,
                    transport=transport) as sync:
        client, into = sync.client(), torch.nn.Module()
        into.register_buffer("w", torch.zeros(2))
        assert client.version == 41 and client.poll(0, into) is None  # nothing pushed yet: nothing to copy
        assert client.pull()[1] is None
        assert client.push(weights) == 42
        assert wait_until(lambda: client.poll(0, into), timeout=10) == 42 and torch.equal(into.w, torch.ones(2))


# ---------------------------------------------------------------------------------------------- through the launcher
PPO = ["+recipe=ppo", "recipe.num_envs=4", "recipe.num_steps=64", "recipe.target_return=null", "recipe.window=5",
       "seed=3", "launcher.progress=false", "launcher.plot=false", "launcher.checkpoint_every=1024"]


def _steps(run_dir, prefix: str = "train/") -> dict[str, list[int]]:
    """Each tag's steps in metrics.csv, in file order."""
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        rows = list(csv.reader(f))[1:]
    out: dict[str, list[int]] = {}
    for tag, step, *_ in rows:
        if tag.startswith(prefix) and step:
            out.setdefault(tag, []).append(int(step))
    return out


def _values(run_dir, tag: str) -> dict[int, float]:
    """One tag's values in metrics.csv by step (the last row of a step wins)."""
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        return {int(step): float(value) for t, step, value, *_ in list(csv.reader(f))[1:] if t == tag and step}


def _strictly_increasing(run_dir) -> None:
    for tag, steps in _steps(run_dir).items():
        assert all(a < b for a, b in zip(steps, steps[1:])), f"{tag}: {steps}"


class StopAt:
    """A progress line that presses Ctrl-C (or raises ``stop``) once the run reaches ``frames``: after that batch's
    values are logged, before its checkpoint step, so those values must go at resume."""

    def __init__(self, frames: int, stop: type[BaseException] = KeyboardInterrupt):
        self.at, self.stop, self.frames, self.metrics = frames, stop, 0, {}

    def update(self, frames: int, **metrics: float) -> None:
        self.frames, self.metrics = frames, metrics
        if frames >= self.at:
            raise self.stop

    def close(self) -> None:
        pass


def _interrupted(compose_cfg, run_dir, at: int, *overrides: str, stop: type[BaseException] = KeyboardInterrupt) -> dict:
    cfg = compose_cfg(*overrides)
    with pytest.raises(stop):
        execute(build_plan(cfg), str(run_dir), progress=StopAt(at, stop))
    return load(str(run_dir / "checkpoint.pt"))


@pytest.mark.slow
@pytest.mark.parametrize("stop", [Terminated, SystemExit], ids=["sigterm", "exit"])
def test_sigterm_and_an_exit_from_a_signal_handler_write_the_checkpoint_too(compose_cfg, tmp_path, stop):
    # SIGTERM raises Terminated in the main thread; a batch system's handler that requeued the job may call sys.exit
    saved = _interrupted(compose_cfg, tmp_path / "run", 768, *PPO, "recipe.total_frames=100000", stop=stop)
    assert saved["frames"] == 512 and saved["finished"] is None


@pytest.mark.slow
def test_an_interrupted_ppo_run_resumes_where_it_stopped(compose_cfg, tmp_path, capsys):
    run_dir = tmp_path / "run"
    saved = _interrupted(compose_cfg, run_dir, 1536, *PPO, "recipe.total_frames=100000")
    assert saved["frames"] == 1280 and saved["finished"] is None  # the boundary before the one interrupted
    assert max(_steps(run_dir)["train/mean_return"]) == 1536  # logged before Ctrl-C, after the checkpoint
    result = launch(compose_cfg(*PPO, "recipe.total_frames=3072", f"launcher.resume={run_dir}"), str(tmp_path / "own"))
    assert result["frames"] == 3072 and result["curve"][0][0] < 1280  # the curve goes on from the first part
    steps = _steps(run_dir)["train/mean_return"]
    assert steps == list(range(256, 3072 + 1, 256))  # every batch once: 1536 logged again, after the resume
    _strictly_increasing(run_dir)
    # the weights' versions go on as if the run had never stopped: one push at the start, then one per batch
    versions = _values(run_dir, "train/policy_version")
    assert versions == {step: step // 256 + 1 for step in steps}, versions
    assert load(str(run_dir / "checkpoint.pt"))["finished"] == {"solved": False, "frames": 3072}
    assert json.loads((run_dir / "summary.json").read_text())["frames"] == 3072
    assert not (tmp_path / "own").exists()  # Hydra's launcher.log goes there; the run writes into run_dir
    assert f"resuming the run in {run_dir} at 1,280 frames" in capsys.readouterr().out

    # resumed again, it had finished: it says so and trains no more
    before = (run_dir / "metrics.csv").read_text()
    again = launch(compose_cfg(*PPO, "recipe.total_frames=3072", "launcher.resume=auto"), str(run_dir))
    assert again["frames"] == 3072 and (run_dir / "metrics.csv").read_text() == before
    assert "had finished (its budget of 3,072 frames is spent)" in capsys.readouterr().out


@pytest.mark.slow
def test_a_resumed_ppo_run_is_the_same_in_every_local_placement(compose_cfg, tmp_path):
    """What holds: the learner, its optimizer and the counters resume exactly, and each env's sampling stream goes on,
    but the environments restart their episodes (from seeds drawn from the run's seed and frame count), so the
    curve after a resume differs from the uninterrupted run's. A resume itself is deterministic: from one checkpoint,
    every placement learns the same (sync=true, as in test_reproducible.py)."""
    import shutil

    first = tmp_path / "first"
    _interrupted(compose_cfg, first, 1536, *PPO, "recipe.total_frames=100000")
    curves = []
    for i, placement in enumerate((["service=direct"], ["service=process", "transport=shared_memory"])):
        run_dir = tmp_path / f"resumed{i}"
        shutil.copytree(first, run_dir)
        result = launch(compose_cfg(*PPO, *placement, "recipe.total_frames=3072", f"launcher.resume={run_dir}"),
                        str(tmp_path / f"own{i}"))
        assert result["episodes"] > 10
        curves.append([(f, round(r, 6)) for f, r in result["curve"]])
    assert curves[0] == curves[1]


@pytest.mark.slow
def test_dqn_replay_contents_come_back_when_opted_in(compose_cfg, tmp_path):
    dqn = ["+recipe=dqn", "service=process", "recipe.num_envs=4", "recipe.num_steps=8", "recipe.target_return=null",
           "recipe.learning_starts=256", "recipe.batch_size=32", "recipe.buffer_size=20000", "recipe.n_step=3",
           "launcher.progress=false", "launcher.plot=false", "launcher.checkpoint_every=512",
           "launcher.checkpoint_replay=true"]
    run_dir = tmp_path / "run"
    saved = _interrupted(compose_cfg, run_dir, 1280, *dqn, "recipe.total_frames=100000")
    replay = saved["replay"]
    assert saved["frames"] == 1248 and replay["size"] > 1000 and saved["policy_version"] == 1248 // 32 + 1
    assert set(saved["recipe"]) >= {"behaviour", "target", "optimizer", "pending", "updates", "stored", "rng"}
    result = launch(compose_cfg(*dqn, "recipe.total_frames=2048", f"launcher.resume={run_dir}"), str(tmp_path / "own"))
    assert result["frames"] == 2048
    after = load(str(run_dir / "checkpoint.pt"))
    n = replay["size"]  # the buffer never filled: the restored rows are still where they were written
    assert after["replay"]["size"] > n and after["policy_version"] > saved["policy_version"]
    for key, value in replay["storage"].items(include_nested=True, leaves_only=True):
        assert torch.equal(after["replay"]["storage"][key][:n], value), key
    _strictly_increasing(run_dir)


def test_a_resume_that_cannot_be_done_fails_before_anything_starts(compose_cfg, tmp_path):
    with pytest.raises(ConfigurationError, match="is not a directory") as info:
        launch(compose_cfg(*PPO, f"launcher.resume={tmp_path / 'nowhere'}"), str(tmp_path / "own"))
    assert "full_key: launcher.resume" in str(info.value)
    with pytest.raises(ConfigurationError, match="holds no checkpoint.pt"):
        launch(compose_cfg(*PPO, f"launcher.resume={tmp_path}"), str(tmp_path / "own"))
    assert not (tmp_path / "own").exists()
    dqn_run = tmp_path / "dqn_run"
    dqn_run.mkdir()
    checkpoint = Checkpoint(str(dqn_run / "checkpoint.pt"), extras={"run": lambda: {"recipe": "dqn"}})
    checkpoint.step(64, dict)
    assert checkpoint.save()
    with pytest.raises(ConfigurationError, match="is of recipe 'dqn', not 'ppo'"):
        launch(compose_cfg(*PPO, f"launcher.resume={dqn_run}"), str(tmp_path / "own"))
    fresh = resolve(build_plan(compose_cfg(*PPO, "launcher.resume=auto")), str(tmp_path / "own"))
    assert fresh.state is None and fresh.run_dir == str(tmp_path / "own")  # auto with nothing there: a fresh start


def test_a_resume_removes_what_a_checkpoint_write_cut_short_left(compose_cfg, tmp_path):
    """A run killed outright while writing its checkpoint leaves the temporary file beside it; the run that resumes in
    that directory removes it once it holds the directory's lock, and keeps the checkpoint."""
    from launcher.cli import prepare

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    checkpoint = Checkpoint(str(run_dir / "checkpoint.pt"))
    checkpoint.step(64, lambda: {"w": torch.zeros(2)})
    assert checkpoint.save()
    left = run_dir / f".checkpoint.pt.{2**22 + 1}-0123abcd.tmp"  # a writer that is gone (above any pid_max)
    left.write_bytes(b"\0" * 1024)
    other = run_dir / ".notes.tmp"  # not a checkpoint's: kept
    other.write_text("mine")
    cfg = compose_cfg(*PPO, f"launcher.resume={run_dir}")
    prepared = prepare(build_plan(cfg), cfg, str(tmp_path / "own"))
    try:
        assert not left.exists() and other.exists()
        assert prepared.resumed.frames == 64 and (run_dir / "checkpoint.pt").exists()
    finally:
        prepared.release()


def test_checkpoint_options_are_checked_with_the_others():
    with pytest.raises(ConfigurationError, match="launcher.checkpoint_every must be >= 0 frames, got -1"):
        check_argv(["+recipe=ppo", "launcher.checkpoint_every=-1"])
    with pytest.raises(ConfigurationError, match="would continue one run directory in several jobs"):
        check_argv(["-m", "+recipe=ppo", "seed=0,1", "launcher.resume=outputs/run"])
    assert len(check_argv(["-m", "+recipe=ppo", "seed=0,1", "launcher.resume=auto"])) == 2


# ---------------------------------------------------------------------------------------------- a real command
@pytest.mark.slow
def test_ctrl_c_after_a_checkpoint_then_resume_from_the_command_line(tmp_path):
    run_dir = tmp_path / "run"
    args = ["+recipe=ppo", "recipe.target_return=null", "launcher.progress=false", "launcher.checkpoint_every=2048",
            "logger.flush_every=1000000"]
    with open(tmp_path / "err1", "w") as err:
        proc = popen_cli(*args, "recipe.total_frames=10000000", f"hydra.run.dir={run_dir}", cwd=str(tmp_path),
                         stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_until(lambda: proc.poll() is not None or (run_dir / "checkpoint.pt").exists(), timeout=120,
                   what="the first checkpoint")
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130, (tmp_path / "err1").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    frames = load(str(run_dir / "checkpoint.pt"))["frames"]
    summary = json.loads((run_dir / "summary.json").read_text())
    # saved on Ctrl-C: the last batch boundary (the progress line may have counted the batch in progress)
    assert summary["interrupted"] is True and frames >= 2048 and summary["frames"] - frames in (0, 512)
    total = frames + 2048
    again = subprocess.run([sys.executable, "-m", "launcher", *args, f"recipe.total_frames={total}",
                            f"launcher.resume={run_dir}", f"hydra.run.dir={tmp_path / 'again'}"], cwd=str(tmp_path),
                           capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr
    assert f"resuming the run in {run_dir} at {frames:,} frames" in again.stdout
    assert json.loads((run_dir / "summary.json").read_text())["frames"] == total
    steps = _steps(run_dir)["train/mean_return"]
    assert steps == list(range(512, total + 1, 512))  # no gap, no step twice
    assert (tmp_path / "again" / "launcher.log").exists() and not (tmp_path / "again" / "metrics.csv").exists()
