"""A ``distributed`` endpoint across hosts: served on host a, called from host b, attacked from host c, which does not
hold the key; and it listens on host a's address (and its loopback) only."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT
from transports.kernel.secret import KEY_VARIABLE

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

PEER = [sys.executable, "-m", "tests.hosts.peer"]
WILDCARDS = ("0.0.0.0", "::", "*")


def with_key(key: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != KEY_VARIABLE}
    return env if key is None else {**env, KEY_VARIABLE: key}


def test_an_endpoint_serves_another_host_and_refuses_one_without_the_key(hosts):
    key = with_key("the run's secret")
    server = hosts.a.popen(PEER + ["serve", hosts.a.address], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           env=key, cwd=ROOT)
    address = json.loads(server.stdout.readline())
    assert address["host"] == hosts.a.address
    text = json.dumps(address)

    before = hosts.b.run(PEER + ["call", text, "20"], env=key, cwd=ROOT, timeout=120)
    assert before.returncode == 0, before.stderr[-3000:]
    assert len(json.loads(before.stdout)["round_trips_s"]) == 20

    # while b goes on calling, c (no key) sends garbage, speaks torch's store protocol, tries a wrong key and floods;
    # then sends garbage to the gloo listener too (its address is published in the store only, but ports are found)
    gloo = [s.port for s in hosts.a.listening() if s.address == hosts.a.address and s.port != address["port"]]
    assert gloo  # the gloo pair listener that b's endpoint connected to
    calling = hosts.b.popen(PEER + ["call", text, "200"], env=key, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    attack = hosts.c.run(PEER + ["attack", text, *map(str, gloo)], env=with_key(None), cwd=ROOT, timeout=120)
    assert attack.returncode == 0, attack.stderr[-3000:]
    seen = json.loads(attack.stdout)
    assert seen["garbage"] is True, seen
    assert seen["store"].startswith("refused"), seen
    assert seen["wrong_key"].startswith("refused") and "did not admit us" in seen["wrong_key"], seen
    assert seen["flood"] == 300 and seen["flood_closed"] == 300, seen
    out, err = calling.communicate(timeout=120)
    assert calling.returncode == 0, err[-3000:]
    assert len(json.loads(out)["round_trips_s"]) == 200  # every answer checked, none lost

    # what the server listens on: host a's address and its own loopback, nothing else
    mine = [s for s in hosts.a.listening() if set(s.pids) & {server.pid, *child_pids(server.pid)}]
    assert mine and all(s.address in (hosts.a.address, "127.0.0.1") for s in mine), mine
    assert not [s for s in hosts.a.listening() if s.address in WILDCARDS], hosts.a.listening()

    server.stdin.close()
    stats = json.loads(server.stdout.readline())
    assert server.wait(30) == 0
    assert stats["answered"] == 1 + 20 + 1 + 200
    assert stats["refused"] >= 303  # garbage, the store client, the wrong key, the flood


def child_pids(pid: int) -> list[int]:
    """``pid``'s descendants (``ip netns exec`` runs the program as its child)."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    children = [int(p) for p in out.split()]
    return children + [g for c in children for g in child_pids(c)]
