"""A Ray cluster across hosts: the head on one namespace, worker nodes on others, each started with ``ray start`` as
on real machines (its own ``--node-ip-address``, the same token and the run's key on every node)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys

from tests.hosts.network import Host
from transports.kernel.secret import KEY_VARIABLE

PORT = 6379
WORKER_PORTS = (21000, 21999)
"""Where Ray's core worker in each worker process (our actors among them) listens, on every interface: Ray's own
gRPC server, declared at ``ray start`` so a test can tell it from ours."""
HEALTH = {"health_check_period_ms": 1000, "health_check_timeout_ms": 1000, "health_check_failure_threshold": 5}
"""The head's node health check: a node silent for about 5 s is marked dead (Ray's defaults: about 30 s)."""


class RayNodes:
    """``ray start`` on hosts: :meth:`head` first, then :meth:`worker` on others. Its processes run in the hosts'
    namespaces (the ``hosts`` fixture ends them); :meth:`remove` deletes the nodes' session folders."""

    def __init__(self, set_id: int):
        self.env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}  # (1 node only)
        self.env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
                         KEY_VARIABLE: "the run's secret", "RAY_USAGE_STATS_ENABLED": "0"})
        self.folders: list[str] = []
        self.set_id = set_id
        self.address: str | None = None

    def _start(self, host: Host, args: list[str], keyless: bool = False) -> None:
        folder = f"/tmp/rlsvc_ray{self.set_id}{host.name}"  # short: Ray's Unix sockets live under it
        shutil.rmtree(folder, ignore_errors=True)
        self.folders.append(folder)
        ray = os.path.join(os.path.dirname(sys.executable), "ray")
        done = host.run([ray, "start", f"--node-ip-address={host.address}", f"--temp-dir={folder}",
                         f"--min-worker-port={WORKER_PORTS[0]}", f"--max-worker-port={WORKER_PORTS[1]}",
                         "--disable-usage-stats", *args], timeout=120,
                        env={k: v for k, v in self.env.items() if not (keyless and k == KEY_VARIABLE)})
        assert done.returncode == 0, done.stderr[-3000:]

    def head(self, host: Host, num_cpus: int = 1, keyless: bool = False) -> str:
        """Start the head on ``host``, offering the custom resource ``head`` (the owners other than collectors
        take one: they run beside the driver), without the run's key in its environment where ``keyless``; returns
        the cluster's address."""
        self._start(host, ["--head", f"--port={PORT}", f"--num-cpus={num_cpus}", "--include-dashboard=false",
                           f"--resources={json.dumps({'head': 8})}", f"--system-config={json.dumps(HEALTH)}"],
                    keyless)
        self.address = f"{host.address}:{PORT}"
        return self.address

    def worker(self, host: Host, resources: dict, num_cpus: int = 2) -> None:
        """Start a worker node on ``host`` that joins the head."""
        self._start(host, [f"--address={self.address}", f"--num-cpus={num_cpus}",
                           f"--resources={json.dumps(resources)}"])

    def remove(self) -> None:
        """Delete the nodes' folders (call once their processes ended)."""
        for folder in self.folders:
            shutil.rmtree(folder, ignore_errors=True)


def launcher(host: Host, nodes: RayNodes, run_dir, *overrides: str) -> subprocess.Popen:
    """``python -m launcher`` on ``host``, joining the cluster, every payload over ``distributed`` at the host's
    address, the collectors pinned to nodes offering the custom resource ``collect``, the other owners to the head."""
    from tests.helpers import ROOT

    return host.python(["-m", "launcher", "service=ray", "transport=distributed", f"ray.address={nodes.address}",
                        f"+transport.options.host={host.address}", "+components.collector.resources.custom={collect: 1}",
                        "components.collector.num_collectors=2", "launcher.progress=false", "launcher.plot=false",
                        *(f"+components.{name}.resources.custom={{head: 1}}"
                          for name in ("logger", "weight_sync", "replay", "inference")),
                        f"hydra.run.dir={run_dir}", *overrides],
                       cwd=ROOT, env=nodes.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
