"""Shared fixtures: composing the real config tree, a small policy, and leak checks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading

import pytest
import torch
from hydra import compose, initialize_config_module

import launcher.schema
from launcher.cli import normalize_argv

launcher.schema.register()
torch.set_num_threads(1)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def compose_cfg():
    """compose_cfg(*overrides) -> the composed DictConfig, exactly as ``python -m launcher`` builds it."""

    def _compose(*overrides: str):
        with initialize_config_module(config_module="conf", version_base=None):
            return compose(config_name="config", overrides=normalize_argv(list(overrides)))

    return _compose


def run_cli(*args: str, cwd: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m launcher`` in a subprocess (bounded in time) and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "launcher", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(autouse=True)
def no_leaked_threads():
    """Every test leaves no thread of ours behind."""
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive() and not t.daemon]
    assert not leaked, f"threads left running: {leaked}"


def proc_state(pid: int) -> str:
    """The state letter of process ``pid`` (``Z`` for a zombie), or ``gone``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def process_gone(pid: int) -> bool:
    return proc_state(pid) in ("gone", "Z")


# ---------------------------------------------------------------------------------------------- Ray
def our_live_actors() -> list[str]:
    """Class names of the actors still alive in the connected cluster (the registry directory excepted)."""
    from ray._private import state

    return sorted(a.get("ActorClassName", "?") for a in state.actors().values()
                  if a.get("State") == "ALIVE" and a.get("ActorClassName") != "_Directory")


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """One local Ray cluster per test module, on 127.0.0.1, in a temp dir of its own; on teardown no actor of
    ours is alive and the cluster is gone."""
    from components.hosts.ray import RayClusterConfig, ray_cluster as cluster
    from transports.ray import import_ray

    import_ray()
    temp_dir = f"/tmp/rt{os.getpid()}_{os.urandom(2).hex()}"  # short: Ray's Unix sockets live there
    try:
        with cluster(RayClusterConfig(num_cpus=2, temp_dir=temp_dir, namespace="tests")) as started:
            assert started
            yield
            assert our_live_actors() == [], f"actors left alive: {our_live_actors()}"
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)  # the session's logs and sockets
