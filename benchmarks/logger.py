"""Acknowledged ``log_scalar`` latency per logger placement, beside the floors under it; medians.

For every logger backend built today (`components.logger.CSVLogger`, and
`components.logger.TensorBoardLogger` when ``torch.utils.tensorboard`` imports) and every placement
(``direct``, ``thread``, ``process`` with its ``queue`` transport), a real logger writing into a temporary
directory is started and ``owner.client().log_scalar("train/loss", value, step)`` is called repeatedly; each
call returns once the row is written (p50, p95, calls/s). All owners of one logger run at once and are
measured in alternating blocks, so every row sees the same load on a shared machine.

The floors, measured in the same run and interleaved the same way:

* ``floor: csv row``: a direct Python call, ``csv.writer(open file).writerow([tag, step, value, wall_time])``
  (flushed every 100 rows, as CSVLogger does);
* ``floor: Pipe round trip``: a ``multiprocessing`` Pipe between this process and a child (started with the
  same multiprocessing context the owners use): send a small tuple ``("log_scalar", (tag, value, step), {})``
  (pickled by ``Connection.send``), the child receives it and sends back ``True``.

For the process rows the run also times the mechanism the process logger uses (an ``mp.Queue`` request
answered over a Pipe, with an echo child) and prints a cProfile of the caller's side, so a miss says where
the time goes. Run from the repository root:

    python benchmarks/logger.py                     # everything (well under a minute on 2 cores)
    python benchmarks/logger.py --quick             # a fifth of the calls
    python benchmarks/logger.py --loggers csv --placements process

Every owner and helper process is stopped before the script exits (also on error or Ctrl-C) and the
temporary directory is removed; the last line says whether any ``rlsvc_*`` shared-memory segment of this
run's processes is left in ``/dev/shm``.

The peer, measured in the same run with ``--peer-python PATH`` (the python of an environment with torchrl 0.14.1;
``--peer-path DIR`` adds a ``pip install --target`` directory to import torchrl from): TorchRL's
``ProcessLogger(CSVLogger)``, whose client's ``log_scalar`` also waits for the child to have written the row
(``benchmarks/torchrl_logger_peer.py``). It runs in its own interpreter after our rows, not interleaved with them,
for as many calls (at most ``BUDGET_S`` seconds); its row is ``peer: TorchRL <version> ProcessLogger(CSVLogger)``.

    python benchmarks/logger.py --quick --peer-python .venv/bin/python --peer-path /tmp/trl_pkgs

Target (PASS/MISS printed at the end): a process-placed logger's acknowledged ``log_scalar`` at most 0.3 ms
p50; each verdict also gives its ratio to the TorchRL peer's p50 where the peer was measured in the run.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import csv
import importlib
import io
import os
import pickle
import pstats
import shutil
import sys
import tempfile
import time

import numpy as np
import torch

from _harness import (  # first: the checkout on sys.path (benchmarks/_harness.py)
    interleaved, latency, peer_json, start_owner, stop_child)
from _results import Results, say, with_floors
from components.logger import CSVLogger, Logger, LoggerConfig
from components.hosts.process import context as mp_context
from transports.segments import segments_of

PLACEMENTS = ["direct", "thread", "process"]
CALLS = 5000  # measured log_scalar calls per row in a full run
TARGET_US = 300.0
BUDGET_S = 15.0  # most seconds one row's measured calls may take
TAG = "train/loss"
PEER_PREFIX = "peer: "
PEER_TIMEOUT = 180.0  # the peer's start (a multiprocessing manager and a spawned child), its calls and its stop


def torchrl_peer(python: str, path: str | None, n: int) -> tuple[str, dict]:
    """TorchRL's `ProcessLogger(CSVLogger)` measured by `benchmarks/torchrl_logger_peer.py` with ``python``: its row
    label and its `latency` cell."""
    # a `pip install --target` directory goes first on the peer's path (PYTHONPATH precedes site-packages)
    command = [*(["env", f"PYTHONPATH={path}"] if path else []), python,
               os.path.join(os.path.dirname(os.path.abspath(__file__)), "torchrl_logger_peer.py"),
               "--calls", str(n), "--budget", str(BUDGET_S)]
    peer = peer_json(command, PEER_TIMEOUT)
    return (f"{PEER_PREFIX}TorchRL {peer['torchrl']} {peer['logger']}",
            {key: peer[key] for key in ("p50", "p95", "rate", "n", "block_p50")})


def tensorboard_logger():
    """TensorBoardLogger if its SDK imports, else None."""
    try:
        importlib.import_module("torch.utils.tensorboard")
        from components.logger import TensorBoardLogger
    except Exception:  # noqa: BLE001 - an optional extra
        return None
    return TensorBoardLogger


# ---------------------------------------------------------------------------------------------- floors
def _pipe_echo(conn) -> None:
    """Child of the Pipe floor: answer every message with True until None arrives."""
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        conn.send(True)


def _queue_echo(requests, conn) -> None:
    """Child of the queue-mechanism probe: a request from an mp.Queue, a pickled answer over a Pipe."""
    while True:
        item = requests.get()
        if item is None:
            return
        conn.send_bytes(pickle.dumps((item[1], 0, None), protocol=pickle.HIGHEST_PROTOCOL))


def pipe_floor(ctx, stack: contextlib.ExitStack, pids: set):
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_pipe_echo, args=(child,), name="bench-pipe-echo", daemon=True)
    proc.start()
    child.close()
    pids.add(proc.pid)
    stack.callback(parent.close)
    stack.callback(stop_child, proc, lambda: parent.send(None))

    def call(i):
        parent.send(("log_scalar", (TAG, 0.5, i), {}))
        parent.recv()
    return call


def queue_mechanism(ctx, stack: contextlib.ExitStack, pids: set):
    """What the process logger's transport does per call, without the logger: an mp.Queue request carrying
    pre-pickled bytes, a pickled answer back over a one-way Pipe."""
    requests = ctx.Queue()
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_queue_echo, args=(requests, writer), name="bench-queue-echo", daemon=True)
    proc.start()
    writer.close()
    pids.add(proc.pid)

    def close():
        requests.close()
        requests.cancel_join_thread()
        reader.close()
    stack.callback(close)
    stack.callback(stop_child, proc, lambda: requests.put(None))

    def call(i):
        payload = pickle.dumps((False, ("log_scalar", (TAG, 0.5, i), {})), protocol=pickle.HIGHEST_PROTOCOL)
        requests.put((0, i, time.monotonic(), payload))
        pickle.loads(reader.recv_bytes())
    return call


def csv_floor(directory: str, stack: contextlib.ExitStack):
    f = open(os.path.join(directory, "floor.csv"), "a", newline="")
    stack.callback(f.close)
    writer = csv.writer(f)

    def call(i):
        writer.writerow([TAG, i, repr(0.5), f"{time.time():.3f}"])
        if i % 100 == 0:
            f.flush()
    return call


# ---------------------------------------------------------------------------------------------- loggers
def run_logger(name: str, cls, placements, directory: str, n: int, ctx, pids: set, results: dict,
               profiles: dict, floors: bool) -> None:
    with contextlib.ExitStack() as stack:
        rows = {}
        if floors:  # the floors run beside the first logger's rows
            rows["floor: csv row (direct Python call)"] = csv_floor(directory, stack)
            rows["floor: Pipe round trip (2 processes)"] = pipe_floor(ctx, stack, pids)
        clients = {}
        for placement in placements:
            owner = Logger(LoggerConfig(placement=placement),
                           backend=cls(os.path.join(directory, f"{name}-{placement}")))
            stack.callback(owner.shutdown)
            took = start_owner(owner, pids)
            client = owner.client()
            clients[placement] = client
            rows[f"{name} / {placement}"] = (lambda i, c=client: c.log_scalar(TAG, 0.5, i))
            print(f"  started {name}/{placement} in {took:.1f} s", file=sys.stderr, flush=True)
        measured = interleaved(rows, max(20, n // 20), n, budget=BUDGET_S, numbered=True)
        for row, (lat, wall) in measured.items():
            results[row] = latency(lat, wall)
            print(f"  measured {row:<40} p50 {results[row]['p50']:8.1f} us", file=sys.stderr, flush=True)
        if "process" in clients:
            profiles[name] = profile_process(name, clients["process"], ctx, stack, pids, n)


def profile_process(name: str, client, ctx, stack, pids: set, n: int) -> dict:
    """Pieces of one process log_scalar, interleaved with the call itself, and a cProfile of the caller."""
    from components.logger.backend import as_float
    from transports.queue.wire import to_wire

    pieces = {
        "mp.Queue request + Pipe reply, echo child (the transport's mechanism)": queue_mechanism(ctx, stack, pids),
        "client: as_float + to_wire + pickle.dumps of the command":
            lambda i: pickle.dumps(to_wire(("log_scalar", (TAG, as_float(TAG, 0.5), i), {})),
                                   protocol=pickle.HIGHEST_PROTOCOL),
        "client: PeerStatus.problem() (os.kill probe) per submit": lambda i: client._endpoint.status.problem(),
        "TOTAL": lambda i: client.log_scalar(TAG, 0.5, i),
    }
    measured = interleaved(pieces, 20, max(200, n // 5), budget=5.0, numbered=True)
    prof = cProfile.Profile()
    prof.enable()
    for i in range(min(1000, n // 5)):
        client.log_scalar(TAG, 0.5, i)
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out).sort_stats("tottime")
    stats.print_stats(10)
    text = out.getvalue()
    body = text[text.index("   ncalls"):] if "   ncalls" in text else text
    calls_line = next((ln.strip() for ln in text.splitlines() if "function calls" in ln), "")
    return {"pieces": [(k, float(np.median(lat))) for k, (lat, _) in measured.items()], "cprofile": body.rstrip(),
            "cprofile_head": calls_line, "cprofile_n": min(1000, n // 5), "cprofile_rows": profile_rows(stats, 10)}


def profile_rows(stats: pstats.Stats, n: int) -> list:
    """The first ``n`` lines ``stats.print_stats(n)`` prints, as values: ncalls (``total/primitive`` where they
    differ, as printed), then its times in microseconds (printed in seconds, 3 decimals: mostly 0.000)."""
    rows = []
    for func in stats.fcn_list[:n]:
        primitive, total, own, cumulative, _ = stats.stats[func]
        rows.append([total if total == primitive else f"{total}/{primitive}", own * 1e6,
                     own * 1e6 / total if total else None, cumulative * 1e6,
                     cumulative * 1e6 / primitive if primitive else None, pstats.func_std_string(func)])
    return rows


# ---------------------------------------------------------------------------------------------- report
COLUMNS = ["row", "p50 us", "p95 us", "calls/s", "p50 / Pipe floor"]
PROFILE_COLUMNS = ["ncalls", "tottime us", "percall us", "cumtime us", "percall us", "filename:lineno(function)"]


def report(results: dict, profiles: dict, rec: Results) -> None:
    """The tables (the cProfile listings as tables too) and the target, printed and recorded in ``rec``."""
    print(f"\n| {' | '.join(COLUMNS)} |")
    print("|---|---|---|---|---|")
    pipe = results.get("floor: Pipe round trip (2 processes)")
    for row, r in results.items():
        ratio = f"{r['p50'] / pipe['p50']:.2f}" if pipe else "-"
        print(f"| {row} | {r['p50']:.1f} | {r['p95']:.1f} | {r['rate']:,.0f} | {ratio} |")
    rec.table("Acknowledged log_scalar per row", COLUMNS, [
        [row, r["p50"], r["p95"], r["rate"], r["p50"] / pipe["p50"] if pipe else None] for row, r in results.items()])
    for name, prof in profiles.items():
        title = (f"Where a process {name} log_scalar's time goes (pieces timed separately, interleaved with the call "
                 "itself)")
        print(f"\n### {title}\n")
        print("| piece | p50 us |")
        print("|---|---|")
        total = dict(prof["pieces"])["TOTAL"]
        for piece, value in prof["pieces"]:
            if piece != "TOTAL":
                print(f"| {piece} | {value:.1f} |")
        print(f"| **process log_scalar in this window** | **{total:.1f}** |")
        rec.table(title, ["piece", "p50 us"], [[piece, value] for piece, value in prof["pieces"] if piece != "TOTAL"]
                  + [["**process log_scalar in this window**", total]])
        title = (f"cProfile of {prof['cprofile_n']} process {name} log_scalar calls, caller's side (top 10 by own "
                 f"time; {prof['cprofile_head']})")
        print(f"\n{title}:\n")
        print("```")
        print(prof["cprofile"])
        print("```")
        rec.table(title, PROFILE_COLUMNS, prof["cprofile_rows"])
    print(f"\n### Target (process logger: acknowledged log_scalar p50 at most {TARGET_US / 1000:.1f} ms)\n")
    rows = [row for row in results if row.endswith("/ process")]
    peer = next((row for row in results if row.startswith(PEER_PREFIX)), None)
    if not rows:
        say(rec.verdict, "no process logger measured in this run")
    for row in rows:
        p50 = results[row]["p50"]
        beside = (f"{results[peer]['p50'] / p50:.1f}x faster than {peer[len(PEER_PREFIX):]}'s "
                  f"{results[peer]['p50'] / 1000:.3f} ms, measured in this run" if peer else
                  "TorchRL's ProcessLogger not measured in this run (--peer-python)")
        say(rec.verdict, f"{'PASS' if p50 <= TARGET_US else 'MISS'} {row}: p50 {p50 / 1000:.3f} ms; target <= "
            f"{TARGET_US / 1000:.3f} ms ({beside})")


def record_plot(rec: Results, results: dict) -> None:
    """log_scalar p50 (us) per row: every logger x placement, the floors drawn as floors, the TorchRL peer in a
    colour of its own."""
    x = list(results)
    is_peer = [row.startswith(PEER_PREFIX) for row in x]
    ours, floors = with_floors(x, {"p50 us": [None if peer else results[row]["p50"] for row, peer in zip(x, is_peer)]},
                               lambda row: row.startswith("floor: "))
    series = {"p50 us": ours.pop("p50 us")}
    if any(is_peer):
        series["p50 us, TorchRL peer"] = [results[row]["p50"] if peer else None for row, peer in zip(x, is_peer)]
    rec.plot("log_scalar", "acknowledged log_scalar p50 per logger and placement, beside the floors and the peer", x=x,
             series={**series, **ours}, kind="bar", xlabel="row", ylabel="log_scalar p50 (us)", log=True,
             floors=floors)


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a fifth of the calls")
    parser.add_argument("--loggers", nargs="+", default=["csv", "tensorboard"], choices=["csv", "tensorboard"])
    parser.add_argument("--placements", nargs="+", default=PLACEMENTS, choices=PLACEMENTS)
    parser.add_argument("--peer-python", metavar="PATH", default=None,
                        help="the python of an environment with torchrl 0.14.1: measure TorchRL's ProcessLogger too")
    parser.add_argument("--peer-path", metavar="DIR", default=None,
                        help="a pip install --target directory the peer imports torchrl from first")
    return parser


def main() -> None:
    args = arguments().parse_args()
    rec = Results("logger")
    torch.set_num_threads(1)
    n = CALLS // (5 if args.quick else 1)
    placements = [p for p in PLACEMENTS if p in args.placements]
    loggers = {"csv": CSVLogger} if "csv" in args.loggers else {}
    tb = tensorboard_logger()
    skipped = []
    if "tensorboard" in args.loggers:
        if tb is None:
            skipped.append("tensorboard (torch.utils.tensorboard does not import)")
        else:
            loggers["tensorboard"] = tb

    ctx = mp_context()
    results: dict = {}
    profiles: dict = {}
    pids = {os.getpid()}
    directory = tempfile.mkdtemp(prefix="bench_logger_")
    started = time.monotonic()
    try:
        for i, (name, cls) in enumerate(loggers.items()):
            run_logger(name, cls, placements, directory, n, ctx, pids, results, profiles, floors=i == 0)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    peer_note = None
    if args.peer_python:
        print("  measuring TorchRL's ProcessLogger (benchmarks/torchrl_logger_peer.py)", file=sys.stderr, flush=True)
        try:
            row, cell = torchrl_peer(args.peer_python, args.peer_path, n)
            results[row] = cell
            blocks = cell.pop("block_p50")
            peer_note = (f"{row[len(PEER_PREFIX):]}: measured after our rows in the same run, in its own "
                         f"interpreter ({cell['n']} calls), not interleaved with them; the p50 of each fifth of its "
                         f"calls: {min(blocks) / 1000:.2f}-{max(blocks) / 1000:.2f} ms.")
        except Exception as exc:  # noqa: BLE001 - a missing peer leaves its row out, and says so
            peer_note = f"TorchRL peer ({args.peer_python}) failed, so its row is missing: {exc!r}"

    say(rec.note, f"Logger: acknowledged log_scalar (median over calls; {os.cpu_count()} CPUs; torch "
        f"{torch.__version__}; {'quick' if args.quick else 'full'} run, {time.monotonic() - started:.0f} s)", "# ")
    say(rec.note, "Each logger row calls owner.client().log_scalar(tag, value, step) and waits for it to return "
        "(written). Rows of one logger (and the floors, beside the first logger) were measured in alternating blocks.",
        "\n")
    if skipped:
        say(rec.note, f"Skipped: {', '.join(skipped)}.", "")
    if peer_note:
        say(rec.note, peer_note, "")
    report(results, profiles, rec)
    left = segments_of(pids)
    say(rec.note, f"cleanup: every owner and helper process stopped, temporary directory removed; {len(left)} rlsvc "
        f"segment(s) of this run left in /dev/shm" + (f": {', '.join(left)}" if left else ""), "\n")
    record_plot(rec, results)
    rec.save()


if __name__ == "__main__":
    main()
