"""Inference round trips per transport, beside the floors of the mechanisms under them; medians.

For every inference cell built today (placement ``thread`` with transports ``thread`` and ``direct``;
placement ``process`` with ``queue``, ``shared_memory``, ``process_slot`` and ``distributed``; placement ``ray``
over Ray calls and over ``distributed`` (layouts discovered by the first request), in a local cluster on
127.0.0.1 that the script starts and stops), for 1, 4 and 16 concurrent
clients and three payloads (16 B: observation float32 [4]; 28 KB: 84x84x4 uint8; 1 MiB: uint8), a real
`components.inference.InferenceServer` serves an echo policy (``action = observation``, so the
response carries the request's payload back) and each client does a bounded number of sequential round
trips (``submit(td).result()``; warm-up discarded). Clients of a ``process`` server live in separate worker
processes, spawned with multiprocessing ``spawn`` and handed their clients as ``Process`` arguments; clients
of a ``thread`` or ``ray`` server are threads of this process.

The floors, measured in the same run between two processes with one client:

* (a) shared memory + semaphore doorbell: the client copies the payload into a shared tensor and releases a
  semaphore; the server process waits, copies it into a response tensor and releases a response semaphore;
  the client waits and copies the response out.
* (b) ``multiprocessing.Queue`` round trip of pre-pickled bytes of the payload (request queue, response queue).
* (c) a Ray actor call whose argument is the payload tensor and whose result is that tensor.
* (d) a standalone two-rank gloo group (through a store on 127.0.0.1): the client sends the payload, the other
  process receives it and sends it back.
* (f) not a floor but (d) plus the ``distributed`` transport's framing and nothing else: the same payload as a
  TensorDict through the transport's own wire (header, layout checks, copies, one group per direction), one
  thread each side, no receiving threads, no serving loop. Its ratio is against (d): what the framing alone
  costs, before any of the service's work.

``ratio`` is a row's p50 over its floor's p50 at the same payload (the floors are single-client, so ratios of
4 and 16 clients include queueing behind the other clients): shared_memory, process_slot and the thread
transports against (a), queue against (b), ray against (c), distributed against (d). Run from the repository root:

    python benchmarks/inference.py                      # everything (a few minutes on 2 cores)
    python benchmarks/inference.py --quick              # fewer round trips
    python benchmarks/inference.py --clients 1 --sizes 16B --transports shared_memory queue

The floors (a), (b), (d) and (f) and the one-client process cells run in 5 interleaved rounds (the floors, then
each transport, again and again): this machine's wake-up latency drifts by several times within minutes (floor
(a) from about 8 us when the cores stay awake to 70 us when they doze), so each transport is compared with the
floor measured beside it. Their rows pool the rounds. The one-client ``ray/distributed`` cell likewise runs in 5
rounds alternating with floor (d), called from this process as its client is (a second floor server runs beside
the Ray cluster); its target verdict takes the median of those per-round ratios.

Targets (PASS/MISS printed at the end): at 16 B and 1 client, shared_memory and process_slot p50 at most 2x
floor (a), queue p50 at most 2x floor (b); the verdict takes the median of the per-round ratios, which are
printed too. At 28 KB and 1 MiB with 1 client, ray/distributed p50 at most 1.5x floor (d) and at least 3x the
requests/s of ray/ray.

TorchRL beside ours: ``--peer-python PATH`` names the python of a separate environment with torchrl 0.14.1 (it
needs tensordict<0.15, so it cannot share this project's). After our cells, this script runs
``PATH benchmarks/torchrl_peer.py`` on the same payloads, client counts, round-trip counts and transports (ours
mapped to TorchRL's: thread -> thread, direct -> direct, queue -> mp, shared_memory -> shared_memory,
process_slot -> process_slot, ray -> ray, which it skips) and prints its rows in the same tables, labelled
``torchrl 0.14.1 <transport>``, each against the floor of our corresponding transport; under the targets, one line
per pair compares the p50s at 16 B and 1 client. To make that environment and use it:

    python -m venv /tmp/trl && /tmp/trl/bin/pip install torch==2.13.0 torchrl==0.14.1
    python benchmarks/inference.py --quick --peer-python /tmp/trl/bin/python
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import pickle
import sys
import threading
import time
import traceback

import numpy as np
import torch
from torch import nn

from _harness import (  # first: the checkout on sys.path (benchmarks/_harness.py)
    HERE, peer_json, percentiles, round_trips, stop_child, summarize)
from _results import Results, say
from components.inference import InferenceServer, InferenceServerConfig
from transports.config import TransportConfig
from transports.segments import Segment
# The workload lives in the TorchRL peer script beside this one, which must stand alone in TorchRL's environment, and
# both sides measure with benchmarks/_harness.py: one definition, so both sides measure the same way.
from torchrl_peer import MIN_PER_CLIENT, SIZES, EchoPolicy, counts, request_td, response_td

CELLS = [("thread", "thread"), ("thread", "direct"), ("process", "queue"), ("process", "shared_memory"),
         ("process", "process_slot"), ("process", "distributed"), ("ray", "ray"), ("ray", "distributed"),
         ("monarch", "monarch")]
FLOOR_OF = {"queue": "b", "ray": "c", "distributed": "d", "monarch": "e"}  # every other one: floor (a)
FLOOR_NAMES = {"a": "floor (a) shm + semaphore", "b": "floor (b) mp.Queue bytes", "c": "floor (c) Ray actor call",
               "d": "floor (d) gloo send/recv", "e": "floor (e) Monarch endpoint call",
               "f": "(f) = (d) + our wire framing only"}
PLOT_FLOOR_NAMES = {"a": "shared-memory floor (shm copy + semaphore)", "b": "queue floor (mp.Queue of bytes)",
                    "c": "Ray floor (bare actor call)", "d": "gloo floor (send/recv pair)",
                    "e": "Monarch floor (bare endpoint call)"}
"""The floors' names in the round-trip plot's legend: what each is the floor of, and what it does."""
LOCAL_FLOORS = ("a", "b", "d", "f")  # measured between two processes in the interleaved rounds
TARGETS = [("shared_memory", "a"), ("process_slot", "a"), ("queue", "b")]
# our transport -> TorchRL's corresponding one, as benchmarks/torchrl_peer.py names it
PEER_TRANSPORT = {"thread": "thread", "direct": "direct", "queue": "mp", "shared_memory": "shared_memory",
                  "process_slot": "process_slot", "ray": "ray"}
ROUNDS = 5  # interleaved rounds of the floors and the one-client process cells
PEER_TIMEOUT = 1800  # seconds for the whole TorchRL run (all its cells take a few minutes on 2 cores)


def make_policy() -> nn.Module:
    return EchoPolicy()


# ---------------------------------------------------------------------------------------------- floors
class FloorChannel:
    """Both floors for one payload size: two shared tensors and semaphores (a), two queues of bytes (b)."""

    def __init__(self, size: str, ctx):
        nbytes = request_td(size)["observation"].numel() * request_td(size)["observation"].element_size()
        self.size, self.nbytes = size, nbytes
        self.req_seg, self.resp_seg = Segment(nbytes), Segment(nbytes)
        self.req_sem, self.resp_sem = ctx.Semaphore(0), ctx.Semaphore(0)
        self.req_q, self.resp_q = ctx.Queue(), ctx.Queue()

    def tensors(self):
        return (torch.frombuffer(self.req_seg.buf, dtype=torch.uint8, count=self.nbytes),
                torch.frombuffer(self.resp_seg.buf, dtype=torch.uint8, count=self.nbytes))

    def close(self):
        for q in (self.req_q, self.resp_q):
            q.close()
            q.cancel_join_thread()
        self.req_seg.close()
        self.resp_seg.close()


class GlooFloor:
    """Floor (d): one standalone two-rank gloo group per payload size (rank 0 echoes, rank 1 calls), through a
    store of the main process on 127.0.0.1; the payload goes there and back as one message each way."""

    def __init__(self, address: tuple[str, int]):
        self.address, self.groups = address, {}

    def group(self, size: str, rank: int):
        if size not in self.groups:
            from transports.distributed.gloo import connect_store, pair

            store = connect_store(*self.address, 60, "gloo floor")
            self.groups[size] = (store, pair(store, f"floor/{size}/", rank, self.address[0]))
        return self.groups[size][1]

    def echo(self, size: str, nbytes: int, n: int) -> None:
        pg, buf = self.group(size, 0), torch.empty(nbytes, dtype=torch.uint8)
        for _ in range(n):
            pg.recv([buf], 1, 0).wait()
            pg.send([buf], 1, 0).wait()

    def wire(self, size: str, rank: int):
        """(f): this transport's wire over a pair of groups of its own (the request layout both ways)."""
        key = ("wire", size)
        if key not in self.groups:
            from transports.distributed.framing import Wire
            from transports.distributed.gloo import connect_store, groups
            from transports.layout import Layout

            store = connect_store(*self.address, 60, "gloo floor")
            out, inp = groups(store, f"wire/{size}/", rank, self.address[0], "gloo")
            layout = Layout.from_tensordict(request_td(size))
            self.groups[key] = (store, Wire(out, inp, layout, layout, peer=1 - rank))
        return self.groups[key][1]

    def wire_echo(self, size: str, n: int) -> None:
        from transports.distributed.framing import REPLY, REQUEST

        wire = self.wire(size, 0)
        for _ in range(n):
            _, rid, td = wire.recv(frozenset({REQUEST}))
            wire.send(REPLY, rid, td)

    def wire_call(self, size: str):
        from transports.distributed.framing import REPLY, REQUEST

        wire, td, expect = self.wire(size, 1), request_td(size), frozenset({REPLY})

        def call():
            wire.send(REQUEST, 1, td)
            return wire.recv(expect)
        return call

    def call(self, size: str, nbytes: int):
        pg = self.group(size, 1)
        payload, out = torch.ones(nbytes, dtype=torch.uint8), torch.empty(nbytes, dtype=torch.uint8)

        def call():
            pg.send([payload], 0, 0).wait()
            pg.recv([out], 0, 0).wait()
        return call


def _floor_server(conn, channels: dict, gloo: GlooFloor) -> None:
    """Serve exactly the round trips the main process announces, floor by floor."""
    torch.set_num_threads(1)
    views = {size: ch.tensors() for size, ch in channels.items()}
    while True:
        msg = conn.recv()
        if msg is None:
            break
        floor, size, n = msg
        ch = channels[size]
        if floor == "d":
            gloo.echo(size, ch.nbytes, n)
        elif floor == "f":
            gloo.wire_echo(size, n)
        elif floor == "a":
            req, resp = views[size]
            for _ in range(n):
                ch.req_sem.acquire()
                resp.copy_(req)
                ch.resp_sem.release()
        else:
            for _ in range(n):
                ch.resp_q.put(ch.req_q.get())
        conn.send("done")
    del views
    for ch in channels.values():
        ch.req_seg.close()
        ch.resp_seg.close()


def start_floor_server(stack: contextlib.ExitStack, ctx, channels: dict) -> tuple:
    """The process that echoes the floors' round trips (stopped by ``stack``): ``(its pipe, the gloo floor)``."""
    from transports.distributed.gloo import open_store

    floor_store, port, _ = open_store("127.0.0.1", 0, 60)  # no relay on loopback
    stack.callback(lambda: floor_store)  # referenced until the floors are done, then released
    gloo = GlooFloor(("127.0.0.1", port))
    floor_conn, floor_child = ctx.Pipe()
    floor_proc = ctx.Process(target=_floor_server, args=(floor_child, channels, gloo), daemon=True)
    floor_proc.start()
    stack.callback(_stop_process, floor_proc, floor_conn)
    return floor_conn, gloo


def floor_call(ch: FloorChannel, floor: str, size: str, gloo: GlooFloor | None = None):
    if floor == "d":
        return gloo.call(size, ch.nbytes)
    if floor == "f":
        return gloo.wire_call(size)
    if floor == "a":
        req, resp = ch.tensors()
        payload = torch.ones(ch.nbytes, dtype=torch.uint8)
        out = torch.empty_like(payload)

        def call():
            req.copy_(payload)
            ch.req_sem.release()
            ch.resp_sem.acquire()
            out.copy_(resp)
        return call
    payload = pickle.dumps(request_td(size)["observation"], protocol=pickle.HIGHEST_PROTOCOL)

    def call():
        ch.req_q.put(payload)
        ch.resp_q.get()
    return call


# ---------------------------------------------------------------------------------------------- workers
def _worker(conn, clients: dict, channels: dict | None, gloo: GlooFloor | None = None, threads: int = 1) -> None:
    """A client process: runs the round trips the main process asks for and sends back the latencies."""
    torch.set_num_threads(threads)
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            break
        key, warmup, n = msg
        try:
            if key[0] == "floor":
                _, floor, size = key
                call = floor_call(channels[size], floor, size, gloo)
            else:
                client, td = clients[key], request_td(key[1])
                call = lambda: client.submit(td).result(30)  # noqa: E731
            conn.send(("ok", round_trips(call, warmup, n)))
            del call
        except BaseException:  # noqa: BLE001 - reported by the main process
            conn.send(("error", traceback.format_exc()))
    if channels:
        for ch in channels.values():
            ch.req_seg.close()
            ch.resp_seg.close()


def _gather(conns) -> list:
    parts = []
    for conn in conns:
        status, value = conn.recv()
        if status != "ok":
            raise RuntimeError(f"a client failed:\n{value}")
        parts.append(value)
    return parts


# ---------------------------------------------------------------------------------------------- servers
def make_server(placement: str, transport: str, size: str, max_clients: int) -> InferenceServer:
    options = {}
    if transport == "distributed" and placement == "ray":  # the Ray owner discovers them on the first request
        return InferenceServer(InferenceServerConfig(placement=placement), policy_factory=make_policy,
                               transport=transport)
    if transport in ("shared_memory", "process_slot"):
        options = {"num_slots": max_clients}
    return InferenceServer(
        InferenceServerConfig(placement=placement),
        policy_factory=make_policy,
        transport=TransportConfig(transport, options),
        request_layout=request_td(size),
        response_layout=response_td(size),
    )


def run_thread_cells(cells, sizes, client_counts, quick, results, floor=None) -> None:
    """Clients are threads of this process. With ``floor`` (``(pipe, gloo floor, channels)`` of a floor server), a
    ``distributed`` cell's one client runs in ROUNDS rounds interleaved with floor (d) called from this process too,
    so its ratio is taken against the floor measured beside it."""
    for placement, transport in cells:
        for size in sizes:
            server = make_server(placement, transport, size, max(client_counts)).start()
            try:
                for n_clients in client_counts:
                    warmup, n = counts(size, n_clients, quick)
                    if n_clients == 1 and floor is not None and transport == "distributed":
                        _rounds_beside_floor_d(f"{placement}/{transport}", server.client(), size, warmup, n, floor,
                                               results)
                        continue
                    clients = [server.client() for _ in range(n_clients)]
                    parts: list = [None] * n_clients
                    barrier = threading.Barrier(n_clients)

                    def work(i):
                        td = request_td(size)
                        barrier.wait()
                        parts[i] = round_trips(lambda: clients[i].submit(td).result(30), warmup, n)

                    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_clients)]
                    for t in threads:
                        t.start()
                    for t in threads:
                        t.join()
                    results[(f"{placement}/{transport}", size, n_clients)] = summarize(parts)
                    progress(f"{placement}/{transport}", size, n_clients, results)
            finally:
                server.shutdown()


def run_process_cells(cells, sizes, client_counts, quick, results, floors, threads: int = 1) -> None:
    ctx = mp.get_context("spawn")
    max_clients = max(client_counts)
    with contextlib.ExitStack() as stack:
        servers = {}
        for placement, transport in cells:
            for size in sizes:
                servers[(transport, size)] = make_server(placement, transport, size, max_clients)
                stack.callback(servers[(transport, size)].shutdown)
        channels = {size: FloorChannel(size, ctx) for size in sizes}
        for ch in channels.values():
            stack.callback(ch.close)
        # Start every server child at once: spawning (importing torch) dominates and overlaps well.
        errors = []

        def start(server):
            try:
                server.start()
            except BaseException as exc:  # noqa: BLE001 - raised below
                errors.append(exc)
        starters = [threading.Thread(target=start, args=(s,)) for s in servers.values()]
        floor_conn, gloo = start_floor_server(stack, ctx, channels)
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        if errors:
            raise errors[0]
        # Clients are made here, in the owner's process, and travel as Process arguments.
        conns, procs = [], []
        for i in range(max_clients if servers else 1):
            clients = {key: s.client() for key, s in servers.items()}
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child, clients, channels if i == 0 else None,
                                                     gloo if i == 0 else None, threads), daemon=True)
            proc.start()
            stack.callback(_stop_process, proc, parent)
            conns.append(parent)
            procs.append(proc)
        for conn in conns:
            assert conn.recv() == "ready"

        # The floors and the one-client cells run in ROUNDS interleaved rounds: this machine's wake-up latency
        # drifts by several times within minutes, so each transport is compared with the floor measured beside it.
        for size in sizes:
            warmup, n = per_round(*counts(size, 1, quick))
            parts: dict = {}
            for _ in range(ROUNDS):
                for floor in LOCAL_FLOORS:
                    floor_conn.send((floor, size, warmup + n))
                    conns[0].send((("floor", floor, size), warmup, n))
                    parts.setdefault(floor, []).extend(_gather(conns[:1]))
                    assert floor_conn.recv() == "done"
                for placement, transport in cells if 1 in client_counts else ():
                    conns[0].send(((transport, size), warmup, n))
                    parts.setdefault(transport, []).extend(_gather(conns[:1]))
            for floor in LOCAL_FLOORS:
                floors[(floor, size)] = _pooled(parts[floor])
                progress(FLOOR_NAMES[floor], size, 1, {(FLOOR_NAMES[floor], size, 1): floors[(floor, size)]})
            for placement, transport in cells if 1 in client_counts else ():
                key = (f"{placement}/{transport}", size, 1)
                results[key] = _pooled(parts[transport])
                floor = parts[FLOOR_OF.get(transport, "a")]
                results[key]["rounds"] = [(_p50(t), _p50(f)) for t, f in zip(parts[transport], floor)]
                progress(*key, results)
        for placement, transport in cells:
            for size in sizes:
                for n_clients in client_counts:
                    if n_clients == 1:
                        continue  # measured in the rounds above
                    warmup, n = counts(size, n_clients, quick)
                    for conn in conns[:n_clients]:
                        conn.send(((transport, size), warmup, n))
                    results[(f"{placement}/{transport}", size, n_clients)] = summarize(_gather(conns[:n_clients]))
                    progress(f"{placement}/{transport}", size, n_clients, results)


def _rounds_beside_floor_d(label: str, client, size: str, warmup: int, n: int, floor, results) -> None:
    floor_conn, gloo, channels = floor
    warmup, n = per_round(warmup, n)
    td, ours, theirs, call = request_td(size), [], [], None
    for _ in range(ROUNDS):
        floor_conn.send(("d", size, warmup + n))
        call = call or gloo.call(size, channels[size].nbytes)  # after the message: both ranks build the group
        theirs.append(round_trips(call, warmup, n))
        assert floor_conn.recv() == "done"
        ours.append(round_trips(lambda: client.submit(td).result(30), warmup, n))
    results[(label, size, 1)] = _pooled(ours)
    results[(label, size, 1)]["rounds"] = [(_p50(a), _p50(b)) for a, b in zip(ours, theirs)]
    progress(label, size, 1, results)


class _EchoActor:
    """Floor (c): one Ray actor call carrying the payload there and back, nothing else."""

    def echo(self, payload):
        return payload


def run_ray_cells(cells, sizes, client_counts, quick, results, floors) -> None:
    """Ray rows: clients are threads of this driver calling the Ray inference client; the floor is a plain
    actor call with the same payload, measured in the same cluster."""
    from components.hosts.ray import RayClusterConfig, ray_cluster
    from transports.ray import import_ray

    ray = import_ray()
    with ray_cluster(RayClusterConfig(temp_dir=f"/tmp/rb{os.getpid()}")), contextlib.ExitStack() as stack:
        channels = {size: FloorChannel(size, mp.get_context("spawn")) for size in sizes}
        for ch in channels.values():
            stack.callback(ch.close)
        floor_conn, gloo = start_floor_server(stack, mp.get_context("spawn"), channels)
        echo = ray.remote(_EchoActor).options(num_cpus=0).remote()
        for size in sizes:
            payload = request_td(size)["observation"]
            warmup, n = counts(size, 1, quick)
            floors[("c", size)] = summarize([round_trips(lambda: ray.get(echo.echo.remote(payload)), warmup, n)])
            progress(FLOOR_NAMES["c"], size, 1, {(FLOOR_NAMES["c"], size, 1): floors[("c", size)]})
        ray.kill(echo)
        run_thread_cells(cells, sizes, client_counts, quick, results, floor=(floor_conn, gloo, channels))


def run_monarch_cells(cells, sizes, client_counts, quick, results, floors) -> None:
    """Monarch rows: clients are threads of this driver calling the Monarch inference client; the floor is a bare
    endpoint call of an actor in a proc of its own with the same payload, measured in the same run."""
    from monarch.actor import Actor, endpoint, this_host

    # procs inherit the environment: they import torchrl_peer and _harness too
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, os.environ.get("PYTHONPATH")) if p)

    class EchoActor(Actor):
        @endpoint
        def echo(self, payload):
            return payload

    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        echo = procs.spawn("echo", EchoActor)
        for size in sizes:
            payload = request_td(size)["observation"]
            warmup, n = counts(size, 1, quick)
            floors[("e", size)] = summarize([round_trips(lambda: echo.echo.call_one(payload).get(), warmup, n)])
            progress(FLOOR_NAMES["e"], size, 1, {(FLOOR_NAMES["e"], size, 1): floors[("e", size)]})
    finally:
        procs.stop().get()
    run_thread_cells(cells, sizes, client_counts, quick, results)


def per_round(warmup: int, n: int) -> tuple[int, int]:
    """One interleaved round's share of a cell's (warm-up, measured) round trips."""
    return max(10, warmup // ROUNDS), max(MIN_PER_CLIENT // 2, n // ROUNDS)


def _pooled(parts: list) -> dict:
    """`summarize` of one client's sequential rounds: requests/s over the rounds' own durations."""
    return summarize(parts, sequential=True)


def _p50(part) -> float:
    """The median round trip of one round (a `round_trips` part)."""
    return percentiles(part[0], (50,))[0]


def _stop_process(proc, conn) -> None:
    stop_child(proc, lambda: conn.send(None))
    conn.close()


def progress(label, size, n_clients, results) -> None:
    r = results[(label, size, n_clients)]
    print(f"  measured {label:<26} {size:>5} x{n_clients:<3} p50 {r['p50']:9.1f} us", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- TorchRL peer
def run_peer(python: str, quick: bool, client_counts, sizes, transports) -> dict:
    """Run benchmarks/torchrl_peer.py with ``python`` (TorchRL's environment) on the same cells; its JSON.

    Its progress lines pass through to stderr. It runs in a session of its own, so that if it overruns
    PEER_TIMEOUT (or this script is interrupted) every process it started can be stopped: SIGTERM first, which
    it answers by shutting its servers and clients down, then SIGKILL."""
    command = ([python, os.path.join(HERE, "torchrl_peer.py"),
                "--clients", *map(str, client_counts), "--sizes", *sizes,
                "--transports", *[PEER_TRANSPORT[t] for t in transports if t in PEER_TRANSPORT]]
               + (["--quick"] if quick else []))
    return peer_json(command, PEER_TIMEOUT)


def peer_label(peer: dict, transport: str) -> str:
    return f"torchrl {peer['torchrl']} {transport}"


# ---------------------------------------------------------------------------------------------- report
COLUMNS = ["transport", "clients", "p50 us", "p95 us", "req/s", "floor p50 us", "ratio"]
FLOOR_NOTE = ("floor p50 us: floor (a) for the thread transports, shared_memory and process_slot; (b) for queue; (c) "
              "for ray; (d) for distributed and for (f); (e) for monarch; a floor's own row shows its own p50 there.")


def _row(label, n_clients, r, floor, f) -> list:
    """Print a table row; return it as values (the floor's p50 and the ratio as numbers, None without a floor)."""
    floor_text = f"{f['p50']:.1f} ({floor})" if f else "-"
    ratio = f"{r['p50'] / f['p50']:.2f}" if f else "-"
    print(f"| {label} | {n_clients} | {r['p50']:.1f} | {r['p95']:.1f} | {r['rate']:.0f} | {floor_text} | {ratio} |")
    return [label, n_clients, r["p50"], r["p95"], r["rate"],
            f["p50"] if f else None, r["p50"] / f["p50"] if f else None]


def report(results, floors, sizes, client_counts, cells, peer, rec: Results) -> bool:
    """The tables and the targets (printed, and recorded in ``rec``); with ``peer`` (torchrl_peer.py's JSON), TorchRL's
    rows after those of our corresponding transport, against the same floor, and a line per pair under the targets."""
    peer_rows = {(r["transport"], r["size"], r["clients"]): r for r in (peer or {}).get("results", [])}
    all_pass = True
    for size in sizes:
        print(f"\n### {size}: {SIZES[size][0]}\n")
        print(f"| {' | '.join(COLUMNS)} |")
        print("|---|---|---|---|---|---|---|")
        rows = []
        for floor in ("a", "b", "c", "d", "e", "f"):
            f = floors.get((floor, size))
            if f:
                against = "d" if floor == "f" else floor  # (f) is (d) plus the framing: it is read against (d)
                rows.append(_row(FLOOR_NAMES[floor], 1, f, against, floors.get((against, size))))
        for placement, transport in cells:
            floor = FLOOR_OF.get(transport, "a")
            f = floors.get((floor, size))
            for n_clients in client_counts:
                r = results.get((f"{placement}/{transport}", size, n_clients))
                if r is not None:
                    rows.append(_row(f"{placement}/{transport}", n_clients, r, floor, f))
            for n_clients in client_counts if transport in PEER_TRANSPORT else ():
                r = peer_rows.get((PEER_TRANSPORT[transport], size, n_clients))
                if r is not None:
                    rows.append(_row(peer_label(peer, PEER_TRANSPORT[transport]), n_clients, r, floor, f))
        rec.table(f"{size}: {SIZES[size][0]}", COLUMNS, rows, note=FLOOR_NOTE)
    print("\n### Targets (16B, 1 client: p50 at most 2x its floor's p50)\n")
    for transport, floor in TARGETS:
        r = results.get((f"process/{transport}", "16B", 1))
        f = floors.get((floor, "16B"))
        if r is None or f is None:
            say(rec.verdict, f"process/{transport} vs {FLOOR_NAMES[floor]}: not measured in this run")
            continue
        rounds = r.get("rounds") or [(r["p50"], f["p50"])]
        ratio = float(np.median([ours / theirs for ours, theirs in rounds]))
        ok = ratio <= 2.0
        all_pass &= ok
        say(rec.verdict, f"{'PASS' if ok else 'MISS'} process/{transport}: p50 {r['p50']:.1f} us vs "
             f"{FLOOR_NAMES[floor]} {f['p50']:.1f} us; median of the per-round ratios {ratio:.2f}x (rounds, p50 us "
             f"ours/floor: {', '.join(f'{a:.1f}/{b:.1f}' for a, b in rounds)}); target <= 2.00x")
    print("\n### Targets (ray/distributed, 1 client: p50 at most 1.5x floor (d); at least 3x the req/s of ray/ray)\n")
    for size in ("28KB", "1MiB"):
        ours, ray_row = results.get(("ray/distributed", size, 1)), results.get(("ray/ray", size, 1))
        f = floors.get(("d", size))
        if ours is None or f is None or ray_row is None:
            say(rec.verdict, f"ray/distributed at {size}: not measured in this run")
            continue
        rounds = ours.get("rounds")
        ratio = float(np.median([a / b for a, b in rounds])) if rounds else ours["p50"] / f["p50"]
        speedup = ours["rate"] / ray_row["rate"]
        ok = ratio <= 1.5 and speedup >= 3.0
        all_pass &= ok
        beside = (f"median of the per-round ratios to floor (d) measured beside it (rounds, p50 us ours/floor: "
                  f"{', '.join(f'{a:.1f}/{b:.1f}' for a, b in rounds)})" if rounds else f"floor (d) {f['p50']:.1f} us")
        say(rec.verdict, f"{'PASS' if ok else 'MISS'} ray/distributed at {size}: p50 {ours['p50']:.1f} us, "
             f"{ratio:.2f}x: {beside} (target <= 1.50x); {ours['rate']:.0f} req/s = {speedup:.2f}x ray/ray's "
             f"{ray_row['rate']:.0f} (target >= 3.00x)")
    if peer_rows:
        print(f"\nBeside TorchRL {peer['torchrl']} (16B, 1 client, p50):\n")
        for placement, transport in cells:
            ours = results.get((f"{placement}/{transport}", "16B", 1))
            theirs = peer_rows.get((PEER_TRANSPORT.get(transport), "16B", 1))
            if ours is not None and theirs is not None:
                label = peer_label(peer, PEER_TRANSPORT[transport])
                say(rec.note, f"{placement}/{transport} {ours['p50']:.1f} us vs {label} {theirs['p50']:.1f} us "
                     f"(TorchRL / ours {theirs['p50'] / ours['p50']:.2f}x)")
    return all_pass


def record_plots(rec: Results, sizes, client_counts) -> None:
    """From the tables ``report`` recorded (one per size, in ``sizes`` order): the p50 round trip with 1 client against
    the payload, a line per cell and a dashed one per floor; with several client counts, req/s per cell at the most
    clients (a bar per payload)."""
    rows = {(row[0], size, row[1]): row for size, table in zip(sizes, rec.tables) for row in table["rows"]}
    order = [s for s in SIZES if s in sizes]
    # (f) is neither a floor nor a cell: its row stays in the tables only
    labels = [label for label in dict.fromkeys(label for label, _, _ in rows) if label != FLOOR_NAMES["f"]]

    def series(n: int, column: int, floors: bool) -> dict:  # label -> the column's value per size at n clients
        return {label: [rows.get((label, s, n), [None] * len(COLUMNS))[column] for s in order] for label in labels
                if (label in FLOOR_NAMES.values()) == floors and any((label, s, n) in rows for s in order)}

    nbytes = [request_td(s)["observation"].numel() * request_td(s)["observation"].element_size() for s in order]
    plot_name = {name: PLOT_FLOOR_NAMES[letter] for letter, name in FLOOR_NAMES.items() if letter in PLOT_FLOOR_NAMES}
    dashed = {plot_name[label]: values for label, values in series(1, 2, floors=True).items()}
    rec.plot("round_trip", "p50 round trip with 1 client against the payload, beside the floors", x=nbytes,
             series={**series(1, 2, floors=False), **dashed}, kind="line", xlabel="payload (bytes)",
             ylabel="p50 round trip (us)", log=True, floors=list(dashed))
    if len(client_counts) > 1:
        most = max(client_counts)
        rps = series(most, 4, floors=False)
        rec.plot("requests", f"requests/s per cell with {most} clients", x=list(rps), kind="bar", xlabel="cell",
                 series={size: [per_size[i] for per_size in rps.values()] for i, size in enumerate(order)},
                 ylabel="requests/s")


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a fifth of the round trips")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--transports", nargs="+", default=[t for _, t in CELLS], choices=[t for _, t in CELLS])
    parser.add_argument("--peer-python", metavar="PATH", default=None,
                        help="python of an environment with torchrl 0.14.1: also measure TorchRL's transports")
    parser.add_argument("--client-torch-threads", type=int, default=1, metavar="N",
                        help="torch intra-op threads of the clients' processes (default 1, as the launcher's driver "
                             "and every owner run; torch's own default is one per core)")
    return parser


def main() -> None:
    args = arguments().parse_args()
    rec = Results("inference")
    torch.set_num_threads(args.client_torch_threads)

    cells = [c for c in CELLS if c[1] in args.transports]
    results: dict = {}
    floors: dict = {}
    started = time.monotonic()
    run_thread_cells([c for c in cells if c[0] == "thread"], args.sizes, args.clients, args.quick, results)
    # The floors run with the process cells (their client is worker 0), so they are measured even when only
    # thread transports are selected.
    run_process_cells([c for c in cells if c[0] == "process"], args.sizes, args.clients, args.quick, results, floors,
                      args.client_torch_threads)
    if any(c[0] == "ray" for c in cells):
        run_ray_cells([c for c in cells if c[0] == "ray"], args.sizes, args.clients, args.quick, results, floors)
    if any(c[0] == "monarch" for c in cells):
        run_monarch_cells([c for c in cells if c[0] == "monarch"], args.sizes, args.clients, args.quick, results,
                          floors)
    elapsed = time.monotonic() - started

    peer, peer_note = None, None
    if args.peer_python:
        peer_started = time.monotonic()
        try:
            peer = run_peer(args.peer_python, args.quick, args.clients, args.sizes, [t for _, t in cells])
        except Exception as exc:  # noqa: BLE001 - our tables still print; the note says why TorchRL's rows are missing
            peer_note = f"TorchRL peer ({args.peer_python}) failed, so its rows are missing: {exc!r}"
        else:
            skipped = "; ".join(f"{name}: {why}" for name, why in peer["skipped"].items()) or "none"
            peer_note = (f"TorchRL peer ({args.peer_python}): torchrl {peer['torchrl']}, tensordict "
                         f"{peer['tensordict']}, measured right after ours ({time.monotonic() - peer_started:.0f} s). "
                         f"Its rows follow our corresponding transport's and use its floor: "
                         + ", ".join(f"{PEER_TRANSPORT[t]} ~ {p}/{t}" for p, t in cells if t in PEER_TRANSPORT)
                         + f". Skipped: {skipped}.")

    say(rec.note, f"Inference round trips (median over round trips; {os.cpu_count()} CPUs; torch {torch.__version__}; "
        f"{'quick' if args.quick else 'full'} run, {elapsed:.0f} s; clients' torch threads "
        f"{args.client_torch_threads})", "# ")
    say(rec.note, "ratio = p50 / floor p50 at the same payload; floors are one client, so rows with more clients "
        "include queueing behind the others. (a): shared memory + semaphore doorbell; (b): multiprocessing.Queue of "
        "bytes; (c): a Ray actor call carrying the payload; (d): gloo send/recv between two processes; (e): a bare "
        "Monarch endpoint call carrying the payload; (f): (d) through the distributed transport's wire framing, one "
        "thread each side, no service (against (d)).", "\n")
    if peer_note:
        say(rec.note, peer_note, "\n")
    report(results, floors, args.sizes, args.clients, cells, peer, rec)
    if not args.peer_python:
        print("\nTo print TorchRL's corresponding transports beside these, add --peer-python PATH (the python of an "
              "environment with torchrl 0.14.1; see --help).")
    record_plots(rec, args.sizes, args.clients)
    rec.save()


if __name__ == "__main__":
    main()
