"""A two-node Slurm on the hosts (``.ci/hosts_slurm.sh``): node ``a`` (the controller and a slurmd) on host a, node
``b`` (a slurmd) on host b. Its clients reach the controller at host a's address only, so ``squeue`` and the
driver that submits run on a host (``hosts.a.run``, ``hosts.a.popen``) with :attr:`Slurm.env`."""

from __future__ import annotations

import dataclasses
import os
import subprocess

from tests.helpers import ROOT
from tests.hosts.network import Host, Hosts
from tests.slurm import ACTIVE, exports

SCRIPT = os.path.join(ROOT, ".ci", "hosts_slurm.sh")
EXIT_CANNOT_RUN = 77  # .ci/hosts_slurm.sh: Slurm cannot run on this machine


class Unavailable(Exception):
    """Slurm cannot run here (the reason is the message)."""


@dataclasses.dataclass
class Slurm:
    """A running two-node Slurm: ``env`` (this process's environment with its ``SLURM_CONF`` and its ``sacct``
    stand-in first on ``PATH``), and the host its clients run on."""

    hosts: Hosts
    env: dict[str, str]

    @property
    def client(self) -> Host:
        """The host whose namespace reaches the controller (any host does; a is the controller's own)."""
        return self.hosts.a

    def squeue(self, name: str, states: str = "all") -> list[str]:
        """``id|state|nodes`` of each job named ``name`` (array tasks one by one) in the given states."""
        out = self.client.run(["squeue", "--noheader", "--array", f"--states={states}", f"--name={name}",
                               "--format=%i|%T|%N"], timeout=30, env=self.env)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()

    def active(self) -> list[str]:
        """``id|state|nodes`` of every job not ended yet, whatever its name."""
        out = self.client.run(["squeue", "--noheader", "--array", f"--states={ACTIVE}", "--format=%i|%T|%N"],
                              timeout=30, env=self.env)
        assert out.returncode == 0, out.stderr
        return out.stdout.split()


def start(hosts: Hosts) -> Slurm:
    """Start the Slurm of ``hosts``' set (replacing whatever a crashed run left of it); both nodes are idle.

    Raises:
        Unavailable: Slurm cannot run here (not root, not installed and no apt-get...).
    """
    done = subprocess.run([SCRIPT, "start", str(hosts.set_id)], capture_output=True, text=True, timeout=300)
    if done.returncode == EXIT_CANNOT_RUN:
        raise Unavailable(done.stderr.strip().splitlines()[-1])
    if done.returncode != 0:
        raise RuntimeError(f"{SCRIPT} start {hosts.set_id} failed:\n{done.stderr}")
    env = exports(done.stdout)
    assert set(env) == {"SLURM_CONF", "PATH"}, done.stdout
    return Slurm(hosts, {**os.environ, **env})


def stop(hosts: Hosts) -> None:
    """Cancel every job and stop the daemons of ``hosts``' set; its folder is removed."""
    subprocess.run([SCRIPT, "stop", str(hosts.set_id)], check=True, capture_output=True, timeout=120)
