"""Collector workers as ranks that torchrun started (``distributed.ranks=env``): a real ``torchrun --standalone``
on this machine, three ranks running the same ``python -m launcher`` command; rank 0 drives, ranks 1-2 collect."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.helpers import pgroup_members, run_cli, wait_until

pytestmark = pytest.mark.slow  # interpreters that import torch, a real training run

COMMAND = ["+recipe=ppo", "components.collector.placement=distributed", "components.collector.num_collectors=2",
           "distributed.ranks=env", "recipe.num_envs=4", "recipe.num_steps=16", "recipe.total_frames=512",
           "recipe.target_return=null", "launcher.progress=false", "launcher.plot=false"]


def torchrun(nproc: int, *args: str, env: dict, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                           "-m", "launcher", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})


def test_ranks_torchrun_started_collect_for_the_driver(tmp_path):
    run_dir = tmp_path / "run"
    done = torchrun(3, *COMMAND, f"hydra.run.dir={run_dir}", env={"RLSVC_KEY": "a shared secret"})
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] >= 512
    services = json.loads((run_dir / "services.json").read_text())
    assert services["collector"]["placement"] == "distributed" and services["collector"]["pids"] == []
    assert "Traceback" not in done.stderr


def test_a_world_that_does_not_match_the_workers_is_refused_before_anything_starts(tmp_path):
    done = run_cli(*COMMAND, f"hydra.run.dir={tmp_path}", cwd=str(tmp_path),
                   env={"RLSVC_KEY": "k", "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29999"})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "WORLD_SIZE=2" in done.stderr and "num_collectors=1" in done.stderr
    assert not (tmp_path / "summary.json").exists()


def test_env_ranks_without_the_shared_key_are_refused(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RLSVC_KEY"}
    done = subprocess.run([sys.executable, "-m", "launcher", *COMMAND, f"hydra.run.dir={tmp_path}"], cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120,
                          env={**env, "RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"})
    assert done.returncode != 0
    assert "RLSVC_KEY" in done.stderr


def _rank_pid(run_dir: str, rank: int) -> int | None:
    """The pid of the launcher process of ``rank`` in the torchrun job writing to ``run_dir``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if f"hydra.run.dir={run_dir}".encode() not in f.read():
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if f"RANK={rank}".encode() in f.read().split(b"\0"):
                    return int(entry)
        except OSError:
            continue
    return None


def _log_has(run_dir: str, text: str, name: str = "launcher.log") -> bool:
    try:
        with open(os.path.join(run_dir, name)) as f:
            return text in f.read()
    except FileNotFoundError:
        return False


def _ended(pid: int) -> bool:
    """Whether ``pid`` has exited (gone, or a zombie its paused parent has not reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_rank_killed_mid_run_is_a_peer_failure_naming_it_and_nothing_is_left(tmp_path):
    run_dir = str(tmp_path / "run")
    command = [c for c in COMMAND if not c.startswith("recipe.total_frames")] + ["recipe.total_frames=100000000"]
    # the rank's node goes away: its torchrun agent is not there to end the other ranks, so the driver must notice the
    # lost rank itself. Here the one agent is paused (SIGSTOP) while rank 2 dies and until the driver has ended; then
    # it goes on, sees its ranks gone and prints its own summary.
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3",
                            "--monitor-interval=1", "-m", "launcher", *command, f"hydra.run.dir={run_dir}"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                           env={**os.environ, "RLSVC_KEY": "a shared secret"})
    try:
        wait_until(lambda: _log_has(run_dir, "rank 2: connected") and _log_has(run_dir, "train/", "metrics.csv"),
                   timeout=120, what="training runs with rank 2")
        driver = _rank_pid(run_dir, 0)
        os.kill(job.pid, signal.SIGSTOP)
        try:
            os.kill(_rank_pid(run_dir, 2), signal.SIGKILL)
            wait_until(lambda: _ended(driver), timeout=60, what="the driver ends on its own")
        finally:
            os.kill(job.pid, signal.SIGCONT)
        _, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    assert job.returncode != 0
    assert "error: collector (distributed) died: collector-1-rank2: rank 2 closed its connection" in err, err[-3000:]
    assert "rank      : 2" in err and "SIGKILL" in err  # torchrun's own summary names the rank too
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert not [p for p in ("components", "launcher", "transports") if os.path.join(root, p, "") in err], err[-3000:]
    # (no traceback through our code in any rank; torchrun prints its own)
    wait_until(lambda: not pgroup_members(job.pid), timeout=30, what="every process of the job ends")
