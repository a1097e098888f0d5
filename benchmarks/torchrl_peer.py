"""TorchRL's inference server measured the way ``benchmarks/inference.py`` measures ours; run with TorchRL's python.

TorchRL 0.14.1 needs tensordict<0.15, so it lives in its own virtual environment and this script stands alone:
it imports torch, tensordict, torchrl, numpy and the standard library, and from this project only
``benchmarks/_harness.py`` beside it (numpy and the standard library), whose measuring functions ours use too.
``benchmarks/inference.py --peer-python PATH`` runs it and prints its rows beside ours; it can also run alone:

    python -m venv /tmp/trl && /tmp/trl/bin/pip install torch==2.13.0 torchrl==0.14.1
    /tmp/trl/bin/python benchmarks/torchrl_peer.py --quick --clients 1 4 --sizes 16B

TorchRL transports and the ones of ours they correspond to:

* ``thread`` (``ThreadingTransport``, in-process server)          ~ thread/thread
* ``direct`` (``SlotTransport``, in-process server)                ~ thread/direct
* ``mp`` (``MPTransport``, multiprocessing queues, no manager)     ~ process/queue
* ``shared_memory`` (``SharedMemoryTransport``, process server)    ~ process/shared_memory
* ``process_slot`` (``ProcessSlotTransport``, process server)      ~ process/process_slot
* ``ray``: not measured (reported under ``skipped``).

``mp`` is built as ``MPTransport(ctx=spawn)``, the class's own default; TorchRL's ``transport="process"`` selector
backs the queues with a multiprocessing manager instead, which adds a hop per message. Servers keep TorchRL's
defaults (``max_batch_size=64``, ``min_batch_size=1``, ``timeout=0.01``, stats on, ``copy_result=True``).

The workload is the one of ``inference.py``: payloads 16B (float32 [4]), 28KB (uint8 [84, 84, 4]) and 1MiB
(uint8 [1048576]); an echo policy (``action = observation``; TorchRL adds ``policy_version``); each client does
sequential ``submit(td).result(30)`` round trips, warm-up discarded, with the same counts (``--quick``: a fifth).
Clients of the in-process servers are threads; clients of the process servers live in worker processes started
with ``spawn`` and handed their clients as ``Process`` arguments. Process servers run one at a time (started for
their cells, shut down after them), so an idle server never shares the CPUs with a measured one.

Prints one JSON object on stdout: ``{"torchrl": version, "tensordict": version, "results": [{"transport",
"size", "clients", "p50", "p95", "rate", "n"}, ...], "skipped": {transport: reason}}`` (latencies in microseconds,
``rate`` in requests/s).
Progress goes to stderr, and so does anything a library or a child process writes to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback

import torch
from tensordict import TensorDict
from torch import nn

from _harness import round_trips, summarize  # benchmarks/_harness.py, beside this script: as ours are measured

THREAD_TRANSPORTS = ("thread", "direct")
PROCESS_TRANSPORTS = ("mp", "shared_memory", "process_slot")
TRANSPORTS = THREAD_TRANSPORTS + PROCESS_TRANSPORTS + ("ray",)
RESULT_TIMEOUT = 30.0  # one round trip, as in inference.py
STARTUP_TIMEOUT = 180.0  # a spawned process importing torch and torchrl on a busy machine
CELL_TIMEOUT = 600.0  # all the round trips of one cell
STOP_TIMEOUT = 10.0

# ------------------------------------------------------------------------------------- shared with inference.py
# The workload of this section is the one inference.py uses too: it imports it from this file (which must stand alone
# in TorchRL's environment), so both sides measure the same thing.
# label -> (description, dtype, shape, measured round trips per cell over all clients)
SIZES = {
    "16B": ("observation float32 [4]", torch.float32, (4,), 3000),
    "28KB": ("observation uint8 [84, 84, 4] (28,224 bytes)", torch.uint8, (84, 84, 4), 1500),
    "1MiB": ("observation uint8 [1048576]", torch.uint8, (1 << 20,), 400),
}
MIN_PER_CLIENT = 40


class EchoPolicy(nn.Module):
    """The trivial policy: ``action`` is the observation itself, so the response is as big as the request."""

    def forward(self, td):
        td.set("action", td.get("observation"))
        return td


def request_td(size: str) -> TensorDict:
    _, dtype, shape, _ = SIZES[size]
    return TensorDict({"observation": torch.ones(shape, dtype=dtype)})


def response_td(size: str) -> TensorDict:
    _, dtype, shape, _ = SIZES[size]
    return TensorDict({"action": torch.zeros(shape, dtype=dtype), "policy_version": torch.zeros((), dtype=torch.long)})


def counts(size: str, clients: int, quick: bool) -> tuple[int, int]:
    """(warm-up, measured) round trips per client."""
    total = SIZES[size][3] // (5 if quick else 1)
    per_client = max(MIN_PER_CLIENT // (2 if quick else 1), total // clients)
    return max(10, per_client // 5), per_client


# ---------------------------------------------------------------------------------------------- TorchRL side
def echo_call(client, size: str):
    """The round trip a client repeats; a first call checks that the response echoes the observation."""
    td = request_td(size)
    reply = client.submit(td).result(RESULT_TIMEOUT)
    if not torch.equal(reply["action"], td["observation"]):
        raise AssertionError("the response's action is not the request's observation")
    return lambda: client.submit(td).result(RESULT_TIMEOUT)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def record(results: list, transport: str, size: str, n_clients: int, summary: dict) -> None:
    results.append({"transport": transport, "size": size, "clients": n_clients, **summary})
    log(f"  measured torchrl {transport:<18} {size:>5} x{n_clients:<3} p50 {summary['p50']:9.1f} us")


# in-process servers
def run_thread_cells(names, sizes, client_counts, quick, results, skipped) -> None:
    """A fresh in-process server per cell (``SlotTransport`` has as many slots as the cell has clients)."""
    from torchrl.modules.inference_server import InferenceServer, SlotTransport, ThreadingTransport

    for name in names:
        try:
            for size in sizes:
                for n_clients in client_counts:
                    transport = ThreadingTransport() if name == "thread" else SlotTransport(n_clients)
                    server = InferenceServer(EchoPolicy(), transport).start()
                    try:
                        parts = _thread_clients(server.clients(n_clients), size, *counts(size, n_clients, quick))
                    finally:
                        server.shutdown(timeout=STOP_TIMEOUT)
                    record(results, name, size, n_clients, summarize(parts))
        except Exception as exc:  # noqa: BLE001 - reported in the JSON, the other transports still run
            skipped[name] = f"failed: {exc!r}"
            log(traceback.format_exc())


def _thread_clients(clients, size, warmup, n) -> list:
    parts: list = [None] * len(clients)
    barrier = threading.Barrier(len(clients), timeout=RESULT_TIMEOUT)

    def work(i):
        try:
            call = echo_call(clients[i], size)
            barrier.wait()
            parts[i] = round_trips(call, warmup, n)
        except BaseException as exc:  # noqa: BLE001 - raised below
            parts[i] = exc

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(len(clients))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + CELL_TIMEOUT
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            raise TimeoutError(f"a client thread did not finish within {CELL_TIMEOUT:.0f} s")
    for part in parts:
        if isinstance(part, BaseException):
            raise part
    return parts


# process servers
def make_process_server(name: str, size: str, max_clients: int, ctx):
    from torchrl.modules.inference_server import (
        InferenceServer, MPTransport, ProcessSlotTransport, SharedMemoryTransport)

    if name == "mp":
        transport = MPTransport(ctx=ctx)
    elif name == "shared_memory":
        transport = SharedMemoryTransport(request_td(size), response_td(size), num_slots=max_clients, ctx=ctx)
    else:
        transport = ProcessSlotTransport(request_td(size), response_td(size), num_slots=max_clients, ctx=ctx)
    return InferenceServer(
        policy_factory=EchoPolicy,
        transport=transport,
        service_backend="process",
        service_backend_options={"mp_context": ctx, "startup_timeout": STARTUP_TIMEOUT},
    )


def _worker(conn, clients: dict) -> None:
    """A client process: runs the round trips the main process asks for and sends back the latencies.

    Exits when asked (``None``) or when the main process is gone (the pipe reads end of file)."""
    torch.set_num_threads(1)
    conn.send("ready")
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        key, warmup, n = msg
        try:
            conn.send(("ok", round_trips(echo_call(clients[key], key[1]), warmup, n)))
        except BaseException:  # noqa: BLE001 - reported by the main process
            conn.send(("error", traceback.format_exc()))


def _receive(conn, deadline: float):
    if not conn.poll(max(0.0, deadline - time.monotonic())):
        raise TimeoutError("a client process did not answer in time")
    return conn.recv()


def _gather(conns, deadline: float) -> list:
    """One answer from every connection (all are read, so the next cell starts in step), then any error."""
    answers = [_receive(conn, deadline) for conn in conns]
    for status, value in answers:
        if status != "ok":
            raise RuntimeError(f"a client failed:\n{value}")
    return [value for _, value in answers]


def _stop_worker(proc, conn) -> None:
    with contextlib.suppress(OSError, ValueError):
        conn.send(None)
    proc.join(STOP_TIMEOUT)
    if proc.is_alive():
        proc.terminate()
        proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join(5)
    conn.close()


def _close_server(server) -> None:
    server.shutdown(timeout=STOP_TIMEOUT)
    close = getattr(server.transport, "close", None)
    if close is not None:
        close()


def run_process_cells(names, sizes, client_counts, quick, results, skipped) -> None:
    """Every server and its clients are made first (queue transports route replies only to clients that exist
    when the server process starts), the workers get their clients, then each server serves its cells alone."""
    ctx = mp.get_context("spawn")
    max_clients = max(client_counts)
    with contextlib.ExitStack() as stack:
        servers = {}
        for name in names:
            for size in sizes:
                servers[(name, size)] = make_process_server(name, size, max_clients, ctx)
                stack.callback(_close_server, servers[(name, size)])
        clients = {key: server.clients(max_clients) for key, server in servers.items()}
        conns = []
        for i in range(max_clients):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child, {key: c[i] for key, c in clients.items()}), daemon=True)
            proc.start()
            stack.callback(_stop_worker, proc, parent)
            child.close()
            conns.append(parent)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        for conn in conns:
            if _receive(conn, deadline) != "ready":
                raise RuntimeError("a client process did not start")
        log(f"  {len(conns)} client processes ready")
        for name in names:
            try:
                for size in sizes:
                    server = servers[(name, size)].start()
                    try:
                        for n_clients in client_counts:
                            warmup, n = counts(size, n_clients, quick)
                            for conn in conns[:n_clients]:
                                conn.send(((name, size), warmup, n))
                            parts = _gather(conns[:n_clients], time.monotonic() + CELL_TIMEOUT)
                            record(results, name, size, n_clients, summarize(parts))
                    finally:
                        server.shutdown(timeout=STOP_TIMEOUT)
            except TimeoutError:
                raise  # the workers are out of step: nothing after this can be trusted
            except Exception as exc:  # noqa: BLE001 - reported in the JSON, the other transports still run
                skipped[name] = f"failed: {exc!r}"
                log(traceback.format_exc())


# ---------------------------------------------------------------------------------------------- main
def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds the ExitStacks above: servers and workers are stopped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a fifth of the round trips")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=list(TRANSPORTS),
                        help="TorchRL transports to measure (default: all)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # stdout carries the JSON alone: whatever else writes to file descriptor 1 (this process, a library, a child
    # process inheriting it) goes to stderr.
    json_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    torch.set_num_threads(1)

    import tensordict
    import torchrl

    results: list = []
    skipped: dict = {}
    if "ray" in args.transports:
        skipped["ray"] = ("ray is not installed in this environment" if importlib.util.find_spec("ray") is None
                          else "not measured: it needs a Ray cluster, which this script does not start")
    log(f"torchrl {torchrl.__version__}, tensordict {tensordict.__version__}, torch {torch.__version__}")
    started = time.monotonic()
    run_thread_cells([t for t in THREAD_TRANSPORTS if t in args.transports], args.sizes, args.clients, args.quick,
                     results, skipped)
    process_names = [t for t in PROCESS_TRANSPORTS if t in args.transports]
    if process_names:
        run_process_cells(process_names, args.sizes, args.clients, args.quick, results, skipped)
    log(f"torchrl peer done in {time.monotonic() - started:.0f} s")
    json.dump({"torchrl": torchrl.__version__, "tensordict": tensordict.__version__, "results": results,
               "skipped": skipped}, json_out)
    json_out.write("\n")
    json_out.close()


if __name__ == "__main__":
    main()
