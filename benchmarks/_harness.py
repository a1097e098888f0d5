"""What every benchmark script repeats: the checkout on ``sys.path``, the statistics of its tables, its measuring
loops, the processes it starts and stops, and its ``python -m launcher`` runs.

A script imports it first, by its bare name (``python benchmarks/<name>.py`` puts ``benchmarks/`` on ``sys.path``,
so this module is found beside the script); importing it puts the checkout on ``sys.path`` too, so the project's
packages import after it from wherever the script is run:

    from _harness import latency, start_owner    # first: the imports below it find the project
    from _results import Results, say
    from components.replay import ReplayBuffer

It imports nothing from the project at its top (numpy and the standard library only), so the peers' scripts, which
run in other virtual environments, measure with the same functions as ours.

Its parts:

* statistics: `latency` (p50, p95, calls/s of measured latencies), `percentiles`, `spread`
  (median and range over seeds or rounds);
* measuring: `interleaved` (rows of calls in alternating blocks), `round_trips` and `summarize`
  (one client's sequential calls, and several clients' together);
* processes: `start_owner`, `stop_child`, `stop_group`, `start_child`, `run_child`,
  `peer_json`, `in_child`;
* launcher runs: `launcher_command`, `launcher_run`, `read_summary`, `compose_launcher`,
  `steady_rate`;
* `OtherLoad`: the CPU seconds others used on a shared machine while a benchmark ran.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:  # the project's packages, from wherever the script runs
    sys.path.insert(0, ROOT)


# ---------------------------------------------------------------------------------------------- statistics
def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float]:
    """The ``qs`` percentiles (0-100) of ``values`` (numpy's linear interpolation)."""
    return [float(v) for v in np.percentile(np.asarray(values), list(qs))]


def latency(lat: Sequence[float], seconds: float, per_call: int = 1) -> dict:
    """Measured latencies as a table cell: their ``p50`` and ``p95`` (in ``lat``'s unit), ``rate`` (items per second:
    ``per_call`` items per call over ``seconds``) and ``n`` (calls)."""
    p50, p95 = percentiles(lat, (50, 95))
    return {"p50": p50, "p95": p95, "rate": len(lat) * per_call / seconds, "n": len(lat)}


class Spread(NamedTuple):
    """The median of some values (over seeds or rounds) and their range."""

    median: float
    low: float
    high: float

    def range(self, fmt: str = ",.0f") -> str:
        """``low-high``, each formatted with ``fmt``."""
        return f"{self.low:{fmt}}-{self.high:{fmt}}"

    def text(self, fmt: str) -> str:
        """``median (low-high)``, each formatted with ``fmt``."""
        return f"{self.median:{fmt}} ({self.range(fmt)})"


def spread(values: Iterable[float | None]) -> Spread | None:
    """Median, min and max of ``values``, leaving out ``None`` and NaN (a run that measured nothing); ``None`` where
    nothing is left."""
    kept = [v for v in values if v is not None and v == v]
    return Spread(statistics.median(kept), min(kept), max(kept)) if kept else None


# ---------------------------------------------------------------------------------------------- measuring
def interleaved(calls: dict[str, Callable], warmup: int, n: int, *, budget: float, rounds: int = 5,
                numbered: bool = False) -> dict[str, tuple[np.ndarray, float]]:
    """Latencies (us) and wall seconds of up to ``n`` calls of each named callable, after ``warmup`` calls of each,
    measured in ``rounds`` alternating blocks so that every row sees the same load on a shared machine; a row stops
    early once its measured calls took ``budget`` seconds. ``numbered``: each call gets its sequence number (a
    logger's step; the warm-up's first), else no argument."""
    clock = time.perf_counter
    for call in calls.values():
        for i in range(warmup):
            call(i) if numbered else call()
    lat: dict[str, list[float]] = {name: [] for name in calls}
    wall = dict.fromkeys(calls, 0.0)
    per_round = max(1, n // rounds)
    step = warmup
    for _ in range(rounds):
        for name, call in calls.items():
            if wall[name] > budget:
                continue
            start = clock()
            for i in range(step, step + per_round):
                t0 = clock()
                call(i) if numbered else call()
                lat[name].append(clock() - t0)
            wall[name] += clock() - start
        step += per_round
    return {name: (np.asarray(v) * 1e6, wall[name]) for name, v in lat.items()}


def round_trips(call: Callable[[], Any], warmup: int, n: int) -> tuple[np.ndarray, float, float]:
    """Latencies (us) of ``n`` calls after ``warmup``, and the monotonic start and end of the measured ones: one
    part of `summarize`."""
    for _ in range(warmup):
        call()
    lat = np.empty(n)
    clock = time.perf_counter
    start = time.monotonic()
    for i in range(n):
        t0 = clock()
        call()
        lat[i] = clock() - t0
    return lat * 1e6, start, time.monotonic()


def summarize(parts: list, sequential: bool = False) -> dict:
    """`latency` of the `round_trips` ``parts`` together: clients measured at once (requests/s over the
    span from the first start to the last end) or, ``sequential``, one client's rounds (over their own durations)."""
    lat = np.concatenate([p[0] for p in parts])
    seconds = (sum(p[2] - p[1] for p in parts) if sequential else
               max(p[2] for p in parts) - min(p[1] for p in parts))
    return latency(lat, seconds)


# ---------------------------------------------------------------------------------------------- processes
def start_owner(owner: Any, pids: set) -> float:
    """Start ``owner``; add the pid of its child process (if it has one) to ``pids``; return seconds taken."""
    t0 = time.perf_counter()
    owner.start()
    if owner.host is not None and not owner.host.same_process:
        pids.add(owner.host.pid)
    return time.perf_counter() - t0


def stop_child(proc, stop: Callable[[], Any]) -> None:
    """Call ``stop`` (a message asking ``proc`` to exit), then join; terminate if it does not exit in time."""
    try:
        stop()
    except (OSError, ValueError):
        pass
    proc.join(10)
    if proc.is_alive():
        proc.terminate()
        proc.join(5)


def stop_group(proc) -> None:
    """SIGTERM to the process group of ``proc`` (a ``Popen`` started with ``start_new_session=True``; it shuts its
    owners down), then SIGKILL to what is left of the group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def start_child(command: list[str], **popen: Any) -> subprocess.Popen:
    """``command`` started from the checkout in a session of its own, so that its whole process group can be
    signalled (`stop_group`); ``popen``: more ``subprocess.Popen`` arguments (its output, its environment)."""
    return subprocess.Popen(command, start_new_session=True, cwd=ROOT, **popen)


def run_child(command: list[str], timeout: float, quiet: bool = False) -> str:
    """Run ``command`` with `start_child` and return its stdout; on a timeout or an interruption its whole
    process group is stopped (`stop_group`). ``quiet``: its stderr is kept, and shown only if it fails."""
    proc = start_child(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE if quiet else None, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop_group(proc)
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with status {proc.returncode}"
                           + (f":\n{err[-2000:]}" if err else ""))
    return out


def peer_json(command: list[str], timeout: float, quiet: bool = False) -> dict:
    """Run a peer's script (another interpreter) with `run_child`; the JSON it prints last."""
    return json.loads(run_child(command, timeout, quiet).strip().splitlines()[-1])


def in_child(module: str, call: str, timeout: float) -> dict:
    """``module.call`` (a benchmark of ``benchmarks/``, a call returning plain data) in a fresh interpreter: its own
    torch threads, nothing warm from the others."""
    code = (f"import json, sys; sys.path.insert(0, {HERE!r}); import {module}; "
            f"print(json.dumps({module}.{call}))")
    return peer_json([sys.executable, "-c", code], timeout, quiet=True)


# ---------------------------------------------------------------------------------------------- launcher runs
def launcher_command(overrides: Sequence[str], run_dir: str) -> list[str]:
    """The command line of ``python -m launcher *overrides`` writing its run to ``run_dir``."""
    return [sys.executable, "-m", "launcher", *overrides, f"hydra.run.dir={run_dir}"]


def read_summary(run_dir: str) -> dict | None:
    """A run's ``summary.json`` (``None`` where the run wrote none)."""
    path = os.path.join(run_dir, "summary.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def launcher_run(overrides: Sequence[str], timeout: float, run_dir: str | None = None,
                 read: Callable[[str], Any] = read_summary) -> tuple[Any, float]:
    """``python -m launcher *overrides`` (`launcher_command`, run by `run_child`, its stderr shown only if
    it fails) in ``run_dir`` (default: a temporary directory, removed after). Returns what ``read`` makes of the run
    directory (default: its ``summary.json``) and the seconds the process took, start-up and exit included."""
    with contextlib.ExitStack() as stack:
        if run_dir is None:
            run_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_run_"))
        start = time.perf_counter()
        run_child(launcher_command(overrides, run_dir), timeout, quiet=True)
        seconds = time.perf_counter() - start
        return read(run_dir), seconds


def compose_launcher(overrides: list[str]):
    """The config ``python -m launcher *overrides`` composes (``+recipe=...`` accepted as the launcher accepts it)."""
    from launcher.conventions import normalize_argv
    from launcher.preflight import compose

    return compose(normalize_argv(list(overrides)))


def steady_rate(result: dict) -> float | None:
    """The frames/s a benchmark reports for a run: its rate after the start (``steady_fps``: ours from the second
    batch on, Sample Factory's after its first training iteration), the whole run's where a run is too short for it."""
    return result.get("steady_fps") or result.get("fps")


# ---------------------------------------------------------------------------------------------- a shared machine
class OtherLoad:
    """CPU seconds that processes outside this one's tree used while it ran (Linux ``/proc``): on a shared machine,
    a benchmark measured beside someone else's test run says so instead of printing its slowdown as ours.

    This tree is this process, its live descendants and, through their ``cutime``/``cstime``, the descendants they
    reaped (a forkserver's children, a vector env's subprocesses). Call `seconds` at the end."""

    def __init__(self):
        self._tick = os.sysconf("SC_CLK_TCK")
        self._busy0, self._own0, self._t0 = self._busy(), self._own(), time.monotonic()

    def _busy(self) -> float:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return (sum(fields[:8]) - fields[3] - fields[4]) / self._tick  # all but idle and iowait

    def _own(self) -> float:
        parents, times = {}, {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            parents[int(entry)] = int(rest[1])
            times[int(entry)] = sum(int(x) for x in rest[11:15]) / self._tick  # utime stime cutime cstime
        tree, grew = {os.getpid()}, True
        while grew:
            more = {pid for pid, parent in parents.items() if parent in tree} - tree
            tree |= more
            grew = bool(more)
        return sum(times.get(pid, 0.0) for pid in tree)

    def seconds(self) -> tuple[float, float]:
        """(CPU seconds used by other processes since construction, wall seconds since construction)."""
        return max(0.0, (self._busy() - self._busy0) - (self._own() - self._own0)), time.monotonic() - self._t0
