"""Load and data: many concurrent callers, every answer and every row checked, the owner's memory watched.

For every inference cell built today (``thread/thread``, ``thread/direct``, ``process/queue``,
``process/shared_memory``, ``process/process_slot``, ``process/distributed``, ``ray/ray``, ``ray/distributed``),
64 clients make 10,000 requests each at once to a real `components.inference.InferenceServer` serving an
echo policy; each request is its own (client id, sequence) pair, so every answer is checked against its request.
For every replay cell (``thread/thread``, ``process/queue``, ``process/shared_memory``, ``process/distributed``,
``ray/ray``, ``ray/distributed``), 8 producers make 10,000 extends of 4 rows each (unique ids) at once to a
`components.replay.ReplayBuffer` with the ``without_replacement`` sampler and room for every row; then one
epoch of samples must return every acknowledged row exactly once, at the position its extend acknowledged.
What counts as lost, duplicated and misrouted is defined in ``benchmarks/_load.py``, which
``tests/components/test_load.py`` runs at a smaller scale.

Clients of ``process`` owners are threads of 4 spawned worker processes (16 clients each for 64; each client
has its own endpoint, so ``process_slot`` gets one slot per client); clients of ``thread`` and ``ray`` owners are
threads of this process. A ``thread`` owner lives in this process too, so its figure includes the clients'
memory (``in-process`` in the table); a Ray owner's is its actor's process. Ray cells
run in a local cluster on 127.0.0.1 that the script starts and stops.

Memory: the owner process's ``VmRSS`` after the warm-up (the first 10% of every client's calls) and at the end;
a row passes when nothing is lost, duplicated or misrouted and the growth is at most 10%. A replay owner's
storage is allocated by the first extend and its pages are touched as rows arrive (24 bytes a row: 7.3 MiB
for 8 x 10,000 x 4 rows), which counts in its growth. Run from the repository root:

    python benchmarks/load.py                                  # everything, full scale (long: tens of minutes)
    python benchmarks/load.py --transports queue shared_memory process_slot
    python benchmarks/load.py --clients 16 --requests 500 --producers 8 --extends 200   # scaled down
    python benchmarks/load.py --components replay --transports ray/ray thread
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch

import _harness  # noqa: F401 - first: the checkout on sys.path (benchmarks/_harness.py)
from benchmarks._load import INFERENCE_CELLS, MEMORY_BOUND, REPLAY_CELLS, ROWS_PER_EXTEND, Result, Workers, run_cell
from _results import Results, say

WORKERS = 4  # client processes of the process owners


def selected(cells: list, transports: list | None) -> list:
    """Cells whose transport (``queue``) or whole label (``ray/distributed``) is listed; all without a list."""
    return [c for c in cells if transports is None or c in transports or c.split("/")[1] in transports]


def row(r: Result) -> str:
    memory = f"{r.rss_warm:.0f} | {r.rss_end:.0f} | {r.growth:+.1f}%" + (" (in-process)" if r.in_process else "")
    verdict = "PASS" if r.correct and r.flat else "FAIL"
    counted = f"{r.calls} | {r.rows} |" if r.component == "replay" else f"{r.calls} |"
    return (f"| {r.cell} | {counted} {r.lost} | {r.duplicated} | {r.misrouted} | {r.wall_s:.1f} | "
            f"{r.calls / r.wall_s:,.0f} | {memory} | {verdict} |")


def values(r: Result) -> list:
    """`row` as values (growth in %; ``in-process`` is said in the table's note)."""
    counted = [r.calls, r.rows] if r.component == "replay" else [r.calls]
    return [r.cell, *counted, r.lost, r.duplicated, r.misrouted, r.wall_s, r.calls / r.wall_s, r.rss_warm, r.rss_end,
            r.growth, "PASS" if r.correct and r.flat else "FAIL"]


MEMORY_COLUMNS = ["owner RSS after warm-up MiB", "owner RSS at end MiB", "growth", "verdict"]
COLUMNS = {"inference": ["cell", "requests", "lost", "duplicated", "misrouted", "wall s", "req/s", *MEMORY_COLUMNS],
           "replay": ["cell", "extends", "rows", "lost rows", "duplicated rows", "misrouted rows", "wall s",
                      "extends/s", *MEMORY_COLUMNS]}


def report(component: str, results: list, callers: int, calls: int, rec: Results) -> None:
    """The component's table (printed, and recorded in ``rec``) and its cells' first errors (recorded as notes)."""
    if not results:
        return
    if component == "inference":
        title = f"inference: {callers} clients x {calls} requests"
    else:
        title = f"replay: {callers} producers x {calls} extends of {ROWS_PER_EXTEND} rows"
    print(f"\n### {title}\n")
    print(f"| {' | '.join(COLUMNS[component])} |")
    print("|" + "---|" * len(COLUMNS[component]))
    for r in results:
        print(row(r))
    in_process = [r.cell for r in results if r.in_process]
    rec.table(title, COLUMNS[component], [values(r) for r in results],
              note="growth: % of the owner's RSS after the warm-up" + (
                  f"; in-process (the owner lives in this process, so its figure includes the callers' memory): "
                  f"{', '.join(in_process)}" if in_process else ""))
    for r in results:
        for error in r.errors[:3]:
            say(rec.note, f"{r.cell}: {error.strip()}", "\n- ")


def record_plot(rec: Results, results: dict) -> None:
    """Requests/s of the inference cells and extends/s of the replay cells, a bar each per cell."""
    rates = {component: {r.cell: r.calls / r.wall_s for r in results[component]} for component in results}
    x = list(dict.fromkeys([*rates["inference"], *rates["replay"]]))
    rec.plot("rate", "calls/s per cell under load: inference requests, replay extends", x=x, kind="bar",
             series={"requests/s (inference)": [rates["inference"].get(cell) for cell in x],
                     "extends/s (replay)": [rates["replay"].get(cell) for cell in x]},
             xlabel="cell", ylabel="calls/s")


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=64, help="concurrent inference clients")
    parser.add_argument("--requests", type=int, default=10_000, help="requests per inference client")
    parser.add_argument("--producers", type=int, default=8, help="concurrent replay producers")
    parser.add_argument("--extends", type=int, default=10_000, help="extends per replay producer")
    parser.add_argument("--transports", nargs="+", help="transports (queue) or cells (ray/distributed) to run")
    parser.add_argument("--components", nargs="+", choices=["inference", "replay"], default=["inference", "replay"])
    return parser


def main(argv=None) -> int:
    args = arguments().parse_args(argv)
    rec = Results("load", argv)
    torch.set_num_threads(1)
    plan = [(component, cell) for component, cells in (("inference", INFERENCE_CELLS), ("replay", REPLAY_CELLS))
            if component in args.components for cell in selected(cells, args.transports)]
    scale = {"inference": (args.clients, args.requests), "replay": (args.producers, args.extends)}
    results: dict = {"inference": [], "replay": []}
    with contextlib.ExitStack() as stack:
        workers = None
        if any(cell.startswith("process/") for _, cell in plan):
            workers = Workers(WORKERS)
            stack.callback(workers.close)
        if any(cell.startswith("ray/") for _, cell in plan):
            from components.hosts.ray import RayClusterConfig, ray_cluster

            stack.enter_context(ray_cluster(RayClusterConfig()))  # a session dir of its own, removed after
        for component, cell in plan:
            r = run_cell(component, cell, *scale[component], workers=workers)
            results[component].append(r)
            print(f"  {component} {cell}: {r.calls} calls in {r.wall_s:.1f} s, lost {r.lost}, duplicated "
                  f"{r.duplicated}, misrouted {r.misrouted}, RSS {r.rss_warm:.0f} -> {r.rss_end:.0f} MiB",
                  file=sys.stderr, flush=True)
    for component in ("inference", "replay"):
        report(component, results[component], *scale[component], rec)
    everything = results["inference"] + results["replay"]
    passed = all(r.correct and r.flat for r in everything)
    say(rec.verdict, f"{'PASS' if passed else 'FAIL'}: {sum(r.correct for r in everything)}/{len(everything)} cells "
        f"lost, duplicated and misrouted nothing; {sum(r.flat for r in everything)}/{len(everything)} grew at most "
        f"{MEMORY_BOUND:.0f}% after the warm-up", "\n")
    record_plot(rec, results)
    rec.save()  # a FAIL is a result too: the run completed, and its file keeps it
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
