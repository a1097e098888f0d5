"""What a run killed outright (SIGKILL: no cleanup runs) leaves behind is removed when the next run starts: its
shared-memory segments, and its local Ray cluster's session directory with the Ray processes still holding it."""

from __future__ import annotations

import contextlib
import os
import subprocess

import pytest

from components.hosts.ray_cluster import OWN_TEMP_PREFIX, remove_dead_clusters
from tests.helpers import process_gone, wait_until
from transports.segments import SHM_PREFIX, remove_orphans, remove_segments_left_by


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_segments_of_processes_that_no_longer_exist_are_removed_and_no_others(tmp_path):
    dead, alive = _dead_pid(), os.getpid()
    names = [f"{SHM_PREFIX}{dead}_0_abcdef", f"{SHM_PREFIX}{alive}_99999_abcdef", "not_ours_123"]
    for name in names:
        with open(f"/dev/shm/{name}", "wb") as f:
            f.write(b"x")
    try:
        removed = remove_orphans()
        assert names[0] in removed and not os.path.exists(f"/dev/shm/{names[0]}")
        assert os.path.exists(f"/dev/shm/{names[1]}") and os.path.exists(f"/dev/shm/{names[2]}")
    finally:
        for name in names:
            if os.path.exists(f"/dev/shm/{name}"):
                os.unlink(f"/dev/shm/{name}")


SEGMENT_MAKER = """
from multiprocessing import resource_tracker
import sys, time
from transports.segments import Segment
segment = Segment(64)
print(segment.name, resource_tracker._resource_tracker._pid, flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_segments_of_processes_killed_with_their_resource_tracker_are_unlinked_once_they_ended():
    # as Ray's reaper kills an actor's process group, its tracker included, when the run's group got SIGTERM
    import signal
    import sys

    child = subprocess.Popen([sys.executable, "-c", SEGMENT_MAKER], stdout=subprocess.PIPE, text=True,
                             cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    try:
        name, tracker = child.stdout.readline().split()
        assert remove_segments_left_by([child.pid], wait=0.1) == []  # a process still running keeps its own
        assert os.path.exists(f"/dev/shm/{name}")
        os.kill(int(tracker), signal.SIGKILL)
        child.kill()
        child.wait()
        wait_until(lambda: process_gone(int(tracker)), timeout=10, what="the tracker gone")
        assert os.path.exists(f"/dev/shm/{name}")  # nobody left to unlink it
        assert remove_segments_left_by([child.pid], wait=10.0) == [name]
        assert not os.path.exists(f"/dev/shm/{name}")
    finally:
        child.kill()
        child.wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"/dev/shm/{name}")


def test_a_dead_driver_s_ray_session_and_the_processes_holding_it_are_removed(tmp_path):
    import tempfile

    dead = tempfile.mkdtemp(prefix=OWN_TEMP_PREFIX, dir="/tmp")
    live = tempfile.mkdtemp(prefix=OWN_TEMP_PREFIX, dir="/tmp")
    with open(os.path.join(dead, "driver.pid"), "w") as f:
        f.write(f"{_dead_pid()}\n")
    with open(os.path.join(live, "driver.pid"), "w") as f:
        f.write(f"{os.getpid()}\n")
    os.makedirs(os.path.join(dead, "session_x", "logs"))
    # a daemon of the dead cluster that outlived its driver, working there (as Ray's agents hold their logs)
    holder = subprocess.Popen(["bash", "-c", "exec -a ray::IDLE sleep 60"], cwd=os.path.join(dead, "session_x", "logs"))
    # and a process that is not Ray's, holding a file there too (a driver that once joined that cluster): it stays
    bystander = subprocess.Popen(["sleep", "60"], cwd=os.path.join(dead, "session_x", "logs"))
    try:
        wait_until(lambda: open(f"/proc/{holder.pid}/cmdline", "rb").read().startswith(b"ray::"), timeout=10,
                   what="the holder named as Ray's worker")
        removed = remove_dead_clusters()
        assert dead in removed and live not in removed
        assert not os.path.exists(dead) and os.path.exists(live)
        holder.wait(timeout=10)
        assert process_gone(holder.pid) and bystander.poll() is None
    finally:
        for proc in (holder, bystander):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for where in (dead, live):
            subprocess.run(["rm", "-rf", where], check=False)


def test_questions_to_a_silent_control_store_stop_waiting_only_once_the_run_winds_down():
    import threading

    from components.hosts import ray_cluster

    never = threading.Event()  # a control store that accepts a question and does not answer until released
    saved = (ray_cluster._Silent.patience, ray_cluster._Silent.since)
    try:
        ray_cluster._Silent.patience = ray_cluster._Silent.since = None
        assert ray_cluster.answered(lambda: "alive") == "alive"  # while the run goes on: asked here, answered
        ray_cluster.winding_down()
        ray_cluster._Silent.patience = 0.05  # the bound itself, shortened for the test
        assert ray_cluster.answered(lambda: never.wait() and "late") is None
        assert ray_cluster._Silent.since is not None
        assert ray_cluster.answered(lambda: "alive") is None  # silent once: no later question waits
    finally:
        never.set()
        ray_cluster._Silent.patience, ray_cluster._Silent.since = saved


def test_a_session_directory_that_names_no_driver_is_removed_once_old_and_unheld():
    import tempfile

    old = tempfile.mkdtemp(prefix=OWN_TEMP_PREFIX, dir="/tmp")  # half removed: no driver.pid, long untouched
    new = tempfile.mkdtemp(prefix=OWN_TEMP_PREFIX, dir="/tmp")  # being made: driver.pid not written yet
    long_ago = os.stat(old).st_mtime - 3600
    os.utime(old, (long_ago, long_ago))
    try:
        assert old in remove_dead_clusters() and not os.path.exists(old)
        assert os.path.exists(new)
    finally:
        for where in (old, new):
            subprocess.run(["rm", "-rf", where], check=False)
