"""SIGTERM to a run's whole process group, as Slurm's preemption, ``scancel`` and a terminal send it: how often the run
still ends in order, and how fast.

Each try starts ``python -m launcher`` (by default a Ray run, ``+recipe=appo env=minatar service=ray
transport=distributed``) in a session of its own, with a run directory and a ``TMPDIR`` of its own, waits until
training is under way (``services.json`` written and the first progress line out), then sends SIGTERM to the whole
process group (``os.killpg``: the local Ray cluster's daemons and workers get it too) and times how long the
launcher's process takes to exit. Then it checks what the run left:

* the exit status (143 expected) and ``summary.json`` (``interrupted``, ``signal: SIGTERM``);
* the logged rows: the logger holds them in memory (`LONG_RUN`), so ``metrics.csv`` has a row at the frames
  ``summary.json`` reports only where the logger was stopped in order;
* processes: every process of the run seen before the signal (the process group, the service pids of
  ``services.json``, every process holding a file in the local Ray cluster's session directory) still alive;
* the local Ray cluster's session directory (``/tmp/rlsvc_ray_*`` naming the driver);
* shared-memory segments (``/dev/shm/rlsvc_<pid>_*``) named after any of those processes;
* multiprocessing's and the run's temporary files in its ``TMPDIR``.

What is left is counted as the launcher exits and again after `SETTLE_S` seconds (an actor's process may still
be ending). Whatever is left at the end of a try is removed (SIGKILL to those processes, the directory and segments
unlinked) so the next try starts clean. Run from the repository root:

    python benchmarks/sigterm.py                          # 20 tries of the Ray run
    python benchmarks/sigterm.py --tries 3                # a quick look
    python benchmarks/sigterm.py --tries 5 -- +recipe=ppo service=ray

Target (PASS/MISS printed at the end): every try exits 143 with a ``summary.json`` and every row, and leaves nothing,
each within 5 s of the signal.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from _harness import launcher_command, read_summary, spread, start_child  # first: the checkout on sys.path
from _results import Results, say, show
from components.hosts.ray_cluster import processes_holding

DEFAULT_RUN = ["+recipe=appo", "env=minatar", "service=ray", "transport=distributed"]
LONG_RUN = ["recipe.total_frames=100000000", "recipe.target_return=null", "launcher.progress=true",
            "launcher.plot=false", "logger.flush_every=1000000", "logger.flush_seconds=1000"]
"""Trains until signalled; the logger keeps every row in memory until it is stopped, so a row on disk at the frames
``summary.json`` reports shows the logger was stopped in order (a logger killed with the cluster loses them all)."""
TARGET_S = 5.0
"""Seconds from the signal to the launcher's exit that the target allows."""
SETTLE_S = 10.0
"""Seconds given, after the driver exited, to what it left to end by itself before it counts as left."""


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=20, help="runs to start and signal")
    parser.add_argument("--start-timeout", type=float, default=180.0,
                        help="seconds a run may take to start training before the try counts as failed")
    parser.add_argument("--exit-timeout", type=float, default=60.0,
                        help="seconds a signalled run may take to exit before it is killed (SIGKILL to its group)")
    parser.add_argument("--no-save", action="store_true", help="print the tables only, record nothing")
    parser.add_argument("overrides", nargs="*", help=f"the run's overrides (default: {' '.join(DEFAULT_RUN)})")
    return parser


# ---------------------------------------------------------------------------------------------- what a run holds
def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _group(pgid: int) -> set[int]:
    return {int(e) for e in os.listdir("/proc") if e.isdigit() and (f := _stat(int(e))) and int(f[2]) == pgid}


def _session_dir(driver: int) -> str | None:
    """The local Ray cluster's session directory of ``driver`` (it writes its pid there), if any."""
    for path in glob.glob("/tmp/rlsvc_ray_*/driver.pid"):
        with contextlib.suppress(OSError):
            if open(path).read().strip() == str(driver):
                return os.path.dirname(path)
    return None


def _segments(pids: set[int]) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith("rlsvc_") and n.split("_")[1].isdigit()
                  and int(n.split("_")[1]) in pids)


def _left(pids: set[int], session: str | None, tmp: str) -> dict[str, list]:
    return {"processes": sorted(p for p in pids if _alive(p)),
            "session": [session] if session and os.path.exists(session) else [],
            "segments": _segments(pids),
            "tmp": sorted(n for n in os.listdir(tmp) if not n.startswith("torchinductor_"))}


def _count(left: dict[str, list]) -> int:
    return sum(len(v) for v in left.values())


def _clean(left: dict[str, list]) -> None:
    """Remove what a try left, so the next one starts clean."""
    for pid in left["processes"]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for where in left["session"]:
        shutil.rmtree(where, ignore_errors=True)
    for name in left["segments"]:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join("/dev/shm", name))


def _shutdown_log(run_dir: str) -> str:
    """The lines of the run's ``launcher.log`` from the first service stopped on (with their times): where a slow exit's
    seconds went."""
    try:
        with open(os.path.join(run_dir, "launcher.log")) as f:
            lines = f.read().splitlines()
    except OSError:
        return ""
    first = next((n for n, line in enumerate(lines) if "stopping " in line), max(0, len(lines) - 10))
    return "\n".join(lines[max(0, first - 3):])


def _named(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().decode(errors="replace").split("\0")
    except OSError:
        return str(pid)
    return f"{pid} {' '.join(words)[:70].strip()}"


def _logged_at(run_dir: str, frames: int | None) -> bool:
    """Whether ``metrics.csv`` holds a row logged at ``frames`` (the step the summary reports)."""
    try:
        with open(os.path.join(run_dir, "metrics.csv")) as f:
            return any(line.split(",")[1] == str(frames) for line in f.read().splitlines()[1:] if "," in line)
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------- one try
def _wait(condition, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


def one_try(overrides: list[str], start_timeout: float, exit_timeout: float) -> dict:
    """Start a run, SIGTERM its process group once it trains, and report how it ended and what it left."""
    with tempfile.TemporaryDirectory(prefix="bench_sigterm_") as where:
        run_dir, tmp = os.path.join(where, "run"), os.path.join(where, "tmp")
        os.mkdir(tmp)
        err_path = os.path.join(where, "stderr")
        with open(os.path.join(where, "stdout"), "w") as out, open(err_path, "w") as err:
            proc = start_child(launcher_command([*overrides, *LONG_RUN], run_dir), stdout=out, stderr=err,
                               env={**os.environ, "TMPDIR": tmp})

        def stderr() -> str:
            with open(err_path) as f:
                return f.read()

        left: dict[str, list] = {}
        try:
            started = _wait(lambda: proc.poll() is not None or (
                os.path.exists(os.path.join(run_dir, "services.json")) and "[progress] frames=" in stderr()),
                start_timeout, 0.2)
            if not started or proc.poll() is not None:
                return {"status": proc.poll(), "seconds": None, "said": None, "summary": False, "rows": False,
                        "left_at_exit": {}, "left": {}, "note": f"did not start training: {stderr()[-800:]}"}
            with open(os.path.join(run_dir, "services.json")) as f:
                services = json.load(f)
            session = _session_dir(proc.pid)
            pids = _group(proc.pid) | {p for s in services.values() for p in s["pids"]}
            if session:
                pids |= set(processes_holding(session))
            os.killpg(proc.pid, signal.SIGTERM)
            signalled = time.monotonic()
            said = None  # when the run's last line (how it ended) was out: the rest is the interpreter's exit
            while proc.poll() is None and time.monotonic() - signalled < exit_timeout:
                if said is None and stderr().rstrip().endswith("every service was shut down"):
                    said = time.monotonic() - signalled
                time.sleep(0.02)
            seconds = time.monotonic() - signalled if proc.poll() is not None else None
            pids |= _group(proc.pid)
            at_exit = _left(pids - {proc.pid} if seconds is not None else pids, session, tmp)
            _wait(lambda: _count(_left(pids, session, tmp)) == 0, SETTLE_S, 0.1)
            left = _left(pids, session, tmp)
            summary = read_summary(run_dir)
            lines = [line for line in stderr().splitlines() if line.strip()]
            return {"status": proc.returncode, "seconds": seconds, "said": said,
                    "summary": bool(summary and summary.get("interrupted") and summary.get("signal") == "SIGTERM"),
                    "rows": bool(summary) and _logged_at(run_dir, summary.get("frames")),
                    "left_at_exit": {k: [_named(p) for p in v] if k == "processes" else v
                                     for k, v in at_exit.items() if v},
                    "left": {k: v for k, v in left.items() if v},
                    "note": "\n".join(lines[-25:]) if proc.returncode != 143 else
                    "" if seconds is not None and seconds < TARGET_S else _shutdown_log(run_dir)}
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if left:
                _clean(left)


# ---------------------------------------------------------------------------------------------- the table
def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def main(argv: list[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    overrides = args.overrides or DEFAULT_RUN
    results = Results("sigterm", argv)
    tries = []
    for n in range(args.tries):
        got = one_try(overrides, args.start_timeout, args.exit_timeout)
        tries.append(got)
        print(f"try {n + 1}/{args.tries}: exit {got['status']} after {_seconds(got['seconds'])} s (last line after "
              f"{_seconds(got['said'])} s), summary {got['summary']}, rows {got['rows']}, left at exit "
              f"{got['left_at_exit'] or 'nothing'}, left {got['left'] or 'nothing'}", flush=True)
        if got["note"]:
            print("    " + got["note"].replace("\n", "\n    "), flush=True)
    times, said = spread(t["seconds"] for t in tries), spread(t["said"] for t in tries)
    statuses: dict[str, int] = {}
    for t in tries:
        statuses[str(t["status"])] = statuses.get(str(t["status"]), 0) + 1
    good = [t for t in tries if t["status"] == 143 and t["summary"] and t["rows"] and not t["left"]
            and t["seconds"] is not None and t["seconds"] < TARGET_S]
    show(results, f"SIGTERM to the process group of `python -m launcher {' '.join(overrides)}`",
         ["tries", "exit statuses", "median s to exit", "max s to exit", "median s to the last line", "summary.json",
          "rows kept", "left at exit", f"left {SETTLE_S:g} s later", "all good"],
         [[len(tries), ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())),
           _seconds(times and times.median), _seconds(times and times.high), _seconds(said and said.median),
           sum(t["summary"] for t in tries),
           sum(t["rows"] for t in tries), sum(bool(t["left_at_exit"]) for t in tries),
           sum(bool(t["left"]) for t in tries), len(good)]],
         note="last line: the run's `terminated (SIGTERM)` line, once every service and the cluster were stopped (the "
              "rest is the process's exit); rows kept: metrics.csv has the row logged at the summary's frames; left: "
              "tries that left a process, the Ray session directory, a shared-memory segment or a temporary file; all "
              "good: exit 143, summary.json, rows kept, nothing left, within the target's seconds")
    show(results, "each try", ["try", "exit", "s to exit", "s to the last line", "summary.json", "rows kept",
                               "left at exit", "left later"],
         [[n + 1, t["status"], _seconds(t["seconds"]), _seconds(t["said"]), t["summary"], t["rows"],
           ", ".join(f"{k}: {len(v)}" for k, v in t["left_at_exit"].items()) or "-",
           ", ".join(f"{k}: {len(v)}" for k, v in t["left"].items()) or "-"] for n, t in enumerate(tries)])
    verdict = "PASS" if len(good) == len(tries) else "MISS"
    say(results.verdict, f"{verdict} {len(good)}/{len(tries)} tries exit 143 with summary.json, every row and nothing "
                         f"left within {TARGET_S:g} s of the signal")
    if not args.no_save:
        results.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
