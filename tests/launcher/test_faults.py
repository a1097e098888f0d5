"""Faults seen through the launcher, as a user runs it: a service killed with SIGKILL mid-run, SIGTERM, Ctrl-C.

Each run is a real ``python -m launcher`` in a session of its own, with its own temporary directory (so a
``pymp-*`` directory left by multiprocessing would show), and afterwards nothing of it may remain: no process of
its group, no shared-memory segment named after one of its processes, no temporary directory.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pathlib
import shutil
import signal
import tempfile
import time

import pytest

from tests.helpers import pgroup_members, popen_cli, process_gone, wait_until

pytestmark = pytest.mark.slow

# progress lines go to stderr when it is not a terminal: the first comes with the first batch
LONG_RUN = ("recipe.total_frames=10000000", "recipe.target_return=null", "launcher.progress=true")


@pytest.fixture(autouse=True)
def _short_tmp(tmp_path):
    """``tmp_path / "tmp"``: the run's TMPDIR, a link to a directory with a short path (the forkserver listens on a
    Unix socket under TMPDIR, whose path holds 107 bytes; a pytest ``tmp_path`` can pass that on its own)."""
    short = tempfile.mkdtemp(prefix="faults-")
    (tmp_path / "tmp").symlink_to(short)
    yield
    shutil.rmtree(short, ignore_errors=True)


def _start(tmp_path, *overrides: str):
    run_dir, tmp = tmp_path / "run", os.readlink(tmp_path / "tmp")
    out, err = open(tmp_path / "stdout", "w"), open(tmp_path / "stderr", "w")
    with out, err:
        proc = popen_cli(*overrides, *LONG_RUN, f"hydra.run.dir={run_dir}", cwd=str(tmp_path), stdout=out, stderr=err,
                         env={**os.environ, "TMPDIR": str(tmp)})
    services = run_dir / "services.json"
    try:
        wait_until(lambda: proc.poll() is not None or services.exists(), timeout=120, what="every service started")
        assert proc.poll() is None, (tmp_path / "stderr").read_text()
        # training is under way once the first progress line is out: the recipe prints it right after it logged
        # a batch's metrics (which flush_every keeps in the logger's memory: the file says nothing yet)
        wait_until(lambda: proc.poll() is not None or "[progress] frames=" in (tmp_path / "stderr").read_text(),
                   timeout=60, what="the first batch trained")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, run_dir, json.loads(services.read_text())


def _steps(run_dir, prefix: str = "") -> set[int]:
    """The steps of the rows in metrics.csv whose tag starts with ``prefix``."""
    rows = [line.split(",") for line in (run_dir / "metrics.csv").read_text().splitlines()[1:]]
    return {int(r[1]) for r in rows if r[0].startswith(prefix)}


def _finish(proc, timeout: float = 30.0) -> None:
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _assert_nothing_left(proc, tmp_path, services: dict, also: list[int] = ()) -> None:
    pids = [proc.pid] + [pid for s in services.values() for pid in s["pids"]] + list(also)
    wait_until(lambda: all(process_gone(pid) for pid in pids) and not pgroup_members(proc.pid), timeout=10,
               what="every process of the run gone")

    def leftovers() -> list[str]:
        return [name for name in os.listdir("/dev/shm") if any(name.startswith(f"rlsvc_{pid}_") for pid in pids)]

    # a process that was killed leaves its segments to its resource tracker, which unlinks them as it notices
    with contextlib.suppress(AssertionError):  # the assertion below names what is left
        wait_until(lambda: not leftovers(), timeout=10, what="every segment of the run unlinked")
    assert leftovers() == []
    assert [where for where in glob.glob("/tmp/rlsvc_ray_*/driver.pid")  # a local Ray cluster's session directory
            if _read(where) == str(proc.pid)] == []

    # multiprocessing's pymp-* directory included (torch keeps its compiler cache there on purpose)
    assert [name for name in os.listdir(tmp_path / "tmp") if not name.startswith("torchinductor_")] == []


def _read(path: str) -> str:
    try:
        return pathlib.Path(path).read_text().strip()
    except OSError:  # another run's directory, removed meanwhile
        return ""


KILLS = [("process", "replay"), ("process", "inference"), ("process", "logger"), ("process", "collector"),
         ("ray", "replay")]


@pytest.mark.parametrize("placement, component", KILLS, ids=[f"{p}-{c}" for p, c in KILLS])
def test_a_service_killed_mid_run_is_one_line_naming_it_and_exit_3(tmp_path, placement, component):
    proc, run_dir, services = _start(tmp_path, "+recipe=dqn", f"service={placement}", "logger.flush_every=1000000")
    victim = services[component]["pids"][0]
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    _finish(proc, timeout=60)
    took = time.monotonic() - killed
    err = (tmp_path / "stderr").read_text()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 3, err
    # one line says it all (a Ray cluster's own start-up warnings may come before it)
    assert [line for line in lines if line.startswith("error:")] == lines[-1:] and "Traceback" not in err, err
    name = "collector-0" if component == "collector" else component
    cause = f"the {name} process died (killed by SIGKILL)" if placement == "process" else \
        f"its ray host {name} is no longer alive"
    assert lines[-1].startswith(f"error: {component} ({placement}, pid {victim}) died: {cause}"), err
    assert took < 10.0, f"the run took {took:.1f} s to end after the kill"  # about 1 s on an idle machine
    log = (run_dir / "launcher.log").read_text()
    assert "Traceback" in log and "PeerFailureError" in log  # the whole story is in the log
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed"].startswith(f"{component} ({placement}")
    if component != "logger":  # the last reading of the edges, taken as the run ended, is on disk
        assert max(_steps(run_dir, "edge/")) == summary["frames"] > 0
    _assert_nothing_left(proc, tmp_path, services)


# (the first collects while it learns: its workers are a batch ahead of what the learner has counted)
SIGNALS = [("process", signal.SIGTERM, 143, "SIGTERM", "group", "components.collector.sync=false"),
           ("process", signal.SIGINT, 130, "SIGINT", "group", "components.collector.sync=true"),
           ("ray", signal.SIGTERM, 143, "SIGTERM", "driver", "components.collector.sync=true")]


@pytest.mark.parametrize("placement, sig, status, word, to, sync", SIGNALS, ids=[f"{s[0]}-{s[3]}" for s in SIGNALS])
def test_sigterm_and_sigint_stop_in_order_and_keep_every_logged_value(tmp_path, placement, sig, status, word, to,
                                                                      sync):
    proc, run_dir, services = _start(tmp_path, "+recipe=ppo", f"service={placement}", "logger.flush_every=1000000",
                                     sync)
    if to == "group":
        os.killpg(proc.pid, sig)  # as a terminal or a batch system does: the whole process group
    else:
        os.kill(proc.pid, sig)  # the driver alone: Ray's own handler must not take the signal from the launcher
    _finish(proc)
    err = (tmp_path / "stderr").read_text()
    assert proc.returncode == status, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["signal"] == word
    log = (run_dir / "launcher.log").read_text()
    for name in ("collector", "inference", "replay", "weight_sync", "logger"):
        assert f"stopping {name}" in log
    # rows were held in memory (flush_every is huge): the orderly shutdown wrote them all, down to the last
    # reading of the edges taken at the very end, at the frame count the summary reports: CSV, TensorBoard and
    # summary.json agree on where the run ended (PPO logs each batch's metrics just before the progress line counts it)
    assert summary["frames"] > 0 and summary["frames"] == max(_steps(run_dir, "train/"))
    assert max(_steps(run_dir, "edge/")) == summary["frames"]
    assert f"terminated ({word})" in err or "interrupted: every service" in err, err
    _assert_nothing_left(proc, tmp_path, services)


def test_a_second_ctrl_c_does_not_cut_the_shutdown_short(tmp_path):
    # an impatient user presses Ctrl-C twice: the shutdown the first began still runs to its end (nothing is left for
    # the resource tracker to clean up and warn about) and the run exits 130 with its summary
    proc, run_dir, services = _start(tmp_path, "+recipe=ppo", "service=process", "transport=shared_memory")
    os.killpg(proc.pid, signal.SIGINT)
    wait_until(lambda: "stopping" in (run_dir / "launcher.log").read_text(), timeout=30, what="the shutdown begun")
    os.killpg(proc.pid, signal.SIGINT)
    _finish(proc)
    err = (tmp_path / "stderr").read_text()
    assert proc.returncode == 130, err
    assert "resource_tracker" not in err and "leaked" not in err and "Traceback" not in err, err
    assert "SIGINT while the services shut down: each stops within 10 s" in err, err  # the second one, answered
    assert err.rstrip().endswith("interrupted: every service was shut down"), err
    assert json.loads((run_dir / "summary.json").read_text())["signal"] == "SIGINT"
    _assert_nothing_left(proc, tmp_path, services)


def test_sigterm_to_a_ray_run_s_whole_group_ends_in_order(tmp_path):
    # Slurm's preemption, scancel and a terminal signal every process: the local cluster's daemons and workers block
    # SIGTERM, so the driver still stops every service in order (the logger writes every row it held in memory),
    # writes the summary, stops the cluster and exits, well within a batch system's grace period (how soon, over 20
    # tries: benchmarks/sigterm.py)
    proc, run_dir, services = _start(tmp_path, "+recipe=ppo", "service=ray", "logger.flush_every=1000000",
                                     "logger.flush_seconds=1000")
    cluster = _ray_processes(proc.pid)
    assert cluster, "no process of the run's Ray cluster found"
    os.killpg(proc.pid, signal.SIGTERM)
    _finish(proc, timeout=60)
    err = (tmp_path / "stderr").read_text()
    assert proc.returncode == 143 and err.rstrip().endswith("terminated (SIGTERM): every service was shut down"), err
    assert "SIGTERM received" not in err and "Traceback" not in err  # not Ray's crash dump
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["signal"] == "SIGTERM" and summary["frames"] > 0
    assert summary["frames"] in _steps(run_dir, "train/")  # the logger was stopped, not killed with the cluster
    _assert_nothing_left(proc, tmp_path, services, also=cluster)


def _ray_processes(driver: int) -> list[int]:
    """The processes holding files in the session directory of the local Ray cluster ``driver`` started (its daemons,
    agents and workers)."""
    from components.hosts.ray_cluster import OWN_TEMP_PREFIX, processes_holding

    (where,) = [os.path.dirname(p) for p in glob.glob(f"/tmp/{OWN_TEMP_PREFIX}*/driver.pid") if _read(p) == str(driver)]
    return processes_holding(where)


def test_a_service_that_does_not_start_is_one_line_and_exit_3(tmp_path):
    from tests.helpers import run_cli

    run_dir = tmp_path / "run"
    result = run_cli("+recipe=ppo", "components.replay.placement=process",
                     "components.replay.resources.startup_timeout=0.001", f"hydra.run.dir={run_dir}",
                     cwd=str(tmp_path), timeout=120)
    assert result.returncode == 3, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: replay (process) failed to start: replay: not ready within 0.001 s; "
                           "every other service was shut down (traceback: "), line
    assert json.loads((run_dir / "summary.json").read_text())["failed"].startswith("replay (process) failed")
