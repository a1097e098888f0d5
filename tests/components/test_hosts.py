"""The host protocol, run against every host built: the same assertions for each placement."""

import os
import signal
import subprocess
import sys
import threading

import pytest

from components.hosts import HOSTS, host_class, shutdown_all
from components.hosts.base import Resources
from transports.kernel.errors import ConfigurationError, PeerFailureError, RemoteError

from tests.helpers import PLACEMENT_FIXTURES, SLOW_PLACEMENTS, process_gone, wait_until


class Target:
    """A small target: remembers where it was built, serves until stopped, answers control calls."""

    def __init__(self, fail: bool = False):
        if fail:
            raise RuntimeError("cannot build this target here")
        self.built_in = (os.getpid(), threading.get_ident())
        self.served = threading.Event()
        self.closed = False

    def serve(self, stop):
        self.served.set()
        stop.wait()

    def where(self):
        return self.built_in

    def serving(self):
        return self.served.wait(5)

    def add(self, a, b):
        return a + b

    def niceness(self):
        """The niceness of every thread of this process (of the calling thread, in the caller's process)."""
        if self.built_in[0] == CALLER:
            return {os.getpriority(os.PRIO_PROCESS, threading.get_native_id())}
        return {os.getpriority(os.PRIO_PROCESS, int(tid)) for tid in os.listdir("/proc/self/task")}

    def boom(self):
        raise KeyError("the target refused")

    def close(self):
        self.closed = True


CALLER = os.getpid()


def make(fail=False):
    return Target(fail)


def make_failing():
    return Target(fail=True)


PLACEMENTS = [p for p in HOSTS if p not in SLOW_PLACEMENTS] + [
    pytest.param(p, marks=pytest.mark.slow) for p in HOSTS if p in SLOW_PLACEMENTS]


@pytest.fixture(params=PLACEMENTS)
def host_type(request):
    if request.param in PLACEMENT_FIXTURES:
        request.getfixturevalue(PLACEMENT_FIXTURES[request.param])
    return host_class(request.param)


def test_start_builds_where_the_placement_puts_it_and_control_calls_reach_it(host_type):
    # one start per placement (an actor, a proc or a rank takes seconds): where it runs, its serving loop, control
    # calls, a control call's error raised at the call site while it keeps serving, and its niceness: every thread of
    # its process at resources.nice, or its own threads only where it shares the caller's process
    nice = 0 if host_type.inline else 5
    host = host_type("probe", make, resources=Resources(startup_timeout=60, nice=nice))
    host.start()
    try:
        assert host.is_alive and host.placement in HOSTS
        levels = host.call("niceness")  # one level for all, never above nice (Ray starts its workers at 15 already)
        assert len(levels) == 1 and min(levels) >= nice
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0  # the caller's priority is its own
        pid, thread = host.call("where")
        assert (pid == os.getpid()) == host_type.same_process
        if host_type.inline:
            assert thread == threading.get_ident()
        elif host_type.same_process:
            assert thread != threading.get_ident()
        if not host_type.inline:  # a serving loop runs apart from control calls
            assert host.call("serving") is True
        assert host.call("add", 2, 3) == 5
        assert host.submit("add", 4, 5).result(30) == 9
        with pytest.raises((KeyError, RemoteError), match="the target refused"):
            host.call("boom")
        assert host.call("add", 1, 1) == 2  # still serving
    finally:
        host.shutdown()
    assert not host.is_alive
    host.shutdown()  # idempotent


def test_a_builder_error_surfaces_at_start(host_type):
    host = host_type("broken", make_failing, resources=Resources(startup_timeout=60))
    with pytest.raises((RuntimeError, RemoteError), match="cannot build this target here"):
        host.start()
    host.shutdown()
    assert not host.is_alive


def test_shutdown_all_winds_several_hosts_down_together(host_type):
    hosts = [host_type(f"many-{i}", make, index=(i, 2)) for i in range(2)]  # one owner's two workers
    for host in hosts:
        host.launch()
    for host in hosts:
        host.wait_ready()
    shutdown_all(hosts, timeout=20)
    assert not any(h.is_alive for h in hosts)


@pytest.mark.parametrize("placement", ["thread", "process"])
def test_resources_nice_lowers_the_owners_threads_and_nothing_else(placement):
    host = host_class(placement)("niced", make, resources=Resources(nice=7)).start()
    try:
        assert host.call("niceness") == {7}
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0
    finally:
        host.shutdown()


def test_a_nice_level_for_an_owner_in_the_callers_own_thread_is_refused():
    for host_type in (host_class(p) for p in HOSTS):
        if host_type.inline:
            with pytest.raises(ConfigurationError, match=r"resources.nice=3 would lower the caller's own thread") as err:
                host_type("inline", make, resources=Resources(nice=3))
            assert err.value.path == "resources.nice"
        else:
            host_type.check_resources(Resources(nice=3))  # every other placement takes it


def test_a_killed_child_is_reported_once_and_calls_fail():
    deaths = []
    host = host_class("process")("doomed", make, on_death=deaths.append).start()
    try:
        pid = host.pid
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: deaths, timeout=10, what="the death report")
        assert deaths == ["the doomed process died (killed by SIGKILL)"]
        with pytest.raises(PeerFailureError):
            host.call("add", 1, 2)
    finally:
        host.shutdown()
    assert process_gone(pid)


@pytest.mark.slow
def test_a_process_host_outlives_the_forkserver_that_started_it():
    """A SIGTERM to the whole process group (a terminal, a batch system) can end multiprocessing's forkserver before
    the launcher stops the children it started; they ignore the signal and keep serving, and their hosts must not
    take the forkserver's end for theirs (seen: a logger marked dead mid-shutdown, its last rows refused)."""
    from multiprocessing import forkserver

    deaths = []
    host = host_class("process")("survivor", make, on_death=deaths.append).start()
    try:
        pid, server = host.pid, forkserver._forkserver._forkserver_pid
        os.kill(server, signal.SIGKILL)
        wait_until(lambda: process_gone(server), timeout=10, what="the forkserver gone")
        assert host.is_alive and host.call("add", 1, 2) == 3 and deaths == []
        os.kill(pid, signal.SIGKILL)  # its own end is still seen, by its pid
        wait_until(lambda: deaths, timeout=10, what="the death report")
        assert deaths[0].startswith("the survivor process died")
    finally:
        host.shutdown()
    assert process_gone(pid)
    second = host_class("process")("after", make).start()  # the next child comes from a new forkserver
    try:
        assert second.call("add", 2, 2) == 4
    finally:
        second.shutdown()


def test_a_thread_loop_that_ends_on_its_own_is_reported():
    deaths = []

    class Quits(Target):
        def serve(self, stop):
            return  # ends without being asked

    host = host_class("thread")("quitter", Quits, on_death=deaths.append).start()
    try:
        wait_until(lambda: deaths, timeout=10, what="the death report")
        assert "stopped on its own" in deaths[0]
    finally:
        host.shutdown()


@pytest.mark.slow
def test_a_tmpdir_too_long_for_the_forkservers_socket_is_a_configuration_error(tmp_path):
    # the forkserver listens on a Unix socket under TMPDIR: past 107 bytes of path, a typed error naming TMPDIR and
    # the remedy, not an OSError from deep inside multiprocessing (a fresh interpreter: this one's forkserver may run)
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    code = ("from components.hosts.process import warm_up\n"
            "from transports.kernel.errors import ConfigurationError\n"
            "try:\n    warm_up()\nexcept ConfigurationError as exc:\n    print(exc.path, exc)\n")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TMPDIR": str(deep)}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("TMPDIR ") and "set TMPDIR to a shorter directory" in done.stdout
