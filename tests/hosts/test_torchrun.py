"""torchrun with two nodes: the driver (rank 0) on host a, two collector ranks on host b, every rank running the same
``python -m launcher`` command line as ``docs/pages/running/several-machines.md`` gives it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.helpers import ROOT, wait_until
from tests.hosts.network import Host, Hosts, Listened
from transports.kernel.secret import KEY_VARIABLE

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

WILDCARDS = ("0.0.0.0", "::", "*")


def launcher_args(hosts: Hosts, run_dir, *extra: str) -> list[str]:
    """The command line every rank runs: collectors on the ranks, the inference server on a thread of the driver,
    listening on host a's address."""
    return ["components.collector.placement=distributed", "components.collector.num_collectors=2",
            "distributed.ranks=env", "components.inference.placement=thread",
            "components.inference.transport=distributed",
            f"+components.inference.transport_options.host={hosts.a.address}",
            "launcher.progress=false", "launcher.plot=false", f"hydra.run.dir={run_dir}", *extra]


def torchrun(host: Host, node_rank: int, nproc: int, master: str, port: int, args: list[str],
             monitor: int = 1) -> subprocess.Popen:
    """One node's ``torchrun`` (static rendezvous at ``master:port``), its ranks running the launcher; it checks its
    ranks every ``monitor`` seconds (and ends the others once one failed)."""
    return host.python(["-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node_rank),
                        "--nproc-per-node", str(nproc), "--master-addr", master, "--master-port", str(port),
                        "--local-addr", host.address, "--monitor-interval", str(monitor), "-m", "launcher", *args],
                       cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       env={**os.environ, KEY_VARIABLE: "the run's secret", "OMP_NUM_THREADS": "1"})


class Job:
    """Both nodes of one torchrun job, and every socket their processes listened on while it ran."""

    def __init__(self, hosts: Hosts, port: int, args: list[str], monitor: int = 1, watch: bool = False):
        self.hosts, self.port = hosts, port
        self.driver = torchrun(hosts.a, 0, 1, hosts.a.address, port, args)
        self.workers = torchrun(hosts.b, 1, 2, hosts.a.address, port, args, monitor)
        self.listened = Listened([hosts.a, hosts.b]) if watch else None  # (each look costs two processes)

    def wait(self, timeout: float) -> tuple[str, str]:
        """Both nodes' ends; the driver's stderr and the workers' stderr."""
        _, driver_err = self.driver.communicate(timeout=timeout)
        _, workers_err = self.workers.communicate(timeout=timeout)
        if self.listened is not None:
            self.listened.stop()
        return driver_err, workers_err


def test_ppo_solves_cartpole_with_its_collectors_on_another_host_and_binds_only_where_asked(hosts, tmp_path):
    run_dir = tmp_path / "run"
    job = Job(hosts, 29500, ["+recipe=ppo", "seed=0", *launcher_args(hosts, run_dir)], watch=True)
    driver_err, workers_err = job.wait(240)
    assert job.driver.returncode == 0, driver_err[-3000:]
    assert job.workers.returncode == 0, workers_err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["solved"] and summary["final_mean_return"] >= 475, summary
    assert "rank 1: connected to the driver at" in (run_dir / "launcher.log").read_text()

    # every socket a process of the run listened on: its host's own address or its loopback, never every interface;
    # the one exception is torchrun's own rendezvous store (its agent's, on the master port of host a)
    assert job.listened.seen
    wrong = job.listened.elsewhere(exempt=lambda s: (s[0], s[2]) == ("a", job.port))
    assert not wrong, wrong
    assert any(s[0] == "b" and s[1] == hosts.b.address for s in job.listened.seen)  # the ranks' gloo pairs, on b's


def test_appo_on_minatar_learns_with_its_collectors_on_another_host(hosts, tmp_path):
    run_dir = tmp_path / "run"
    job = Job(hosts, 29510, ["+recipe=appo", "env=minatar", "seed=0", "recipe.total_frames=30000",
                             *launcher_args(hosts, run_dir)])
    driver_err, workers_err = job.wait(240)
    assert job.driver.returncode == 0, driver_err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    # a uniformly random policy scores 0.37 (+/- 0.60 over 500 episodes) on MinAtar Breakout
    assert summary["frames"] >= 30000 and summary["final_mean_return"] > 1.0, summary


def _rank_pid(host: Host, rank: int) -> int | None:
    """The pid of the launcher process of ``rank`` on ``host``."""
    for pid in host.pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ and b"launcher" in command and b"torch.distributed.run" not in command:
            return pid
    return None


def _training(run_dir) -> bool:
    try:
        return "train/" in (run_dir / "metrics.csv").read_text()
    except FileNotFoundError:
        return False


def test_a_rank_killed_on_another_host_is_named_by_the_driver(hosts, tmp_path):
    run_dir = tmp_path / "run"
    # torchrun on b checks its ranks every 5 s: the driver notices the lost rank first, as when a rank's node goes
    # away (torchrun then ends the other rank of b)
    job = Job(hosts, 29520, ["+recipe=ppo", "recipe.total_frames=100000000", "recipe.target_return=null",
                             *launcher_args(hosts, run_dir)], monitor=5)
    wait_until(lambda: _training(run_dir) and _rank_pid(hosts.b, 2), timeout=120, what="training with rank 2")
    os.kill(_rank_pid(hosts.b, 2), signal.SIGKILL)
    driver_err, _ = job.wait(120)
    assert job.driver.returncode != 0 and "exitcode  : 3" in driver_err, driver_err[-3000:]  # (torchrun's summary)
    assert (f"error: collector (distributed on {hosts.b.address}) died: collector-1-rank2: rank 2 closed its "
            "connection") in driver_err, driver_err[-3000:]


def test_a_link_lost_mid_run_is_named_within_the_bound_and_nothing_is_left_when_it_comes_back(hosts, tmp_path):
    from components.hosts.child import ORPHAN_CLOSE_S
    from components.hosts.connected import LOST_AFTER_S

    run_dir = tmp_path / "run"
    job = Job(hosts, 29530, ["+recipe=ppo", "recipe.total_frames=100000000", "recipe.target_return=null",
                             *launcher_args(hosts, run_dir)])
    wait_until(lambda: _training(run_dir), timeout=120, what="training")
    hosts.b.link(False)  # host b's cable pulled: nothing closes, nothing answers
    cut = time.monotonic()
    try:
        job.driver.wait(LOST_AFTER_S + 40)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the driver still ran {LOST_AFTER_S + 40} s after its collectors' host was cut off")
    noticed = time.monotonic() - cut
    _, driver_err = job.driver.communicate(timeout=30)
    assert job.driver.returncode != 0 and "exitcode  : 3" in driver_err, driver_err[-3000:]
    assert f"error: collector (distributed on {hosts.b.address}) died" in driver_err, driver_err[-3000:]
    assert "its node was lost" in driver_err, driver_err[-3000:]
    assert noticed < LOST_AFTER_S + 30, noticed
    print(f"the driver ended {noticed:.1f} s after the link was cut (bound: LOST_AFTER_S={LOST_AFTER_S} + 30)")
    # the ranks on b end too, having heard nothing from the driver as long, and closed what they could; torchrun's
    # agent on b then waits for its exit barrier at the unreachable master (torchrun's own timeout)
    wait_until(lambda: _rank_pid(hosts.b, 1) is None and _rank_pid(hosts.b, 2) is None,
               timeout=LOST_AFTER_S + ORPHAN_CLOSE_S + 30, what="the ranks on host b end by themselves")
    # the link comes back too late: the run is over, and what was left on b learns it and ends, nothing stays
    hosts.b.link(True)
    job.workers.communicate(timeout=120)
    assert job.workers.returncode != 0
    wait_until(lambda: not hosts.b.pids(), timeout=30, what="nothing left on host b")
