"""Load checks shared by ``benchmarks/load.py`` (full scale) and ``tests/components/test_load.py`` (CI scale).

One *cell* is a component, a placement and a transport. `run_cell` starts its owner, hands one client to
each simulated caller, drives them all at once in two phases (a warm-up of `WARMUP` of each caller's
calls, then the rest), reads the owner's resident memory after each phase and returns a `Result`:

* ``inference``: each request is the int64 pair ``(client id, sequence)`` and the server runs an echo policy
  (``action = observation``), so each answer names the request it belongs to. ``lost``: requests whose own
  answer never came back (an error, a timeout, or someone else's answer in its place; requests a failed
  client never sent count too); ``misrouted``: answers carrying another request's pair; ``duplicated``: answers
  carrying a pair already delivered, plus requests the server served beyond those sent (its ``requests``
  statistic).
* ``replay``: each producer extends rows with unique ids and keeps the positions each extend acknowledges.
  Afterwards one epoch of the ``without_replacement`` sampler (which draws every stored row once before any
  twice) is read. ``lost``: acknowledged rows the epoch never returned (and rows of failed extends);
  ``duplicated``: rows returned more than once, or two rows acknowledged at one position; ``misrouted``: rows
  found at a position other than the one their extend acknowledged.

Callers of a ``process`` owner are threads of `Workers` (spawned processes started once and handed each
cell's clients over a pipe); callers of ``thread`` and ``ray`` owners are threads of this process. Memory is
``VmRSS`` of ``/proc/<owner.host.pid>/status``: a Ray owner's actor process; for a ``thread`` owner, this process,
so the figure includes the callers.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from dataclasses import dataclass, field

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from components.inference import InferenceServer, InferenceServerConfig
from components.replay import ReplayBuffer, ReplayConfig
from transports.config import TransportConfig

from benchmarks._harness import stop_child

INFERENCE_CELLS = ["thread/thread", "thread/direct", "process/queue", "process/shared_memory", "process/process_slot",
                   "process/distributed", "ray/ray", "ray/distributed"]
REPLAY_CELLS = ["thread/thread", "process/queue", "process/shared_memory", "process/distributed", "ray/ray",
                "ray/distributed"]
WARMUP = 0.1  # share of each caller's calls made before the first memory reading
MEMORY_BOUND = 10.0  # most growth (%) of the owner's RSS from the end of the warm-up to the end
ROWS_PER_EXTEND = 4
RESULT_TIMEOUT = 60.0  # seconds one call may take before it counts as lost
PHASE_TIMEOUT = 1800.0  # seconds a worker process may take for one phase


class Echo(nn.Module):
    """``action = observation``: the answer carries its request's (client id, sequence) back."""

    def forward(self, td):
        td.set("action", td.get("observation"))
        return td


REQUEST = TensorDict({"observation": torch.zeros(2, dtype=torch.int64)})
RESPONSE = TensorDict({"action": torch.zeros(2, dtype=torch.int64),
                       "policy_version": torch.zeros((), dtype=torch.long)})


@dataclass
class Result:
    """One cell's counts, wall time and the owner's memory (MiB) after the warm-up and at the end."""

    component: str
    cell: str
    calls: int
    lost: int = 0
    duplicated: int = 0
    misrouted: int = 0
    wall_s: float = 0.0
    rss_warm: float = 0.0
    rss_end: float = 0.0
    rows: int = 0  # replay: rows written
    pid: int = 0  # the owner's process
    errors: list = field(default_factory=list)

    @property
    def growth(self) -> float:
        return 100.0 * (self.rss_end - self.rss_warm) / self.rss_warm

    @property
    def in_process(self) -> bool:
        """Whether the owner lives in this process (its memory then includes the callers')."""
        return self.pid == os.getpid()

    @property
    def correct(self) -> bool:
        return not (self.lost or self.duplicated or self.misrouted or self.errors)

    @property
    def flat(self) -> bool:
        return self.growth <= MEMORY_BOUND


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` (``VmRSS``), MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


# ---------------------------------------------------------------------------------------------- owners
def build_owner(component: str, cell: str, callers: int, capacity: int = 0):
    placement, transport = cell.split("/")
    if component == "replay":
        return ReplayBuffer(ReplayConfig(capacity=capacity, sampler="without_replacement", placement=placement),
                            transport=transport, seed=0)
    config = InferenceServerConfig(placement=placement)
    if cell == "ray/distributed":  # the Ray owner discovers the layouts from the first request
        return InferenceServer(config, policy_factory=Echo, transport=transport)
    options = {"num_slots": callers} if transport in ("shared_memory", "process_slot") else {}
    return InferenceServer(config, policy_factory=Echo, transport=TransportConfig(transport, options),
                           request_layout=REQUEST, response_layout=RESPONSE)


def owner_pid(owner) -> int:
    host = owner.host
    return os.getpid() if host is None or host.pid is None else host.pid


# ---------------------------------------------------------------------------------------------- one caller
def infer(client, cid: int, start: int, n: int) -> dict:
    """Requests ``start`` .. ``start + n`` of client ``cid``, one at a time; what came back wrong."""
    ok, wrong = 0, []
    for seq in range(start, start + n):
        try:
            out = client.submit(TensorDict({"observation": torch.tensor([cid, seq])})).result(RESULT_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - counted and reported
            return {"ok": ok, "wrong": wrong, "failed": [(cid, seq)],
                    "errors": [f"client {cid} request {seq}: {type(exc).__name__}: {exc}"]}
        got = tuple(out["action"].tolist())
        if got == (cid, seq):
            ok += 1
        else:
            wrong.append((cid, seq, *got))
    return {"ok": ok, "wrong": wrong, "failed": [], "errors": []}


def extend(client, producer: int, start: int, n: int, per_producer: int) -> dict:
    """Extends ``start`` .. ``start + n`` of ``producer``: the row ids written and the positions acknowledged
    (kept in two preallocated arrays: in this process, a thread owner's memory figure includes them)."""
    ids, positions = np.empty(n * ROWS_PER_EXTEND, np.int64), np.empty(n * ROWS_PER_EXTEND, np.int64)
    for k, e in enumerate(range(start, start + n)):
        first = (producer * per_producer + e) * ROWS_PER_EXTEND
        rows = torch.arange(first, first + ROWS_PER_EXTEND)
        batch = TensorDict({"observation": rows.float().unsqueeze(-1).expand(-1, 4).clone(), "id": rows},
                           [ROWS_PER_EXTEND])
        at = slice(k * ROWS_PER_EXTEND, (k + 1) * ROWS_PER_EXTEND)
        try:
            positions[at] = np.asarray(client.extend(batch), dtype=np.int64)
        except Exception as exc:  # noqa: BLE001 - counted and reported
            return {"ids": [ids[: at.start]], "positions": [positions[: at.start]],
                    "errors": [f"producer {producer} extend {e}: {type(exc).__name__}: {exc}"]}
        ids[at] = rows.numpy()
    return {"ids": [ids], "positions": [positions], "errors": []}


def run_threads(kind: str, callers: list, start: int, n: int, per_caller: int) -> dict:
    """Every ``(id, client)`` of ``callers`` in a thread of its own, all at once; their merged outcomes."""
    outcomes: list = [None] * len(callers)

    def work(i: int, cid: int, client) -> None:
        try:
            outcomes[i] = infer(client, cid, start, n) if kind == "inference" else \
                extend(client, cid, start, n, per_caller)
        except BaseException:  # noqa: BLE001 - reported by the caller
            outcomes[i] = {"errors": [traceback.format_exc()]}

    threads = [threading.Thread(target=work, args=(i, cid, c)) for i, (cid, c) in enumerate(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return merge(kind, outcomes)


def merge(kind: str, outcomes: list) -> dict:
    """Sum the counts and join the lists of several callers' (or phases') outcomes."""
    merged: dict = {"ok": 0, "wrong": [], "failed": [], "errors": []} if kind == "inference" else \
        {"ids": [], "positions": [], "errors": []}
    for outcome in outcomes:
        for key, value in outcome.items():
            merged[key] = merged[key] + value
    return merged


# ---------------------------------------------------------------------------------------------- worker processes
def _worker(conn) -> None:
    """A client process: holds the clients it is handed and runs their calls in threads, phase by phase."""
    torch.set_num_threads(1)
    callers: list = []
    conn.send("ready")
    while (msg := conn.recv()) is not None:
        if msg[0] == "clients":
            callers = msg[1]
            conn.send("ok")
        else:
            _, kind, start, n, per_caller = msg
            conn.send(run_threads(kind, callers, start, n, per_caller))


class Workers:
    """``count`` client processes of their own (from the forkserver owners use: not forks of this process), started
    once and handed each cell's clients over a pipe."""

    def __init__(self, count: int):
        from components.hosts.process import context

        ctx = context()
        self.conns, self.procs = [], []
        try:
            for _ in range(count):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_worker, args=(child,), daemon=True)
                proc.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(proc)
            for conn in self.conns:
                self._recv(conn)
        except BaseException:
            self.close()
            raise

    def _recv(self, conn):
        if not conn.poll(PHASE_TIMEOUT):
            raise TimeoutError(f"a load worker did not answer within {PHASE_TIMEOUT} s")
        return conn.recv()

    def hand(self, callers: list) -> None:
        """Spread ``callers`` over the processes (round robin); ``[]`` drops the previous cell's clients."""
        for i, conn in enumerate(self.conns):
            conn.send(("clients", callers[i :: len(self.conns)]))
        for conn in self.conns:
            self._recv(conn)

    def run(self, kind: str, start: int, n: int, per_caller: int) -> dict:
        for conn in self.conns:
            conn.send(("run", kind, start, n, per_caller))
        return merge(kind, [self._recv(conn) for conn in self.conns])

    def close(self) -> None:
        for conn, proc in zip(self.conns, self.procs):
            stop_child(proc, lambda: conn.send(None))
            conn.close()
        self.conns, self.procs = [], []


class InProcess:
    """Callers as threads of this process (for ``thread`` and ``ray`` owners)."""

    def hand(self, callers: list) -> None:
        self.callers = callers

    def run(self, kind: str, start: int, n: int, per_caller: int) -> dict:
        return run_threads(kind, self.callers, start, n, per_caller)


# ---------------------------------------------------------------------------------------------- one cell
def run_cell(component: str, cell: str, callers: int, calls: int, workers: Workers | None = None) -> Result:
    """Start the cell's owner, drive ``callers`` clients x ``calls`` calls (requests or extends) through it in
    two phases, check every answer or row and shut the owner down. ``workers`` carry a process owner's clients."""
    runner = workers if cell.startswith("process/") else InProcess()
    capacity = callers * calls * ROWS_PER_EXTEND
    owner = build_owner(component, cell, callers, capacity)
    result = Result(component, cell, callers * calls, rows=capacity if component == "replay" else 0)
    warm = max(1, int(calls * WARMUP))
    try:
        owner.start()
        pid = result.pid = owner_pid(owner)
        runner.hand([(i, owner.client()) for i in range(callers)])
        served = owner.stats()["requests"] if component == "inference" else 0
        t0 = time.perf_counter()
        first = runner.run(component, 0, warm, calls)
        result.rss_warm = rss_mib(pid)
        rest = runner.run(component, warm, calls - warm, calls)
        result.wall_s = time.perf_counter() - t0
        result.rss_end = rss_mib(pid)
        outcome = merge(component, [first, rest])
        result.errors = outcome["errors"]
        if component == "inference":
            check_answers(result, outcome, callers, calls, owner.stats()["requests"] - served)
        else:
            check_rows(result, outcome, owner.client(), capacity)
    finally:
        try:
            runner.hand([])  # the clients go before their owner
        finally:
            owner.shutdown()
    return result


def check_answers(result: Result, outcome: dict, callers: int, calls: int, served: int) -> None:
    """Classify the wrong answers: a pair already delivered (to its own request or to another) is duplicated,
    any other pair misrouted; every request without its own answer is lost."""
    wrong = outcome["wrong"]
    answered_wrongly = {(c, s) for c, s, *_ in wrong}
    stopped: dict = {}  # client -> the first request it failed at (it sent nothing more in that phase)
    for c, s in outcome["failed"]:
        stopped[c] = min(s, stopped.get(c, s))

    def answered_right(c: int, s: int) -> bool:
        return 0 <= c < callers and 0 <= s < min(calls, stopped.get(c, calls)) and (c, s) not in answered_wrongly

    seen: set = set()
    for _, _, *got in wrong:
        got = tuple(got)
        if got in seen or answered_right(*got):
            result.duplicated += 1
        else:
            result.misrouted += 1
        seen.add(got)
    result.lost = result.calls - outcome["ok"]
    result.duplicated += max(0, served - result.calls)


def check_rows(result: Result, outcome: dict, client, capacity: int) -> None:
    """Read one epoch of ``client`` (a ``without_replacement`` sampler): every acknowledged row must come back
    once, at the position its extend acknowledged."""
    ids = np.concatenate(outcome["ids"]) if outcome["ids"] else np.empty(0, np.int64)
    positions = np.concatenate(outcome["positions"]) if outcome["positions"] else np.empty(0, np.int64)
    inside = (positions >= 0) & (positions < capacity)
    at = np.full(capacity, -1, dtype=np.int64)  # the row acknowledged at each position
    at[positions[inside]] = ids[inside]
    result.duplicated = len(positions) - len(np.unique(positions))
    batch = _divisor(len(ids), 2048)
    sampled_ids, sampled_index = [], []
    for _ in range(len(ids) // batch if batch else 0):
        sample = client.sample(batch)
        sampled_ids.append(sample["id"].numpy())
        sampled_index.append(sample["index"].numpy())
    sampled = np.concatenate(sampled_ids) if sampled_ids else np.empty(0, np.int64)
    index = np.concatenate(sampled_index) if sampled_index else np.empty(0, np.int64)
    result.duplicated += len(sampled) - len(np.unique(sampled))
    result.misrouted = int((at[index] != sampled).sum()) + int((~inside).sum())
    result.lost = result.rows - len(np.intersect1d(ids, sampled))


def _divisor(total: int, most: int) -> int:
    """The largest divisor of ``total`` not above ``most`` (a batch size that reads an epoch exactly)."""
    return next((d for d in range(min(total, most), 0, -1) if total % d == 0), 0)
