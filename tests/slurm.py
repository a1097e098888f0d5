"""The one-node Slurm the ``slurm`` tests submit to: the one ``.ci/run`` started (found with ``.ci/local_slurm.sh
status``, used and left running), else one the ``local_slurm`` fixture starts for the session and stops at its end.
Where Slurm cannot run (not root, not Linux, its ports taken, no apt-get to install it) the tests skip with the
script's reason."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.helpers import ROOT

SCRIPT = os.path.join(ROOT, ".ci", "local_slurm.sh")
EXIT_CANNOT_RUN = 77  # .ci/local_slurm.sh: Slurm cannot run on this machine
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
    started_here = status.returncode != 0
    start = _script("start")  # prints the lines again when it runs already
    if start.returncode == EXIT_CANNOT_RUN:
        pytest.skip(start.stderr.strip().splitlines()[-1])
    assert start.returncode == 0, f".ci/local_slurm.sh start failed:\n{start.stderr}"
    env = _exports(start.stdout)
    assert set(env) == {"SLURM_CONF", "PATH"}, start.stdout
    yield env
    left = squeue(env, ACTIVE)
    if left:
        subprocess.run(["scancel", "--name", JOB_NAME], env={**os.environ, **env}, timeout=30)
    if started_here:
        stop = _script("stop", timeout=120)
        assert stop.returncode == 0, stop.stderr
    assert not left, f"jobs of ours left in squeue: {left}"


