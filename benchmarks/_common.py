"""Pieces the benchmark scripts share: starting an owner (remembering its child's pid for the leak check),
stopping a helper process (or a peer's process group) politely, then firmly, and running a peer's script, a function
of a benchmark in a fresh interpreter, or a ``python -m launcher`` run, for the JSON they give back."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable


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


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_child(command: list[str], timeout: float, quiet: bool = False) -> str:
    """Run ``command`` (from the checkout) in a session of its own and return its stdout; on a timeout or an
    interruption its whole process group is stopped (:func:`stop_group`). ``quiet``: its stderr is kept, and shown
    only if it fails."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE if quiet else None, text=True,
                            start_new_session=True, cwd=ROOT)
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
    """Run a peer's script (another interpreter) with :func:`run_child`; the JSON it prints last."""
    return json.loads(run_child(command, timeout, quiet).strip().splitlines()[-1])


def in_child(module: str, call: str, timeout: float) -> dict:
    """``module.call`` (a benchmark of ``benchmarks/``, a call returning plain data) in a fresh interpreter: its own
    torch threads, nothing warm from the others."""
    code = (f"import json, sys; sys.path.insert(0, {os.path.join(ROOT, 'benchmarks')!r}); import {module}; "
            f"print(json.dumps({module}.{call}))")
    return peer_json([sys.executable, "-c", code], timeout, quiet=True)


def steady_rate(result: dict) -> float | None:
    """The frames/s a benchmark reports for a run: its rate after the start (``steady_fps``: ours from the second
    batch on, Sample Factory's after its first training iteration), the whole run's where a run is too short for it."""
    return result.get("steady_fps") or result.get("fps")


def launcher_summary(overrides: list[str], timeout: float) -> dict:
    """``python -m launcher *overrides`` in a run directory of its own (removed after); its ``summary.json``."""
    with tempfile.TemporaryDirectory(prefix="bench_run_") as run_dir:
        run_child([sys.executable, "-m", "launcher", *overrides, f"hydra.run.dir={run_dir}"], timeout, quiet=True)
        with open(os.path.join(run_dir, "summary.json")) as f:
            return json.load(f)


def compose_launcher(overrides: list[str]):
    """The config ``python -m launcher *overrides`` composes (``+recipe=...`` accepted as the launcher accepts it)."""
    from launcher.conventions import normalize_argv
    from launcher.preflight import compose

    return compose(normalize_argv(list(overrides)))


def sample_factory_update(overrides: list[str] = ()) -> list[str]:
    """Sample Factory's arguments for the update our APPO makes on Atari (``+recipe=appo env=atari``, settings
    ``conf/recipe_env/appo_atari.yaml``, with the launcher ``overrides`` composed in): its samples per update,
    minibatches and passes."""
    cfg = compose_launcher(["+recipe=appo", "env=atari", *overrides]).recipe
    return ["--batch-size", str(cfg.batch_size * cfg.unroll_length), "--minibatches", str(cfg.num_minibatches),
            f"--num_epochs={cfg.update_epochs}"]


def sample_factory_appo(python: str, frames: int, seed: int, timeout: float, wrappers: str = "sf",
                        env: str = "atari_breakout", overrides: list[str] = ()) -> dict:
    """Sample Factory 2.1.1's APPO on an Atari game (``benchmarks/sample_factory_peer.py``, run by ``python``, the
    interpreter of its own venv) for ``frames`` agent steps, making the update our APPO makes on Atari
    (:func:`sample_factory_update`, ``overrides`` applied). ``wrappers``: ``sf`` for SF's own Atari stack, ``ours``
    for the game as ``env=atari`` plays it. The peer's JSON result."""
    update = sample_factory_update(overrides)
    return peer_json([python, os.path.join(ROOT, "benchmarks", "sample_factory_peer.py"), "--frames", str(frames),
                      "--seed", str(seed), "--wrappers", wrappers, "--env", env, *update], timeout, quiet=True)


class OtherLoad:
    """CPU seconds that processes outside this one's tree used while it ran (Linux ``/proc``): on a shared machine,
    a benchmark measured beside someone else's test run says so instead of printing its slowdown as ours.

    This tree is this process, its live descendants and, through their ``cutime``/``cstime``, the descendants they
    reaped (a forkserver's children, a vector env's subprocesses). Call :meth:`seconds` at the end."""

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
