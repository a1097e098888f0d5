"""The one-node Slurm the ``slurm`` tests submit to: the one ``.ci/run`` started (found with ``.ci/local_slurm.sh
status``, used and left running), else one the ``local_slurm`` fixture starts for the test run. A Slurm this run
started is stopped when the run ends (:func:`stop_if_started_by`, from ``pytest_unconfigure`` of the process that
runs the session: the xdist controller, which outlives every worker using it). Where Slurm cannot run (not root,
not Linux, its ports taken, no apt-get to install it) the tests skip with the script's reason."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.helpers import ROOT

SCRIPT = os.path.join(ROOT, ".ci", "local_slurm.sh")
SLURM_DIR = os.environ.get("LOCAL_SLURM_DIR", "/tmp/local_slurm")
STARTED_FOR = os.path.join(SLURM_DIR, "started_for_tests")
"""Names the test run that started the running Slurm (it stops it at its end); absent for one started otherwise."""
EXIT_CANNOT_RUN = 77  # .ci/local_slurm.sh: Slurm cannot run on this machine
JOB_NAME = f"rl_tests_{os.getpid()}"  # how our jobs are found in squeue
ACTIVE = "PENDING,RUNNING,CONFIGURING,COMPLETING,SUSPENDED,REQUEUED,RESIZING"


def _script(command: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([SCRIPT, command], capture_output=True, text=True, timeout=timeout)


def exports(text: str) -> dict[str, str]:
    """The ``export NAME=value`` lines ``.ci/local_slurm.sh start`` (or ``.ci/hosts_slurm.sh start``) prints.

    Args:
        text: the script's standard output.

    Returns:
        Each exported name with its value, ``$PATH`` (any variable of this process's environment) expanded.
    """
    env = {}
    for line in text.splitlines():
        match = re.fullmatch(r'export (\w+)="?(.*?)"?', line.strip())
        if match:
            env[match[1]] = os.path.expandvars(match[2])
    return env


def squeue(env: dict[str, str], states: str = "all") -> list[str]:
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
    start = _script("start")  # one start at a time (the script's lock); prints the lines again when it runs already
    if start.returncode == EXIT_CANNOT_RUN:
        pytest.skip(start.stderr.strip().splitlines()[-1])
    assert start.returncode == 0, f".ci/local_slurm.sh start failed:\n{start.stderr}"
    if status.returncode != 0 and "already running" not in start.stderr:  # started now: this run stops it
        with open(STARTED_FOR, "w") as f:
            f.write(run_id())
    env = exports(start.stdout)
    assert set(env) == {"SLURM_CONF", "PATH"}, start.stdout
    yield env
    left = squeue(env, ACTIVE)
    if left:
        subprocess.run(["scancel", "--name", JOB_NAME], env={**os.environ, **env}, timeout=30)
    assert not left, f"jobs of ours left in squeue: {left}"


def run_id() -> str:
    """This test run's id, the same in every xdist worker and in the process that runs the session."""
    return os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid-{os.getpid()}"


def stop_if_started_by(run: str) -> None:
    """Stop the one-node Slurm if test run ``run`` started it (a Slurm started otherwise keeps running)."""
    try:
        with open(STARTED_FOR) as f:
            started_for = f.read().strip()
    except OSError:
        return
    if started_for == run:
        stop = _script("stop", timeout=120)
        assert stop.returncode == 0, stop.stderr


