"""Hosts as network namespaces (made by ``.ci/hosts.sh``): run processes on them, list what they listen on, cut
their links. Each host has its own interface and address on a bridge that joins them, and its own loopback."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

from tests.helpers import ROOT, default_sigint, pgroup_members, wait_until  # noqa: F401 (wait_until: for conftest)

SCRIPT = os.path.join(ROOT, ".ci", "hosts.sh")


@dataclasses.dataclass
class Listening:
    """One listening TCP socket of a host: its local address and port, and the processes holding it."""

    address: str
    port: int
    pids: tuple[int, ...]
    programs: tuple[str, ...]


@dataclasses.dataclass
class Host:
    """One namespace: ``name`` (``a``), ``netns`` (``rlsvc0-a``), ``address`` (``10.77.0.1``)."""

    name: str
    netns: str
    address: str
    started: list = dataclasses.field(default_factory=list, repr=False)

    def command(self, args: list[str]) -> list[str]:
        """``args`` run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *args]

    def popen(self, args: list[str], **kwargs) -> subprocess.Popen:
        """Start ``args`` on this host, in a session of its own (the test's fixture ends its whole group)."""
        kwargs.setdefault("text", True)
        process = subprocess.Popen(self.command(args), start_new_session=True, preexec_fn=default_sigint, **kwargs)
        self.started.append(process)
        return process

    def python(self, args: list[str], **kwargs) -> subprocess.Popen:
        """Start ``python args`` (this interpreter) on this host."""
        return self.popen([sys.executable, *args], **kwargs)

    def run(self, args: list[str], timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        """Run ``args`` on this host to the end (bounded), capturing its output."""
        return subprocess.run(self.command(args), capture_output=True, text=True, timeout=timeout, **kwargs)

    def listening(self) -> list[Listening]:
        """Every TCP socket listening on this host, with its processes (``ss -ltnp``)."""
        out = self.run(["ss", "-Hltnp"]).stdout
        found = []
        for line in out.splitlines():
            parts = line.split()
            local = parts[3]
            address, _, port = local.rpartition(":")
            users = line.split("users:", 1)[1] if "users:" in line else ""
            pids = tuple(int(p.split("=")[1]) for p in users.replace(")", ",").split(",") if p.startswith("pid="))
            programs = tuple(p.strip('("') for p in users.split(",") if p.startswith('(("') or p.startswith('("'))
            found.append(Listening(address.strip("[]").split("%")[0], int(port), pids, programs))
        return found

    def link(self, up: bool) -> None:
        """Set this host's interface up or down (down: nothing reaches it, nothing leaves it; no socket is closed)."""
        subprocess.run(self.command(["ip", "link", "set", "dev", "eth0", "up" if up else "down"]), check=True)

    def end_all(self) -> None:
        """End every process started on this host (its whole group, and whatever else of it runs in the namespace) and
        reap it."""
        for process in self.started:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                process.communicate(timeout=30)
            except (subprocess.TimeoutExpired, ValueError):
                pass
            wait_until(lambda: not pgroup_members(process.pid), timeout=30, what=f"process group {process.pid} ends")
        self.started.clear()
        for pid in self.pids():  # what left the test's groups (torchrun's ranks run in sessions of their own)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def pids(self) -> list[int]:
        """Processes running inside this host's namespace."""
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]


@dataclasses.dataclass
class Hosts:
    """The hosts of one set: ``a``, ``b`` and ``c``."""

    set_id: int
    a: Host
    b: Host
    c: Host

    @property
    def all(self) -> tuple[Host, Host, Host]:
        return self.a, self.b, self.c


class Listened:
    """Every TCP socket that processes on ``hosts`` listened on while :meth:`stop` was not called yet, polled every
    ``every`` seconds: ``(host name, address, port, programs)``."""

    def __init__(self, hosts: list[Host], every: float = 0.5):
        self.hosts, self.every, self.seen = hosts, every, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            for host in self.hosts:
                self.seen |= {(host.name, s.address, s.port, s.programs) for s in host.listening()}
            self._stop.wait(self.every)

    def stop(self) -> set:
        """Stop watching; every socket seen."""
        self._stop.set()
        self._thread.join(30)
        return self.seen

    def elsewhere(self, exempt=lambda seen: False) -> list:
        """The sockets seen on an address other than their host's own or its loopback (every interface included),
        but for those ``exempt(seen)`` allows."""
        own = {host.name: host.address for host in self.hosts}
        return [s for s in self.seen if s[1] not in (own[s[0]], f"::ffff:{own[s[0]]}", "127.0.0.1", "::ffff:127.0.0.1")
                and not exempt(s)]


class Unavailable(Exception):
    """Namespaces cannot be made here (the reason is the message)."""


def up(set_id: int) -> Hosts:
    """Make the hosts of set ``set_id`` (replacing whatever a crashed run left of it)."""
    done = subprocess.run([SCRIPT, "up", str(set_id)], capture_output=True, text=True, timeout=60)
    if done.returncode == 77:
        raise Unavailable(done.stderr.strip())
    if done.returncode != 0:
        raise RuntimeError(f"{SCRIPT} up {set_id} failed: {done.stderr.strip()}")
    values = dict(line.split("=", 1) for line in done.stdout.split())
    return Hosts(set_id, *(Host(n, values[f"RLSVC_NETNS_{n.upper()}"], values[f"RLSVC_HOST_{n.upper()}"])
                           for n in "abc"))


def down(set_id: int) -> None:
    """Remove the hosts of set ``set_id``: their namespaces and every link in them."""
    subprocess.run([SCRIPT, "down", str(set_id)], check=True, timeout=60)


def namespaces_left(set_id: int) -> list[str]:
    """The namespaces of set ``set_id`` that exist."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"rlsvc{set_id}-")]


def wait_for_port(host: Host, port: int, timeout: float, what: str) -> None:
    """Wait until something on ``host`` listens on ``port``."""
    wait_until(lambda: any(s.port == port for s in host.listening()), timeout=timeout, what=what)


def elapsed(since: float) -> float:
    """Seconds since ``since`` (``time.monotonic()``)."""
    return time.monotonic() - since
