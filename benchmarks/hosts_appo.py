"""APPO on MinAtar with its collector ranks on another host, beside the same plan with every rank on one host: what
frames/s a run loses when its collectors reach the driver across a veth instead of inside one host.

Hosts a and b of set 8 (``rlsvc8-a`` at 10.77.8.1, ``rlsvc8-b`` at 10.77.8.2, joined by a bridge; ``.ci/hosts.sh``
makes them; the tests use sets 0 and up, one per xdist worker, and ``hosts.py`` set 9, so this runs beside both) are
made at the start and removed at the end, also on a failure, Ctrl-C or SIGTERM.

Both placements run the same torchrun job, one ``python -m launcher`` command line on every rank (as
``docs/pages/running/torchrun.md`` gives it): ``+recipe=appo env=minatar seed=0``, rank 0 the driver with
the inference server on a thread of it, serving over the ``distributed`` transport on host a's address, ranks 1 and 2
one collector each (``distributed.ranks=env``), a static rendezvous at host a's address, the run's key in
``RLSVC_KEY`` (a random one per run of the script), ``OMP_NUM_THREADS=1``:

* **across hosts**: two torchrun nodes, the driver's on host a (``--nproc-per-node 1``) and the collectors' on host
  b (``--nproc-per-node 2``): every step's frames and answers cross the veth pairs and the bridge;
* **one host**: one torchrun node on host a with ``--nproc-per-node 3``, with the same addresses: the collectors
  reach the driver at 10.77.8.1 from inside host a.

The only difference is where ranks 1 and 2 run. Rounds alternate the order (across then one host, then one host then
across, ...), so that both see the same drift of a shared machine. Each run's frames/s are read from its
``summary.json``: ``steady_fps`` (from the second batch counted to the last: start-up left out) and ``fps`` (the
whole run). The ratio is across over one host, per round; the target takes the median over rounds.

The namespaces separate the network, not the CPUs: both placements share the machine's cores, so the ratio is what
the veth and the cross-host path cost, not what a second machine's cores would add.

Needs root (network namespaces). Run from the repository root:

    python benchmarks/hosts_appo.py             # 4 rounds (8 runs of 30,000 frames)
    python benchmarks/hosts_appo.py --quick     # 1 round (2 runs)

Target (PASS/MISS printed at the end): frames/s (``steady_fps``) with the collectors on host b at least 0.9x the same
plan's with every rank on host a (median of the per-round ratios).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from _harness import OtherLoad, read_summary, spread, start_child, stop_group  # first: the checkout on sys.path
from _results import Results, say, show
from hosts import Unavailable, hosts_down, hosts_up

SET = 8
TARGET = 0.9
PORT = 29700
"""torchrun's master port of the first run; each run takes the next (no run waits on a port the last one left)."""
RUN_S = 300.0
"""Seconds one run may take (start-up and exit included) before it is ended and the script fails."""
ACROSS, ONE = "across", "one host"
CONNECTED = re.compile(r"rank (\d+): connected to the driver at ([\d.]+):\d+")
"""A collector rank's line in the run's launcher.log: its rank and the driver's address it reached."""
LABELS = {ACROSS: "across hosts: driver on a, collector ranks on b",
          ONE: "one host: every rank on a (same addresses)"}


def overrides(frames: int, host_a: str) -> list[str]:
    """The launcher's command line on every rank of either placement."""
    return ["+recipe=appo", "env=minatar", f"recipe.total_frames={frames}", "seed=0",
            "launcher.progress=false", "launcher.plot=false",
            "components.collector.placement=distributed", "components.collector.num_collectors=2",
            "distributed.ranks=env", "components.inference.placement=thread",
            "components.inference.transport=distributed", f"+components.inference.transport_options.host={host_a}"]


def torchrun(netns: str, address: str, nnodes: int, node_rank: int, nproc: int, master: str, port: int,
             args: list[str], env: dict, log) -> subprocess.Popen:
    """One torchrun node on host ``netns`` (static rendezvous at ``master:port``), its ranks running the launcher,
    in a session of its own; its output goes to ``log``."""
    command = ["ip", "netns", "exec", netns, sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
               "--node-rank", str(node_rank), "--nproc-per-node", str(nproc), "--master-addr", master,
               "--master-port", str(port), "--local-addr", address, "--monitor-interval", "1", "-m", "launcher",
               *args]
    return start_child(command, stdout=log, stderr=subprocess.STDOUT, env=env)


def run_once(placement: str, hosts: dict, frames: int, port: int, env: dict, nodes: list) -> dict:
    """One run of the plan in ``placement``: its frames/s, frames, final return, wall seconds and the CPU seconds
    other processes used meanwhile. ``nodes`` holds its torchrun processes while it runs (for the cleanup)."""
    (a_ns, a), (b_ns, b) = hosts["a"], hosts["b"]
    run_dir = tempfile.mkdtemp(prefix="bench_hosts_appo_")
    logs = []
    try:
        args = [*overrides(frames, a), f"hydra.run.dir={run_dir}"]
        other = OtherLoad()
        start = time.monotonic()
        if placement == ACROSS:
            specs = [(a_ns, a, 2, 0, 1), (b_ns, b, 2, 1, 2)]
        else:
            specs = [(a_ns, a, 1, 0, 3)]
        started = []
        for netns, address, nnodes, node_rank, nproc in specs:
            logs.append(tempfile.TemporaryFile(mode="w+"))
            started.append(torchrun(netns, address, nnodes, node_rank, nproc, a, port, args, env, logs[-1]))
        nodes.extend(started)
        deadline = start + RUN_S
        for proc, log in zip(started, logs):
            try:
                proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"{placement}: a torchrun node still ran after {RUN_S:.0f} s\n{_tail(log)}") \
                    from None
        wall = time.monotonic() - start
        for proc, log in zip(started, logs):
            if proc.returncode != 0:
                raise RuntimeError(f"{placement}: a torchrun node exited with status {proc.returncode}\n{_tail(log)}")
        for proc in started:
            nodes.remove(proc)
        summary = read_summary(run_dir)
        if summary is None:
            raise RuntimeError(f"{placement}: the run wrote no summary.json\n{_tail(logs[0])}")
        with open(os.path.join(run_dir, "launcher.log")) as f:
            connected = sorted({(int(m[1]), m[2]) for m in CONNECTED.finditer(f.read())})
        if connected != [(1, a), (2, a)]:
            raise RuntimeError(f"{placement}: the collector ranks connected to the driver at {connected}, not ranks "
                               f"1 and 2 at {a}")
        other_cpu, _ = other.seconds()
        return {"placement": placement, "steady_fps": summary.get("steady_fps"), "fps": summary.get("fps"),
                "frames": summary.get("frames"), "final_mean_return": summary.get("final_mean_return"),
                "wall_s": wall, "other_cpu_s": other_cpu, "connected": connected}
    finally:
        for log in logs:
            log.close()
        shutil.rmtree(run_dir, ignore_errors=True)


def _tail(log, chars: int = 3000) -> str:
    log.flush()
    log.seek(0)
    return log.read()[-chars:]


def ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x and y else None


def report(rounds: list[list[dict]], rec: Results, args):
    """The tables and the plot; returns the `spread` of the per-round ratios of ``steady_fps``."""
    runs = {p: [r for pair in rounds for r in pair if r["placement"] == p] for p in (ACROSS, ONE)}
    by_round = [{r["placement"]: r for r in pair} for pair in rounds]
    steady = [ratio(r[ACROSS]["steady_fps"], r[ONE]["steady_fps"]) for r in by_round]
    whole = [ratio(r[ACROSS]["fps"], r[ONE]["fps"]) for r in by_round]
    rows = []
    for p in (ACROSS, ONE):
        s, f = spread(r["steady_fps"] for r in runs[p]), spread(r["fps"] for r in runs[p])
        w, ret = spread(r["wall_s"] for r in runs[p]), spread(r["final_mean_return"] for r in runs[p])
        rows.append([LABELS[p], s.median, [s.low, s.high], f.median, [f.low, f.high], w.median, ret.median,
                     len(runs[p])])
    s, f = spread(steady), spread(whole)
    rows.append(["across / one host (per round)", s.median, [s.low, s.high], f.median, [f.low, f.high], None, None,
                 len(rounds)])
    show(rec, f"APPO on MinAtar, {args.frames:,} frames, seed 0: frames/s by where the collector ranks run "
              f"({len(rounds)} {'round' if len(rounds) == 1 else 'rounds'})",
         ["placement", "steady frames/s", "range", "frames/s (whole run)", "range", "wall s", "final return", "runs"],
         rows,
         note="Medians and ranges over the runs of each placement; the last row, over the per-round ratios. Steady "
              "frames/s count from the second batch to the last (summary.json's steady_fps), the whole run's from the "
              "start (fps); wall s is the torchrun job's, start-up and exit included. Every run has the driver (rank "
              "0, the inference server on a thread of it, serving over distributed on 10.77.8.1) and two collector "
              "ranks; only where ranks 1 and 2 run differs.")
    show(rec, "Each round", ["round", "order", "across steady", "one host steady", "across / one host",
                             "across frames/s", "one host frames/s", "across / one host (whole run)",
                             "other CPU s (across)", "other CPU s (one host)"],
         [[i + 1, " then ".join(r["placement"] for r in pair), by_round[i][ACROSS]["steady_fps"],
           by_round[i][ONE]["steady_fps"], steady[i], by_round[i][ACROSS]["fps"], by_round[i][ONE]["fps"], whole[i],
           by_round[i][ACROSS]["other_cpu_s"], by_round[i][ONE]["other_cpu_s"]]
          for i, pair in enumerate(rounds)],
         note="Other CPU s: what processes outside the benchmark used during each run, on a shared machine.")
    rec.plot("appo", "APPO on MinAtar: steady frames/s per round, collector ranks across the veth or on one host",
             x=list(range(1, len(rounds) + 1)),
             series={LABELS[p]: [r[p]["steady_fps"] for r in by_round] for p in (ACROSS, ONE)}, kind="line",
             xlabel="round", ylabel="steady frames/s", floors=[LABELS[ONE]])
    return spread(steady)


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 round: one run of each placement")
    parser.add_argument("--rounds", type=int, default=None, help="rounds, each a run of both (default 4; --quick 1)")
    parser.add_argument("--frames", type=int, default=30000, help="frames per run (default 30000)")
    return parser


def _interrupted(signum, _frame):
    raise SystemExit(128 + signum)  # the finally below ends the runs and removes the hosts


def main() -> None:
    args = arguments().parse_args()
    args.rounds = args.rounds or (1 if args.quick else 4)
    if os.geteuid() != 0:
        sys.exit("hosts_appo.py: needs root: its hosts are network namespaces (ip netns add); run it as root, or "
                 "skip it")
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupted)
    rec = Results("hosts_appo")
    env = {**os.environ, "RLSVC_KEY": os.urandom(16).hex(), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    nodes: list[subprocess.Popen] = []
    rounds: list[list[dict]] = []
    other = OtherLoad()
    try:
        hosts = hosts_up(SET)
        print(f"hosts: a {hosts['a'][1]} ({hosts['a'][0]}), b {hosts['b'][1]} ({hosts['b'][0]})", flush=True)
        port = PORT
        for r in range(args.rounds):
            pair = []
            for placement in ((ACROSS, ONE) if r % 2 == 0 else (ONE, ACROSS)):
                pair.append(run_once(placement, hosts, args.frames, port, env, nodes))
                port += 1
                got = pair[-1]
                print(f"round {r + 1}/{args.rounds} {placement}: steady {got['steady_fps']:.0f} frames/s, "
                      f"{got['fps']:.0f} over the run, {got['wall_s']:.1f} s, return {got['final_mean_return']:.2f}, "
                      f"other processes {got['other_cpu_s']:.0f} CPU s", flush=True)
            rounds.append(pair)
    except Unavailable as exc:
        sys.exit(f"hosts_appo.py: no network namespaces here: {exc}")
    finally:  # what a failure or an interruption left running is ended with its whole session
        for proc in nodes:
            stop_group(proc)
        hosts_down(SET)
    other_cpu, wall = other.seconds()
    say(rec.note, f"Hosts as network namespaces on one machine ({os.cpu_count()} CPUs, shared: the namespaces "
        f"separate the network, not the cores), set {SET}: host a {hosts['a'][0]} ({hosts['a'][1]}), host b "
        f"{hosts['b'][0]} ({hosts['b'][1]}); {'quick' if args.quick else 'full'} run, {wall:.0f} s; other processes "
        f"used {other_cpu:.0f} CPU s meanwhile", "# ")
    say(rec.note, f"In every run, ranks 1 and 2 connected to the driver at {hosts['a'][1]} (the run's launcher.log)",
        "# ")
    ratios = report(rounds, rec, args)
    print()
    say(rec.verdict, f"{'PASS' if ratios.median >= TARGET else 'MISS'} APPO on MinAtar with its collector ranks on "
        f"host b: {ratios.median:.2f}x the steady frames/s of the same plan with every rank on host a (median of "
        f"{len(rounds)} per-round ratios, range {ratios.range('.2f')}; target >= {TARGET:.2f}x)")
    rec.save()


if __name__ == "__main__":
    main()
