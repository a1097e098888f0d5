"""Collector workers as ranks that torchrun started (``distributed.ranks=env``): a real ``torchrun --standalone``
on this machine, three ranks running the same ``python -m launcher`` command; rank 0 drives, ranks 1-2 collect."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import run_cli

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
    done = torchrun(3, *COMMAND, f"hydra.run.dir={run_dir}", env={"RLSVC_RANK_KEY": "a shared secret"})
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] >= 512
    services = json.loads((run_dir / "services.json").read_text())
    assert services["collector"]["placement"] == "distributed" and services["collector"]["pids"] == []
    assert "Traceback" not in done.stderr


def test_a_world_that_does_not_match_the_workers_is_refused_before_anything_starts(tmp_path):
    done = run_cli(*COMMAND, f"hydra.run.dir={tmp_path}", cwd=str(tmp_path),
                   env={"RLSVC_RANK_KEY": "k", "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29999"})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "WORLD_SIZE=2" in done.stderr and "num_collectors=1" in done.stderr
    assert not (tmp_path / "summary.json").exists()


def test_env_ranks_without_the_shared_key_are_refused(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RLSVC_RANK_KEY"}
    done = subprocess.run([sys.executable, "-m", "launcher", *COMMAND, f"hydra.run.dir={tmp_path}"], cwd=str(tmp_path),
                          capture_output=True, text=True, timeout=120,
                          env={**env, "RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"})
    assert done.returncode != 0
    assert "RLSVC_RANK_KEY" in done.stderr
