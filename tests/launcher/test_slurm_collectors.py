"""Collectors as Slurm jobs (``components.collector.placement=submitit``) on the one-node Slurm of
``.ci/local_slurm.sh``: one job array feeds the driver's inference server over the distributed transport and the
run solves; a cancelled collector job is a peer failure naming its Slurm job id; no job of ours is left queued."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.helpers import popen_cli, run_cli, wait_until
from tests.slurm import ACTIVE, JOB_NAME, squeue

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
pytest.importorskip("submitit", reason="needs submitit: pip install -e '.[slurm]'")

AS_JOBS = ("+recipe=ppo", "components.collector.placement=submitit", "components.collector.num_collectors=2",
           f"submitit.job_name={JOB_NAME}", "launcher.progress=false")


def _services(run_dir) -> dict:
    with open(os.path.join(run_dir, "services.json")) as f:
        return json.load(f)


def _cancel_one_job(local_slurm, run_dir, which: int, *overrides: str, after_training: bool = False):
    """Run the CLI with collectors as jobs, cancel job ``which`` once they connected (and, with ``after_training``,
    once metrics are written); the process's return code and stderr, and the collector jobs."""
    env = {**os.environ, **local_slurm}
    proc = popen_cli(*AS_JOBS, *overrides, "recipe.target_return=null", f"hydra.run.dir={run_dir}",
                     cwd=str(run_dir.parent), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        jobs = wait_until(lambda: os.path.isfile(run_dir / "services.json") and _services(run_dir)["collector"]["jobs"],
                          timeout=120, interval=0.1, what="the collector jobs to connect")
        if after_training:
            wait_until(lambda: os.path.isfile(run_dir / "metrics.csv"), timeout=60, interval=0.1, what="training")
        subprocess.run(["scancel", jobs[which]], env=env, check=True, timeout=30)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err, jobs


def test_collector_jobs_feed_the_driver_and_the_run_solves(local_slurm, tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(*AS_JOBS, f"hydra.run.dir={run_dir}", cwd=str(tmp_path), timeout=300,
                     env={**os.environ, **local_slurm})
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    assert "ppo CartPole-v1 solved" in result.stdout
    services = _services(run_dir)
    assert (services["inference"]["transport"], services["collector"]["placement"]) == ("distributed", "submitit")
    jobs = services["collector"]["jobs"]
    array = jobs[0].split("_")[0]
    assert jobs == [f"{array}_0", f"{array}_1"]  # one array, a task per worker
    for job in jobs:  # each task's log is in the run directory
        assert os.path.isfile(run_dir / "submitit" / job / f"{job}_0_log.err")
    wait_until(lambda: squeue(local_slurm, ACTIVE) == [], timeout=60, what="the collector jobs to end")
    assert {f"{job}|COMPLETED|local" for job in jobs} <= set(squeue(local_slurm))  # returned, not cancelled


def test_a_cancelled_collector_job_is_a_peer_failure_naming_it(local_slurm, tmp_path):
    run_dir = tmp_path / "run"
    code, err, jobs = _cancel_one_job(local_slurm, run_dir, 1, "recipe.total_frames=100000000")
    assert code == 3, err[-3000:]
    assert f"error: collector (submitit) died: collector-1: the Slurm job {jobs[1]} ended (CANCELLED" in err, err[-3000:]
    with open(run_dir / "summary.json") as f:
        assert json.load(f)["failed"]
    wait_until(lambda: squeue(local_slurm, ACTIVE) == [], timeout=60, what="the other collector job to end")


def test_collector_jobs_reach_ray_owners_over_ray(local_slurm, tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(*AS_JOBS, "service=ray", "recipe.total_frames=2048", "recipe.target_return=null",
                     f"hydra.run.dir={run_dir}", cwd=str(tmp_path), timeout=300, env={**os.environ, **local_slurm})
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    services = _services(run_dir)
    assert (services["inference"]["placement"], services["inference"]["transport"]) == ("ray", "ray")
    with open(run_dir / "summary.json") as f:
        assert json.load(f)["frames"] == 2048
    for job in services["collector"]["jobs"]:  # each job joined the run's Ray cluster before building its worker
        with open(run_dir / "submitit" / job / f"{job}_0_log.err") as f:
            assert "Connected to Ray cluster" in f.read()
    wait_until(lambda: squeue(local_slurm, ACTIVE) == [], timeout=60, what="the collector jobs to end")


def test_impala_learns_from_the_unrolls_of_collector_jobs(local_slurm, tmp_path):
    """IMPALA with its actors as Slurm jobs: each job hands over its unrolls as it has them, the driver's learner queue
    takes them whichever job they came from, and every one is learned from (none lost, none too stale)."""
    run_dir = tmp_path / "run"
    result = run_cli("+recipe=impala", *AS_JOBS[1:], "recipe.num_envs=4", "recipe.unroll_length=16",
                     "recipe.batch_size=2", "recipe.total_frames=2048", "recipe.target_return=null",
                     "recipe.max_policy_lag=null", f"hydra.run.dir={run_dir}", cwd=str(tmp_path), timeout=300,
                     env={**os.environ, **local_slurm})
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    services = _services(run_dir)
    assert (services["inference"]["transport"], services["collector"]["placement"]) == ("distributed", "submitit")
    assert len(services["collector"]["jobs"]) == 2
    with open(run_dir / "summary.json") as f:
        assert json.load(f)["frames"] == 2048
    updates = [float(row.split(",")[2]) for row in (run_dir / "metrics.csv").read_text().splitlines()
               if row.startswith("train/updates,")]
    assert updates[-1] == 2048 // (16 * 2)  # each job's chunk is two unrolls, one batch: every one learned from
    wait_until(lambda: squeue(local_slurm, ACTIVE) == [], timeout=60, what="the collector jobs to end")


def test_a_job_that_does_not_connect_in_time_fails_the_start_and_is_cancelled(local_slurm, tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(*AS_JOBS, "submitit.connect_timeout=0.2", f"hydra.run.dir={run_dir}", cwd=str(tmp_path),
                     timeout=120, env={**os.environ, **local_slurm})
    assert result.returncode == 3, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: collector (submitit) failed to start: collector-0: the Slurm job ") and \
        "did not connect within 0.2 s" in line, line
    wait_until(lambda: squeue(local_slurm, ACTIVE) == [], timeout=60, what="the collector jobs to be cancelled")


def test_a_cancelled_collector_job_is_resubmitted_within_max_restarts(local_slurm, tmp_path):
    run_dir = tmp_path / "run"
    code, err, jobs = _cancel_one_job(local_slurm, run_dir, 0, "components.collector.resources.max_restarts=1",
                                      "recipe.total_frames=40960", after_training=True)
    assert code == 0, err[-3000:]
    with open(run_dir / "summary.json") as f:
        assert json.load(f)["frames"] == 40960
    with open(run_dir / "launcher.log") as f:
        log = f.read()
    assert f"collector-0: collector-0: the Slurm job {jobs[0]} ended (CANCELLED)" in log
    assert "restarting it (1 of 1) and retrying its rollout" in log
    resubmitted = log.split("restarting it (1 of 1)", 1)[1]
    assert "collector-0: submitted as slurm job " in resubmitted  # a new job of its own, not a task of the array
    wait_until(lambda: squeue(local_slurm, ACTIVE) == [], timeout=60, what="the collector jobs to end")
