"""Frames/s and wall seconds to solve CartPole-v1 with the PPO recipe, per placement, medians over seeds.

Each run is a real ``python -m launcher +recipe=ppo`` subprocess (so start-up is counted in "process s").
"Train s" is the recipe's own wall time from the first batch to solving; "start-up s" is process s minus train s
(everything but training: interpreter, planning, owners starting and stopping, reporting), compared with direct's.
Rows marked ``async`` run with ``components.collector.sync=false``: the collector worker gathers the next batch while
the learner trains on this one (policy lag of at most one update), the only way a separate collector process can
overlap its work with learning.

    python benchmarks/ppo_cartpole.py --seeds 0 1 2
    python benchmarks/ppo_cartpole.py --services direct --seeds 0 1 2 3 4
    python benchmarks/ppo_cartpole.py --peer "python path/to/cleanrl/ppo.py --total-timesteps 500000"
    python benchmarks/ppo_cartpole.py --seeds 0 1 2 --extra env.backend=vector   # every row on CartPole's numpy vector env

``--peer`` runs another command once per seed in the same session and reports its wall seconds beside ours
(for a peer such as CleanRL's ppo.py installed in its own environment). Without one, the reference figures
measured for CleanRL's ppo.py on these machines are printed for context, marked as not measured here.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time

from _harness import launcher_run, spread  # first: the checkout on sys.path (benchmarks/_harness.py)
from _results import Results, say
from components import compat

# (label, overrides): every combination the table says is built today.
PLACEMENTS = [
    ("direct", ["service=direct"]),
    ("thread", ["service=thread"]),
    ("process/queue", ["service=process", "transport=queue"]),
    ("process/shared_memory", ["service=process", "transport=shared_memory"]),
    ("process/process_slot", ["service=process", "transport=process_slot"]),
    ("process/distributed", ["service=process", "transport=distributed"]),
    ("ray", ["service=ray"]),  # each run starts (and stops) a local Ray cluster on 127.0.0.1
    ("ray/distributed", ["service=ray", "transport=distributed"]),  # Ray owners, payloads over gloo
    ("monarch", ["service=monarch"]),  # every owner in a Monarch actor, a proc each
]
# ... and where collection can overlap learning (a worker beside the learner), the same with
# components.collector.sync=false: the worker collects the next batch while the learner trains (policy lag <= 1).
CANDIDATES = PLACEMENTS + [(f"{label} async", [*overrides, "components.collector.sync=false"])
                           for label, overrides in PLACEMENTS if label == "thread" or label.startswith("process/")]
# ... and with components.collector.env_groups=2 (double buffering: the worker steps half its envs while the server
# process answers the other half) for the process servers over local transports, with and without overlap.
CANDIDATES += [(f"{label} groups=2{tag}", [*overrides, "components.collector.env_groups=2", *extra])
               for tag, extra in (("", []), (" async", ["components.collector.sync=false"]))
               for label, overrides in PLACEMENTS if label in ("process/shared_memory", "process/process_slot")]
# ... and with the policy in the collector's worker process (components.collector.local_policy=true: no inference server,
# weights through the shared-memory weight sync), with and without overlap.
CANDIDATES += [("process/local_policy" + tag, ["service=process", "components.collector.local_policy=true", *extra])
               for tag, extra in (("", []), (" async", ["components.collector.sync=false"]))]
# ... and two collector workers as local torch.distributed ranks, rpc workers or Monarch actors (services in the driver).
CANDIDATES += [(f"collectors {p} x2", ["service=direct", f"components.collector.placement={p}",
                                         "components.collector.num_collectors=2"])
               for p in ("distributed", "rpc", "monarch")]
REFERENCE = "CleanRL ppo.py (reference figures, not measured in this run): 2.2-3.3k frames/s, solves after 113-173k frames in 2.5-4 min"


def runnable(overrides: list[str]) -> bool:
    service = next(o.split("=", 1)[1] for o in overrides if o.startswith("service="))
    return all(compat.TABLE[(c, service)].built for c in compat.COMPONENTS if (c, service) in compat.TABLE)


def run_once(overrides: list[str], seed: int, timeout: float, extra: list[str] = ()) -> dict:
    summary, seconds = launcher_run(["+recipe=ppo", f"seed={seed}", "launcher.progress=false", "launcher.plot=false",
                                     *overrides, *extra], timeout)
    return {**summary, "process_seconds": seconds}


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--services", nargs="+", default=None, help="labels to run (default: every built one)")
    parser.add_argument("--peer", default=None, help="a peer command to time once per seed ({seed} is substituted)")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--extra", nargs="+", default=[], metavar="OVERRIDE",
                        help="launcher overrides added to every row (e.g. env.backend=vector)")
    return parser


COLUMNS = ["placement", "solved", "frames to solve", "train s", "process s", "start-up s", "frames/s"]
STARTUP_TARGET_S = 5.0
"""Target: a placement's start-up (process s minus train s: everything but training, its teardown included) at most
this much above direct's, measured in the same run."""


def main() -> None:
    args = arguments().parse_args()
    rec = Results("ppo_cartpole")
    rows = []
    for label, overrides in CANDIDATES:
        if args.services and label not in args.services:
            continue
        if not runnable(overrides):
            print(f"skip {label}: not built yet (see python -m launcher.matrix)", file=sys.stderr)
            continue
        results = []
        for seed in args.seeds:
            r = run_once(overrides, seed, args.timeout, args.extra)
            results.append(r)
            print(f"{label:>28} seed={seed}: {'solved' if r['solved'] else 'NOT solved'} after {r['frames']:,} frames, "
                  f"{r['wall_seconds']:.1f} s train, {r['process_seconds']:.1f} s process, {r['fps']:,.0f} frames/s",
                  file=sys.stderr, flush=True)
        rows.append((label, results))

    peer = []
    if args.peer:
        for seed in args.seeds:
            start = time.perf_counter()
            subprocess.run(shlex.split(args.peer.format(seed=seed)), check=True, capture_output=True, timeout=args.timeout)
            peer.append(time.perf_counter() - start)

    extra = f", every row with {' '.join(args.extra)}" if args.extra else ""
    title = (f"PPO on CartPole-v1, {len(args.seeds)} seeds {args.seeds}{extra}, medians (target: mean return of the "
             "last 20 episodes >= 475)")
    print(f"\n{title}")
    width = max([22, *(len(label) for label, _ in rows)])
    head = f"| {'placement':<{width}} | solved | frames to solve | train s | process s | start-up s | frames/s |"
    print(head)
    print("|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|")
    med = statistics.median
    table = []  # as printed, values as numbers ("solved" stays "2/3")
    for label, results in rows:
        solved = sum(r["solved"] for r in results)
        table.append([label, f"{solved}/{len(results)}", med(r["frames"] for r in results),
                      med(r["wall_seconds"] for r in results), med(r["process_seconds"] for r in results),
                      med(startup(r) for r in results), med(r["fps"] for r in results)])
        print(f"| {label:<{width}} | {solved}/{len(results):<4} | {table[-1][2]:>15,.0f} | {table[-1][3]:>7.1f} | "
              f"{table[-1][4]:>9.1f} | {table[-1][5]:>10.1f} | {table[-1][6]:>8,.0f} |")
    targets(rows, rec)
    startup_targets(rows, rec)
    if peer:  # printed after the targets, recorded as the table's last row
        print(f"| {'peer: ' + args.peer[:16]:<{width}} | {'?':<6} | {'?':>15} | {'?':>7} | {med(peer):>9.1f} | "
              f"{'?':>10} | {'?':>8} |")
        table.append([f"peer: {args.peer[:16]}", None, None, None, med(peer), None, None])
    else:
        print(REFERENCE)
        rec.note(REFERENCE)
    rec.table(title, COLUMNS, table)
    record_plots(rec, table)
    rec.save()


def record_plots(rec: Results, table: list) -> None:
    """From the recorded table: median frames/s per placement row; median train and process seconds per row (the
    peer's row, if any, has process seconds only)."""
    ours = [row for row in table if row[6] is not None]
    rec.plot("fps", "PPO on CartPole-v1: median frames/s per placement", x=[row[0] for row in ours],
             series={"frames/s": [row[6] for row in ours]}, kind="bar", xlabel="placement", ylabel="frames/s")
    rec.plot("seconds", "PPO on CartPole-v1: median seconds to solve per placement", x=[row[0] for row in table],
             series={"train s": [row[3] for row in table], "start-up s": [row[5] for row in table],
                     "process s": [row[4] for row in table]}, kind="bar", xlabel="placement", ylabel="seconds")


def startup(result: dict) -> float:
    """A run's seconds outside training: start-up, planning, owners starting and stopping, reporting."""
    return result["process_seconds"] - result["wall_seconds"]


def startup_targets(rows: list, rec: Results) -> None:
    """Each row's median start-up against direct's, from this run (target: at most STARTUP_TARGET_S more)."""
    med = statistics.median
    base = next((results for label, results in rows if label == "direct"), None)
    others = [(label, results) for label, results in rows if label != "direct"]
    if base is None or not others:
        return
    direct = med(startup(r) for r in base)
    print(f"\n### Target: start-up within {STARTUP_TARGET_S:g} s of direct's ({os.cpu_count()} cores; direct "
          f"{direct:.1f} s)\n")
    for label, results in others:
        seconds = spread(startup(r) for r in results)
        verdict = "PASS" if seconds.median <= direct + STARTUP_TARGET_S else "MISS"
        say(rec.verdict, f"{verdict} {label}: start-up {seconds.median:.1f} s = direct + "
            f"{seconds.median - direct:.1f} s [{seconds.range('.1f')}]")


def targets(rows: list, rec: Results) -> None:
    """Each process row's median frames/s against direct's, from this run (target: no slower than direct);
    printed, and recorded in ``rec``."""
    med = statistics.median
    base = next((results for label, results in rows if label == "direct"), None)
    process = [(label, results) for label, results in rows if label.startswith("process/")]
    if base is None or not process:
        return
    direct_fps, direct_s = med(r["fps"] for r in base), med(r["wall_seconds"] for r in base)
    print(f"\n### Target: process placement no slower than direct ({os.cpu_count()} cores; direct {direct_fps:,.0f} "
          f"frames/s, {direct_s:.1f} s train)\n")
    for label, results in process:
        fps, secs = med(r["fps"] for r in results), med(r["wall_seconds"] for r in results)
        verdict = "PASS" if fps >= direct_fps else "MISS"
        say(rec.verdict, f"{verdict} {label}: {fps:,.0f} frames/s = {fps / direct_fps:.2f}x direct; train s "
            f"{secs:.1f} = {secs / direct_s:.2f}x direct")


if __name__ == "__main__":
    main()
