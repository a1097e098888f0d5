"""The processes of ``benchmarks/hosts.py``, each started inside one host (a network namespace) and driven by JSON
lines: one command a line on stdin, one answer a line on stdout (its logs go to stderr).

    python benchmarks/hosts_peer.py serve HOST     a ``distributed`` endpoint's owner listening on HOST, with a
                                                   serving loop answering each 28 KB request with an int64
    python benchmarks/hosts_peer.py floor HOST     rank 0 of the floors, through a TCPStore bound to HOST: a bare
                                                   gloo pair, and (HOST not loopback) the transport's wire alone
    python benchmarks/hosts_peer.py call HOST      the caller, on HOST: endpoints of the served ``distributed``
                                                   transport, and rank 1 of the floors

Each prints one ready line first (``serve``: the endpoint's address and its store's loopback port; ``floor``: its
store's port; ``call``: its pid). Commands, as ``{"op": ...}``:

* every peer: ``stats`` (threads, descriptors, memory and CPU seconds of this process; ``serve`` adds its connected
  endpoints and the counters of its store's connections), ``cpu`` (CPU seconds: the process's, and its Python
  threads'), ``quit`` (ends it, answering ``{"bye": true}``);
* ``call``: ``address`` (the endpoint to call), ``floor`` (joins a floor's pairs: ``name``, ``host``, ``port``,
  ``wire``), ``connect`` (one new endpoint: the seconds until its first request was sent, and until it was
  answered), ``open`` (``n`` more endpoints one after another, each making one call, kept open), ``burst`` (``n``
  more at once, from as many threads), ``rt`` (``to``: ``distributed``, ``wire`` or a floor's name; ``warmup`` and
  ``n`` sequential round trips: their latencies in us and this process's CPU seconds meanwhile).

The sizes are one collector's: a 4x84x84 uint8 frame stack (28,224 B) asked, an int64 action answered. The
``distributed`` wire adds a 32-byte header to each message, so the bare pair sends 28,256 B and answers 40 B.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import os
import re
import resource
import socket
import subprocess
import sys
import threading
import time

from _harness import round_trips  # first: the checkout on sys.path (benchmarks/_harness.py, beside this script)
import torch
from tensordict import TensorDict

from transports.distributed import DistributedTransport, framing
from transports.distributed.gloo import groups
from transports.distributed.transport import CALL, Address, DistributedClient
from transports.layout import Layout

REQUEST = TensorDict({"obs": torch.zeros(4, 84, 84, dtype=torch.uint8)})  # one Atari frame stack: 28,224 B
RESPONSE = TensorDict({"action": torch.zeros((), dtype=torch.int64)})
FLOOR_ASK = 4 * 84 * 84 + framing.HEADER.size  # what the wire sends: its header, then the payload
FLOOR_ANSWER = 8 + framing.HEADER.size
POLL_S = 0.05  # the inference server's serving-loop poll (components/inference/core.py)
CONNECT_S = 60.0
STATS_SETTLE_S = 30.0


# ---------------------------------------------------------------------------------------------- what a process holds
def process_stats() -> dict:
    """This process's threads (all, and Python's by name with digits dropped), descriptors (all, and sockets),
    resident memory (RSS and PSS, KiB) and CPU seconds (user + system, every thread)."""
    python_threads: dict[str, int] = {}
    for thread in threading.enumerate():
        kind = re.sub(r"\d+", "", thread.name)
        python_threads[kind] = python_threads.get(kind, 0) + 1
    fds = os.listdir("/proc/self/fd")
    sockets = 0
    for fd in fds:
        try:
            sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:  # the listing's own descriptor, closed by now
            pass
    memory = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name in ("Rss", "Pss"):
                memory[name.lower() + "_kib"] = int(rest.split()[0])
    native: dict[str, int] = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name != "python":
            native[name] = native.get(name, 0) + 1
    return {"threads": len(os.listdir("/proc/self/task")), "python_threads": python_threads, "native_threads": native,
            "fds": len(fds), "sockets": sockets, **memory, "cpu_s": cpu_seconds()}


def cpu_seconds() -> float:
    """This process's CPU seconds so far: user + system, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


TICK = os.sysconf("SC_CLK_TCK")


def python_cpu_seconds() -> float:
    """CPU seconds so far of this process's threads that run Python (named ``python`` by the kernel: the
    interpreter's threads, which take turns holding the GIL; gloo's and the store's native threads have names of
    their own). In clock ticks (10 ms): read it over many round trips."""
    total = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                if f.read().strip() != "python":
                    continue
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICK


def store_counters(port: int) -> dict:
    """The connections established to the TCPStore listening on ``127.0.0.1:port`` of this host, and what they
    carried so far (``ss -ti``: segments holding data, bytes, each way, summed over the open ones)."""
    out = subprocess.run(["ss", "-Htin", "state", "established", f"( sport = :{port} )"], capture_output=True,
                         text=True, timeout=30).stdout
    totals = {"connections": 0, "data_segs_in": 0, "data_segs_out": 0, "bytes_received": 0, "bytes_acked": 0}
    for block in re.split(r"\n(?=\S)", out.strip()):
        if not block:
            continue
        totals["connections"] += 1
        for name in ("data_segs_in", "data_segs_out", "bytes_received", "bytes_acked"):
            found = re.search(rf"\b{name}:(\d+)", block)
            totals[name] += int(found.group(1)) if found else 0
    return totals


# ---------------------------------------------------------------------------------------------- the peers
def serve(host: str) -> None:
    """A ``distributed`` endpoint's owner on ``host`` and its serving loop, as an inference server runs it: batches
    of up to 16 requests, each answered with its frame's first byte as the action."""
    transport = DistributedTransport(REQUEST, RESPONSE, host=host, name="bench", connect_timeout=CONNECT_S)
    endpoint = transport.server()
    transport.mark_serving(os.getpid())
    # the store's own port, behind the relay (only the benchmark reads it, to count what reaches the store)
    store_port = transport._relay.target if transport._relay is not None else transport.address.port  # noqa: SLF001
    stop, answered = threading.Event(), [0]

    def loop() -> None:
        while not stop.is_set():
            batch = endpoint.collect(16, 1, 0.0, POLL_S)
            if batch is None:
                continue
            endpoint.reply(batch, [TensorDict({"action": td["obs"][0, 0, 0].to(torch.int64)})
                                   for td in batch.requests])
            answered[0] += len(batch.requests)

    serving = threading.Thread(target=loop, name="serving", daemon=True)
    serving.start()
    say({"address": dataclasses.asdict(transport.address), "store_port": store_port, "pid": os.getpid()})

    def stats(_: dict) -> dict:
        deadline = time.monotonic() + STATS_SETTLE_S  # endpoints still building their groups settle first
        while time.monotonic() < deadline and any(
                c.wire is None or (c.connecting is not None and c.connecting.is_alive())
                for c in list(endpoint.channels.values())):
            time.sleep(0.01)
        return {**process_stats(), "endpoints": len(endpoint.channels), "answered": answered[0],
                "store": store_counters(store_port)}

    commands({"stats": stats})
    stop.set()
    serving.join(5)
    endpoint.close()
    transport.close()


def floor(host: str) -> None:
    """Rank 0 of the floor pairs on ``host``, through one TCPStore bound there (a socket bound by us and handed to it,
    as the transport does: torch's own listens on every address): the bare gloo pair (its device bound to ``host``,
    one worker thread) receives a request and sends the reply; the ``distributed`` wire alone, on a pair of groups of
    its own, does the same with the transport's framing. Each answers until a request says stop."""
    from torch.distributed import PrefixStore, TCPStore

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(16)
    port = sock.getsockname()[1]
    store = TCPStore(host, port, None, True, timeout=datetime.timedelta(seconds=CONNECT_S), wait_for_workers=False,
                     master_listen_fd=sock.detach(), use_libuv=True)
    say({"port": port, "pid": os.getpid()})
    done = {"bare": threading.Event(), "wire": threading.Event()}

    def bare() -> None:
        pg = gloo_pair(PrefixStore("floor/", store), 0, host)
        ask, answer = torch.zeros(FLOOR_ASK, dtype=torch.uint8), torch.zeros(FLOOR_ANSWER, dtype=torch.uint8)
        while True:
            pg.recv([ask], 1, 0).wait()
            if ask[0]:  # the caller's last message: stop
                break
            pg.send([answer], 1, 0).wait()
        done["bare"].set()

    def wire() -> None:  # a store connection of its own: a store client is one operation at a time, and a wait
        # for the peer's key holds it (the other pair's rendezvous would wait behind it)
        wire = wire_pair(TCPStore(host, port, None, False, timeout=datetime.timedelta(seconds=CONNECT_S)), 0, host)
        while True:
            kind, rid, td = wire.recv(frozenset({framing.REQUEST, framing.BYE}))
            if kind == framing.BYE:
                break
            wire.send(framing.REPLY, rid, TensorDict({"action": td["obs"][0, 0, 0].to(torch.int64)}))
        done["wire"].set()

    threads = [threading.Thread(target=bare, name="bare", daemon=True)]
    if host != "127.0.0.1":
        threads.append(threading.Thread(target=wire, name="wire", daemon=True))
    for thread in threads:
        thread.start()
    commands({})
    for thread in threads:
        thread.join(10)  # the caller sent its stops before this quit; a pair never joined is left to os._exit
    os._exit(0 if all(done[t.name].is_set() for t in threads) else 1)  # no finalization inside gloo


def wire_pair(store, rank: int, host: str) -> "framing.Wire":
    """The ``distributed`` transport's wire on a pair of groups of its own (one per direction, as an endpoint's),
    through ``store``: rank 0 answers, rank 1 asks."""
    from torch.distributed import PrefixStore

    out, inp = groups(PrefixStore("wire/", store), "", rank, host, "gloo")
    ask, answer = Layout.from_tensordict(REQUEST), Layout.from_tensordict(RESPONSE)
    return framing.Wire(out, inp, answer if rank == 0 else ask, ask if rank == 0 else answer, peer=1 - rank)


def gloo_pair(store, rank: int, host: str):
    """A standalone two-rank ProcessGroupGloo through ``store``, its device bound to ``host``, one worker thread."""
    from torch.distributed import ProcessGroupGloo

    options = ProcessGroupGloo._Options()
    options._devices = [ProcessGroupGloo.create_device(hostname=host)]
    options._timeout = datetime.timedelta(seconds=CONNECT_S)
    options._threads = 1
    return ProcessGroupGloo(store, rank, 2, options)


def call(host: str) -> None:
    """The caller on ``host``: ``distributed`` endpoints and rank 1 of each floor pair."""
    from torch.distributed import PrefixStore, TCPStore

    state: dict = {"address": None, "endpoints": [], "floors": {}, "wires": {}}
    td = REQUEST.clone()
    frame = td["obs"]

    def address(cmd: dict) -> dict:
        state["address"] = Address(**cmd["address"])
        return {"ok": True}

    def new_endpoint() -> tuple[DistributedClient, float, float]:
        client = DistributedClient(state["address"]).bind(CALL, REQUEST, RESPONSE)
        frame[0, 0, 0] = 7
        started = time.perf_counter()
        future = client.submit(td)  # connects first: store through the relay, then both groups
        connected = time.perf_counter() - started
        assert int(future.result(CONNECT_S)["action"]) == 7, "a wrong answer"
        state["endpoints"].append(client)
        return client, connected, time.perf_counter() - started

    def connect(_: dict) -> dict:
        _, connected, first = new_endpoint()
        return {"connect_s": connected, "first_call_s": first}

    def open_more(cmd: dict) -> dict:
        times = [new_endpoint()[1] for _ in range(cmd["n"])]
        return {"connect_s": times, "endpoints": len(state["endpoints"])}

    def burst(cmd: dict) -> dict:
        """``n`` more endpoints connecting at once, from as many threads (collectors starting together)."""
        times: list = []
        started = time.perf_counter()
        threads = [threading.Thread(target=lambda: times.append(new_endpoint()[1]), name=f"burst{i}")
                   for i in range(cmd["n"])]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(CONNECT_S * 2)
        return {"wall_s": time.perf_counter() - started, "connect_s": times, "endpoints": len(state["endpoints"])}

    def join_floor(cmd: dict) -> dict:
        started = time.perf_counter()
        store = TCPStore(cmd["host"], cmd["port"], None, False, timeout=datetime.timedelta(seconds=CONNECT_S))
        pg = gloo_pair(PrefixStore("floor/", store), 1, "127.0.0.1" if cmd["host"] == "127.0.0.1" else host)
        ask, answer = torch.zeros(FLOOR_ASK, dtype=torch.uint8), torch.zeros(FLOOR_ANSWER, dtype=torch.uint8)
        pg.send([ask], 0, 0).wait()  # the first round trip makes the pair's connection
        pg.recv([answer], 0, 0).wait()
        state["floors"][cmd["name"]] = (store, pg, ask, answer)
        connected = time.perf_counter() - started
        if cmd.get("wire"):
            other = TCPStore(cmd["host"], cmd["port"], None, False, timeout=datetime.timedelta(seconds=CONNECT_S))
            state["wires"][cmd["name"]] = (other, wire_pair(other, 1, host))
        return {"connect_s": connected}

    def measure(cmd: dict) -> dict:
        if cmd["to"] == "distributed":
            client = state["endpoints"][-1]

            def once(i: int) -> None:
                frame[0, 0, 0] = i % 200
                answer = client.submit(td).result(CONNECT_S)
                if int(answer["action"]) != i % 200:
                    raise AssertionError(f"a wrong answer: {int(answer['action'])} for {i % 200}")
        elif cmd["to"] == "wire":
            _, wire = state["wires"]["veth"]
            expect = frozenset({framing.REPLY})

            def once(i: int) -> None:
                frame[0, 0, 0] = i % 200
                wire.send(framing.REQUEST, i + 1, td)
                _, rid, answer = wire.recv(expect)
                if rid != i + 1 or int(answer["action"]) != i % 200:
                    raise AssertionError(f"a wrong answer: {rid}, {int(answer['action'])} for {i + 1}, {i % 200}")
        else:
            _, pg, ask, answer = state["floors"][cmd["to"]]

            def once(i: int) -> None:
                pg.send([ask], 0, 0).wait()
                pg.recv([answer], 0, 0).wait()
        calls = itertools.count()
        cpu = cpu_seconds()
        lat, _, _ = round_trips(lambda: once(next(calls)), cmd["warmup"], cmd["n"])
        return {"rt_us": lat.tolist(), "cpu_s": cpu_seconds() - cpu, "calls": cmd["warmup"] + cmd["n"]}

    say({"pid": os.getpid()})
    commands({"address": address, "connect": connect, "open": open_more, "burst": burst, "floor": join_floor,
              "rt": measure})
    for _, pg, ask, _ in state["floors"].values():  # the floors' ranks 0 stop
        ask[0] = 1
        pg.send([ask], 0, 0).wait()
    for _, wire in state["wires"].values():
        wire.send(framing.BYE, 0)  # a control message: returns once it left


# ---------------------------------------------------------------------------------------------- the command loop
def say(answer: dict) -> None:
    print(json.dumps(answer), flush=True)


def commands(handlers: dict) -> None:
    """Answer commands from stdin until ``quit`` or the end of stdin; ``stats`` is every peer's."""
    handlers = {"stats": lambda _: process_stats(),
                "cpu": lambda _: {"cpu_s": cpu_seconds(), "python_s": python_cpu_seconds()}, **handlers}
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        try:
            say(handlers[cmd["op"]](cmd))
        except Exception as exc:  # noqa: BLE001 - the driver prints it and stops
            say({"error": f"{type(exc).__name__}: {exc}"})
    say({"bye": True})


if __name__ == "__main__":
    torch.set_num_threads(1)  # as the launcher's owners run
    role, where = sys.argv[1:3]
    {"serve": serve, "floor": floor, "call": call}[role](where)
