"""Where a run on one host listens when its ``distributed`` payloads are given that host's address: on that address
(the relays, the gloo pairs) and on its loopback (the stores, the process transports' sockets), never on every
interface, for each placement of the owners."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT
from tests.hosts.network import Listened
from transports.kernel.secret import KEY_VARIABLE

pytestmark = [pytest.mark.hosts, pytest.mark.slow]


PLACEMENTS = {  # what each placement takes over distributed ({host}: host a's address)
    "thread": ["service=thread", "components.inference.transport=distributed",
               "+components.inference.transport_options.host={host}"],
    "process": ["service=process", "transport=distributed", "+transport.options.host={host}"],
}


@pytest.mark.parametrize("service", sorted(PLACEMENTS))
def test_a_run_listens_only_on_its_hosts_address_and_loopback(service, hosts, tmp_path):
    run_dir = tmp_path / "run"
    placed = [o.format(host=hosts.a.address) for o in PLACEMENTS[service]]
    run = hosts.a.python(["-m", "launcher", "+recipe=ppo", *placed, "recipe.total_frames=4096",
                          "recipe.target_return=null", "launcher.progress=false", "launcher.plot=false",
                          f"hydra.run.dir={run_dir}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**os.environ, KEY_VARIABLE: "the run's secret"})
    listened = Listened([hosts.a], every=0.5)
    _, err = run.communicate(timeout=180)
    listened.stop()
    assert run.returncode == 0, err[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["frames"] >= 4096
    assert any(s[1] == hosts.a.address for s in listened.seen), listened.seen  # the relays, at least
    assert not listened.elsewhere(), listened.elsewhere()
    print(f"{service}: {sorted(listened.seen)}", file=sys.stderr)
