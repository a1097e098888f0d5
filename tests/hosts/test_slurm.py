"""Slurm across hosts (``.ci/hosts_slurm.sh``): the driver runs on host a, where the controller is, and its jobs are
pinned to node b, the slurmd on host b. Collector jobs (``components.collector.placement=submitit``) reach the
driver at host a's address, proving ``RLSVC_KEY``; the jobs of a ``hydra/launcher=slurm`` sweep run whole on b.
Each job says where it ran (``SLURMD_NODENAME``, from a setup line) and Slurm agrees (``squeue``'s node list)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from tests.helpers import wait_until
from tests.hosts.slurm import ACTIVE
from transports.kernel.secret import KEY_VARIABLE

pytestmark = [pytest.mark.hosts, pytest.mark.slow]
pytest.importorskip("submitit", reason="needs submitit: pip install -e '.[slurm]'")
pytest.importorskip("hydra_plugins.hydra_submitit_launcher",
                    reason="needs hydra-submitit-launcher: pip install -e '.[slurm]'")

JOB_NAME = f"rl_hosts_{os.getpid()}"
SAY_NODE = 'echo "on node $SLURMD_NODENAME"'  # a setup line of each job's batch script: its stdout log
TINY = ("+recipe=ppo", "recipe.target_return=null", "launcher.progress=false")


def launcher(slurm_nodes, cwd, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m launcher args`` on host a (bounded), its output captured."""
    driver = slurm_nodes.hosts.a.popen([sys.executable, "-m", "launcher", *args], cwd=str(cwd),
                                       env={**slurm_nodes.env, **(env or {})}, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE)
    out, err = driver.communicate(timeout=150)
    return subprocess.CompletedProcess(driver.args, driver.returncode, out, err)


def ended_on_b(slurm_nodes, jobs: list[str]) -> None:
    """Every job in ``jobs`` ends, COMPLETED on node b, and its own log says it ran there."""
    wait_until(lambda: not slurm_nodes.squeue(JOB_NAME, ACTIVE), timeout=60, what="our jobs to end")
    assert {f"{job}|COMPLETED|b" for job in jobs} == set(slurm_nodes.squeue(JOB_NAME)), slurm_nodes.squeue(JOB_NAME)


def test_collector_jobs_run_on_node_b_and_reach_the_driver_on_host_a(slurm_nodes, tmp_path):
    hosts = slurm_nodes.hosts
    for host, daemons in ((hosts.a, {"slurmctld", "slurmd"}), (hosts.b, {"slurmd"})):  # each on its host's address
        listening = [s for s in host.listening() if set(s.programs) & daemons]
        assert {p for s in listening for p in s.programs} == daemons, host.listening()
        assert {s.address for s in listening} == {host.address}, listening
    a = hosts.a.address
    run_dir = tmp_path / "run"
    done = launcher(slurm_nodes, tmp_path, *TINY, "recipe.total_frames=2048", "components.collector.num_collectors=2",
                    "components.collector.placement=submitit", f"submitit.host={a}",
                    "components.inference.placement=thread", "components.inference.transport=distributed",
                    f"+components.inference.transport_options.host={a}",
                    "+submitit.slurm_additional_parameters.nodelist=b", f"submitit.job_name={JOB_NAME}",
                    f"submitit.setup=['{SAY_NODE}']", f"hydra.run.dir={run_dir}",
                    env={KEY_VARIABLE: os.urandom(16).hex()})
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    with open(run_dir / "summary.json") as f:
        assert json.load(f)["frames"] == 2048
    with open(run_dir / "services.json") as f:
        services = json.load(f)
    assert (services["inference"]["transport"], services["collector"]["placement"]) == ("distributed", "submitit")
    jobs = services["collector"]["jobs"]
    assert len(jobs) == 2
    for job in jobs:
        with open(run_dir / "submitit" / job / f"{job}_0_log.out") as f:
            assert "on node b\n" in f.read()
    ended_on_b(slurm_nodes, jobs)


def test_a_sweep_runs_its_jobs_on_node_b(slurm_nodes, tmp_path):
    sweep_dir = tmp_path / "sweep"
    done = launcher(slurm_nodes, tmp_path, "--multirun", "hydra/launcher=slurm", *TINY, "recipe.total_frames=1024",
                    "seed=0,1", "+hydra.launcher.additional_parameters.nodelist=b", f"hydra.launcher.name={JOB_NAME}",
                    f"hydra.launcher.setup=['{SAY_NODE}']", f"hydra.sweep.dir={sweep_dir}")
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    run_dirs = sorted(glob.glob(str(sweep_dir / "[0-9]*_*")))
    assert len(run_dirs) == 2
    for run_dir in run_dirs:
        with open(os.path.join(run_dir, "summary.json")) as f:
            assert json.load(f)["frames"] == 1024
    logs = sorted(glob.glob(str(sweep_dir / ".submitit" / "*" / "*_0_log.out")))
    jobs = [os.path.basename(os.path.dirname(log)) for log in logs]
    assert len(jobs) == 2, logs
    for log in logs:
        with open(log) as f:
            assert "on node b\n" in f.read()
    ended_on_b(slurm_nodes, jobs)
