"""Sweeps through hydra-submitit-launcher: each job a real Slurm job (``hydra/launcher=slurm``, on the one-node
Slurm of ``.ci/local_slurm.sh``) or a local subprocess (``hydra/launcher=local``). A job's run directory holds
what a local run's holds, and no job of ours is left in the queue.

The Slurm: the one ``.ci/run`` started (found with ``.ci/local_slurm.sh status``, used and left running), else
one the ``local_slurm`` fixture starts for the session and stops at its end. Where Slurm cannot run (not root,
not Linux, its ports taken, no apt-get to install it) the ``slurm`` tests skip with the script's reason.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess

import pytest
from omegaconf import OmegaConf

from tests.helpers import ROOT, run_cli, wait_until

pytest.importorskip("hydra_plugins.hydra_submitit_launcher",
                    reason="needs hydra-submitit-launcher: pip install -e '.[slurm]'")

SCRIPT = os.path.join(ROOT, ".ci", "local_slurm.sh")
EXIT_CANNOT_RUN = 77  # .ci/local_slurm.sh: Slurm cannot run on this machine
TINY = ("+recipe=ppo", "recipe.total_frames=1024", "recipe.target_return=null", "launcher.progress=false")
JOB_NAME = f"rl_tests_{os.getpid()}"  # how our jobs are found in squeue
ACTIVE = "PENDING,RUNNING,CONFIGURING,COMPLETING,SUSPENDED,REQUEUED,RESIZING"


def _script(command: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([SCRIPT, command], capture_output=True, text=True, timeout=timeout)


def _exports(text: str) -> dict[str, str]:
    """The ``export NAME=value`` lines ``.ci/local_slurm.sh start`` prints, with ``$PATH`` expanded."""
    env = {}
    for line in text.splitlines():
        match = re.fullmatch(r'export (\w+)="?(.*?)"?', line.strip())
        if match:
            env[match[1]] = os.path.expandvars(match[2])
    return env


def _squeue(env: dict[str, str], states: str = "all") -> list[str]:
    """``id|state|partition`` of each of our jobs (array tasks one by one) in the given states."""
    out = subprocess.run(["squeue", "--noheader", "--array", f"--states={states}", f"--name={JOB_NAME}",
                          "--format=%i|%T|%P"], capture_output=True, text=True, timeout=30, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.fixture(scope="session")
def local_slurm():
    """The environment (``SLURM_CONF``, ``PATH`` with the ``sacct`` stand-in) of a running one-node Slurm; at the
    end of the session no job of ours may be left in its queue."""
    status = _script("status", timeout=60)
    if status.returncode == EXIT_CANNOT_RUN:
        pytest.skip(status.stdout.strip())
    started_here = status.returncode != 0
    start = _script("start")  # prints the lines again when it runs already
    if start.returncode == EXIT_CANNOT_RUN:
        pytest.skip(start.stderr.strip().splitlines()[-1])
    assert start.returncode == 0, f".ci/local_slurm.sh start failed:\n{start.stderr}"
    env = _exports(start.stdout)
    assert set(env) == {"SLURM_CONF", "PATH"}, start.stdout
    yield env
    left = _squeue(env, ACTIVE)
    if left:
        subprocess.run(["scancel", "--name", JOB_NAME], env={**os.environ, **env}, timeout=30)
    if started_here:
        stop = _script("stop", timeout=120)
        assert stop.returncode == 0, stop.stderr
    assert not left, f"jobs of ours left in squeue: {left}"


def _run_files(run_dir: str) -> set[str]:
    """Paths under a run directory, relative to it (TensorBoard event files by pattern: their names vary)."""
    files = set()
    for parent, _, names in os.walk(run_dir):
        for name in names:
            rel = os.path.relpath(os.path.join(parent, name), run_dir)
            files.add(re.sub(r"events\.out\.tfevents\..*$", "events.out.tfevents.*", rel))
    return files


def _sweep(cwd, *args: str, env: dict | None = None) -> list[str]:
    """``python -m launcher --multirun ...`` into ``<cwd>/sweep``; each job's run directory, in job order."""
    sweep_dir = os.path.join(str(cwd), "sweep")
    result = run_cli("--multirun", *TINY, *args, f"hydra.sweep.dir={sweep_dir}", cwd=str(cwd), timeout=240, env=env)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return sorted(glob.glob(os.path.join(sweep_dir, "[0-9]*_*")))


def _job_id(run_dir: str) -> str:
    """The submitit job id Hydra recorded for this run (Slurm: ``<job>`` or ``<array job>_<task>``)."""
    return str(OmegaConf.load(os.path.join(run_dir, ".hydra", "hydra.yaml")).hydra.job.id)


@pytest.fixture(scope="module")
def local_run_files(tmp_path_factory) -> set[str]:
    """What a run directory holds when Hydra runs the job in this process (its basic launcher)."""
    (run_dir,) = _sweep(tmp_path_factory.mktemp("basic"))
    files = _run_files(run_dir)
    assert {"plan.json", "summary.json", "metrics.csv", "resolved_config.yaml", "launcher.log"} <= files
    return files


def _assert_like_a_local_run(run_dir: str, local_run_files: set[str]) -> None:
    assert _run_files(run_dir) == local_run_files
    with open(os.path.join(run_dir, "summary.json")) as f:
        assert json.load(f)["frames"] == 1024


# ---------------------------------------------------------------------------------------------- the options
def test_slurm_and_local_options_extend_the_plugins_options():
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="conf", version_base=None):
        slurm = compose("config", overrides=["hydra/launcher=slurm", "hydra.launcher.cpus_per_task=3"],
                        return_hydra_config=True).hydra.launcher
        local = compose("config", overrides=["hydra/launcher=local"], return_hydra_config=True).hydra.launcher
    assert slurm._target_.endswith("SlurmLauncher") and local._target_.endswith("LocalLauncher")
    assert (slurm.partition, slurm.timeout_min, slurm.cpus_per_task, slurm.mem_gb) == (None, 60, 3, 4)
    assert local.timeout_min == 60


def test_the_preflight_checks_every_job_and_leaves_hydra_launcher_overrides_to_hydra():
    from launcher.preflight import check_argv

    configs = check_argv(["--multirun", "hydra/launcher=slurm", "hydra.launcher.timeout_min=5", "+recipe=ppo",
                          "seed=0,1"])
    assert [cfg.seed for cfg in configs] == [0, 1]


# ---------------------------------------------------------------------------------------------- real jobs
@pytest.mark.slurm
@pytest.mark.slow
def test_a_sweep_runs_as_slurm_jobs(local_slurm, local_run_files, tmp_path):
    run_dirs = _sweep(tmp_path, "hydra/launcher=slurm", f"hydra.launcher.name={JOB_NAME}", "seed=0,1",
                      env=local_slurm)
    assert len(run_dirs) == 2
    ids = [_job_id(run_dir) for run_dir in run_dirs]
    assert all(re.fullmatch(r"\d+_[01]", job_id) for job_id in ids), ids  # one array job, a task per run
    for run_dir, job_id in zip(run_dirs, ids):
        _assert_like_a_local_run(run_dir, local_run_files)
        with open(os.path.join(str(tmp_path), "sweep", ".submitit", job_id, f"{job_id}_0_log.out")) as f:
            assert "ppo CartPole-v1 finished: 1,024 frames" in f.read()
    # The job ends a moment after its result is written: then it is COMPLETED, in the local partition.
    wait_until(lambda: _squeue(local_slurm, ACTIVE) == [], timeout=60, what="our jobs to end")
    assert {f"{job_id}|COMPLETED|local" for job_id in ids} <= set(_squeue(local_slurm))


@pytest.mark.slurm
@pytest.mark.slow
def test_the_plugins_own_submitit_slurm_option_runs_too(local_slurm, local_run_files, tmp_path):
    (run_dir,) = _sweep(tmp_path, "hydra/launcher=submitit_slurm", f"hydra.launcher.name={JOB_NAME}",
                        env=local_slurm)
    _assert_like_a_local_run(run_dir, local_run_files)
    wait_until(lambda: _squeue(local_slurm, ACTIVE) == [], timeout=60, what="our jobs to end")
    assert f"{_job_id(run_dir)}|COMPLETED|local" in _squeue(local_slurm)


@pytest.mark.slow
def test_local_runs_each_job_as_a_subprocess(local_run_files, tmp_path):
    (run_dir,) = _sweep(tmp_path, "hydra/launcher=local")
    _assert_like_a_local_run(run_dir, local_run_files)
    job_id = _job_id(run_dir)
    assert job_id.isdigit() and int(job_id) != os.getpid()  # submitit's local job id: the subprocess's pid
