"""What a collector on another host costs an inference server: measured across a veth between two hosts (network
namespaces on this machine, made by ``.ci/hosts.sh``), beside a bare gloo pair across the same veth, in one run.

Hosts a and b of set 9 (``rlsvc9-a`` at 10.77.9.1, ``rlsvc9-b`` at 10.77.9.2, joined by a bridge; the tests use sets
0 and up, one per xdist worker, so the benchmark runs beside them) are made at the start and removed at the end, also
on a failure, Ctrl-C or SIGTERM. The processes are ``benchmarks/hosts_peer.py``'s: the owner of a ``distributed``
endpoint serving on host a (its store on a's loopback behind the authenticated relay on 10.77.9.1, a serving loop
answering each request) and a caller on host b, as a collector would call it; the run's key is a random one.

Round trips (R rounds; each starts with a new endpoint, whose connect time it records, then measures a block of n
sequential round trips, after a warm-up, of each row below, in an order that rotates from round to round):

* ``distributed``: a 4x84x84 uint8 frame stack (28,224 B) asked of the endpoint, an int64 answered
  (``submit(td).result()``), every answer checked;
* the floor: a bare ProcessGroupGloo pair between the same two hosts (a TCPStore bound to 10.77.9.1, each side's
  gloo device bound to its own address, one worker thread, as the transport builds its pairs): 28,256 B sent, 40 B
  received back (the transport's messages, its 32-byte header included);
* for context, the transport's wire alone across the same veth (its framing on a pair of groups of its own, one per
  direction as an endpoint's, one thread each side: no receiving threads, no serving loop), and the bare pair on
  loopback inside host b.

The ratio is a row's p50 over the veth floor's p50 of the same round; the target takes the median over rounds. CPU
microseconds per round trip are each process's user + system time over its blocks, and the part of the answering
process's spent by its threads that run Python (they share one GIL).

Capacity: a second owner on host a and a second caller on host b; the caller opens endpoints one after another
(each makes one call and stays open) up to 1, 8 and 32 (``--endpoints``), and both processes report what they
hold at each count: threads (and Python's by name), descriptors and sockets, resident memory (RSS, PSS), and, for
the owner, the connections to its store and the data segments and bytes they carried (``ss -ti`` in host a). Then
both sit idle for a few seconds with every endpoint open, to count what the store still receives. The last table
extrapolates the measured per-endpoint costs to 1,000 endpoints (1,000 collectors on 100 hosts) on one owner.

Needs root (network namespaces). Run from the repository root:

    python benchmarks/hosts.py             # 15 rounds of 1,000 round trips
    python benchmarks/hosts.py --quick     # 5 rounds of 200 (under a minute)

Target (PASS/MISS printed at the end): the ``distributed`` round trip across the veth at most 1.5x the bare gloo
pair's across the same veth (median of the per-round ratios).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

from _harness import HERE, ROOT, OtherLoad, percentiles, spread  # first: the checkout on sys.path
from _results import Results, say, show

SET = 9
SCRIPT = os.path.join(ROOT, ".ci", "hosts.sh")
PEER = [sys.executable, os.path.join(HERE, "hosts_peer.py")]
TARGET = 1.5
IDLE_S = 3.0
"""Seconds the owner and caller sit idle, every endpoint open, while what reaches the store is counted."""
FLEET = (1000, 100)
"""Collectors and hosts the last table extrapolates to."""
ANSWER_S = 180.0
"""Seconds a peer has to answer one command (a block of round trips on a loaded machine included)."""


# ---------------------------------------------------------------------------------------------- hosts and peers
class Unavailable(Exception):
    """No hosts here (the reason is the message)."""


def hosts_up(set_id: int = SET) -> dict:
    """Hosts a, b, c of set ``set_id`` (replacing what a crashed run left): ``{"a": (netns, address), ...}``."""
    done = subprocess.run([SCRIPT, "up", str(set_id)], capture_output=True, text=True, timeout=60)
    if done.returncode == 77:
        raise Unavailable(done.stderr.strip())
    if done.returncode != 0:
        raise RuntimeError(f"{SCRIPT} up {set_id} failed: {done.stderr.strip()}")
    values = dict(line.split("=", 1) for line in done.stdout.split())
    return {n: (values[f"RLSVC_NETNS_{n.upper()}"], values[f"RLSVC_HOST_{n.upper()}"]) for n in "abc"}


def hosts_down(set_id: int = SET) -> None:
    """Remove set ``set_id``'s namespaces (ending what still runs inside them) and check that none is left."""
    subprocess.run([SCRIPT, "down", str(set_id)], timeout=60, check=False)
    left = [line.split()[0] for line in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                                       timeout=30).stdout.splitlines()
            if line.startswith(f"rlsvc{set_id}-")]
    if left:
        print(f"{os.path.basename(sys.argv[0])}: namespaces left behind: {left}", file=sys.stderr)


class Peer:
    """A ``hosts_peer.py`` process inside a namespace, in a session of its own, driven by JSON lines."""

    def __init__(self, netns: str, role: str, where: str, env: dict, label: str):
        self.label, self.stopped = label, False
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(["ip", "netns", "exec", netns, *PEER, role, where], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True, cwd=ROOT, env=env,
                                     start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, name=f"{label}-out", daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def read(self, timeout: float = ANSWER_S) -> dict:
        """The peer's next answer; raises, with the end of its stderr, when it ends or says an error instead."""
        try:
            answer = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError(f"{self.label}: no answer within {timeout:.0f} s\n{self.tail()}") from None
        if answer is None:
            raise RuntimeError(f"{self.label} ended (status {self.proc.wait(10)})\n{self.tail()}")
        if "error" in answer:
            raise RuntimeError(f"{self.label}: {answer['error']}\n{self.tail()}")
        return answer

    def ask(self, op: str, timeout: float = ANSWER_S, **args) -> dict:
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        return self.read(timeout)

    def tail(self, chars: int = 3000) -> str:
        self.stderr.seek(0)
        return self.stderr.read()[-chars:]

    def stop(self, ask: bool = True) -> None:
        """Ask it to quit (``ask``; bounded), then end whatever is left of its session and reap it (once: its pid
        may name another process afterwards)."""
        if self.stopped:
            return
        self.stopped = True
        if ask and self.proc.poll() is None:
            try:
                self.ask("quit", timeout=20)
                self.proc.wait(20)
            except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired):
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self.stderr.close()


def start(peers: list, *specs: tuple) -> list[tuple["Peer", dict]]:
    """Start peers (``(netns, role, where, env, label)`` each) together; each with its ready line."""
    started = [Peer(*spec) for spec in specs]
    peers.extend(started)
    return [(peer, peer.read()) for peer in started]


# ---------------------------------------------------------------------------------------------- measuring
def round_trips(hosts: dict, env: dict, args, peers: list) -> dict:
    """The rounds: a new endpoint, then blocks of round trips to it and to the floors, in rotating order."""
    (a_ns, a), (b_ns, b) = hosts["a"], hosts["b"]
    specs = [(a_ns, "serve", a, env, "owner on a"), (a_ns, "floor", a, env, "floor rank 0 on a"),
             (b_ns, "call", b, env, "caller on b")]
    if not args.no_loopback:
        specs.append((b_ns, "floor", "127.0.0.1", env, "loopback floor rank 0 on b"))
    (server, ready), (veth, veth_ready), (caller, _), *loop = start(peers, *specs)
    caller.ask("address", address=ready["address"])
    floor_connect = caller.ask("floor", name="veth", host=a, port=veth_ready["port"], wire=True)["connect_s"]
    echo = {"distributed": server, "veth": veth, "wire": veth}
    if loop:
        caller.ask("floor", name="loopback", host="127.0.0.1", port=loop[0][1]["port"])
        echo["loopback"] = loop[0][0]
    out = {"first_connect_s": caller.ask("connect")["connect_s"], "floor_connect_s": floor_connect, "rounds": []}
    names = list(echo)
    for r in range(args.rounds):
        row = {"connect_s": caller.ask("connect")["connect_s"]}
        for name in names[r % len(names):] + names[:r % len(names)]:
            before = echo[name].ask("cpu")
            got = caller.ask("rt", to=name, warmup=args.warmup, n=args.n)
            after = echo[name].ask("cpu")
            row[name] = {"rt_us": got["rt_us"], "caller_cpu_s": got["cpu_s"], "calls": got["calls"],
                         "server_cpu_s": after["cpu_s"] - before["cpu_s"],
                         "server_python_s": after["python_s"] - before["python_s"], "served": args.n + args.warmup}
        out["rounds"].append(row)
        print(f"round {r + 1}/{args.rounds}: connect {row['connect_s'] * 1e3:.1f} ms; p50 "
              + ", ".join(f"{n} {percentiles(row[n]['rt_us'], [50])[0]:.0f} us" for n in names), flush=True)
    for peer in [caller, veth, *(p for p, _ in loop), server]:  # the caller first: it stops the floors' ranks 0
        peer.stop()
    return out


def capacity(hosts: dict, env: dict, counts: list[int], burst: int, peers: list) -> dict:
    """A fresh owner and caller: what each holds with 0 and then each count of endpoints open, the store's traffic
    while they sit idle, then ``burst`` more endpoints connecting at once."""
    (a_ns, a), (b_ns, b) = hosts["a"], hosts["b"]
    (server, ready), (caller, _) = start(peers, (a_ns, "serve", a, env, "owner on a (capacity)"),
                                         (b_ns, "call", b, env, "caller on b (capacity)"))
    caller.ask("address", address=ready["address"])
    out = {"counts": [0], "server": [server.ask("stats")], "caller": [caller.ask("stats")], "connect_s": []}
    for n in counts:
        opened = caller.ask("open", n=n - out["counts"][-1])
        out["connect_s"] += opened["connect_s"]
        out["counts"].append(n)
        out["server"].append(server.ask("stats"))
        out["caller"].append(caller.ask("stats"))
        print(f"{n} endpoints: owner {out['server'][-1]['threads']} threads, {out['server'][-1]['fds']} descriptors; "
              f"caller {out['caller'][-1]['threads']} threads, {out['caller'][-1]['fds']} descriptors", flush=True)
    started = time.monotonic()
    time.sleep(IDLE_S)  # a measuring window, not a wait for something to happen
    idle = server.ask("stats")
    out["idle"] = {"seconds": time.monotonic() - started, "before": out["server"][-1], "after": idle}
    if burst:
        out["burst"] = {"n": burst, **caller.ask("burst", n=burst)}
        print(f"{burst} endpoints at once: all connected after {out['burst']['wall_s']:.2f} s", flush=True)
    for peer in (caller, server):
        peer.stop()
    return out


# ---------------------------------------------------------------------------------------------- reporting
LABELS = {"distributed": "distributed, b calls a across the veth", "veth": "gloo pair floor, b to a across the veth",
          "wire": "distributed wire alone, b to a across the veth (context)",
          "loopback": "gloo pair, loopback inside b (context)"}
SHORT = {"distributed": "distributed", "veth": "floor (veth)", "wire": "wire alone (veth)",
         "loopback": "floor (loopback)"}


def median(values) -> float:
    return percentiles(values, [50])[0]


def cpu_per_round_trip(rounds: list, name: str) -> dict:
    """CPU microseconds per round trip of row ``name``, over every round: the answering process's (all of it, and
    its Python threads') and the caller's."""
    served = sum(r[name]["served"] for r in rounds)
    return {"server": sum(r[name]["server_cpu_s"] for r in rounds) / served * 1e6,
            "server_python": sum(r[name]["server_python_s"] for r in rounds) / served * 1e6,
            "caller": sum(r[name]["caller_cpu_s"] for r in rounds) / sum(r[name]["calls"] for r in rounds) * 1e6}


def report_round_trips(rt: dict, rec: Results, args) -> float:
    """Tables of the round trips and the connects; returns the median of the per-round ratios."""
    rounds = rt["rounds"]
    names = [n for n in LABELS if n in rounds[0]]
    p50 = {n: [median(r[n]["rt_us"]) for r in rounds] for n in names}
    ratios = {n: [x / f for x, f in zip(p50[n], p50["veth"])] for n in names}
    rows = []
    for n in names:
        pooled = [v for r in rounds for v in r[n]["rt_us"]]
        lo, mid, hi = percentiles(pooled, [10, 50, 90])
        s = spread(ratios[n])
        cpu = cpu_per_round_trip(rounds, n)
        rows.append([LABELS[n], mid, [lo, hi], len(pooled), s.median, [s.low, s.high], cpu["server"],
                     cpu["server_python"], cpu["caller"]])
    show(rec, f"Round trip: 28,224 B asked, 8 B answered ({len(rounds)} rounds of {args.n:,}, sequential)",
         ["row", "p50 us", "p10-p90 us", "round trips", "ratio to the veth floor", "ratio range over rounds",
          "answering CPU us", "of it in Python threads", "caller CPU us"], rows,
         note="p50 and p10-p90 pool every round's round trips; the ratio is a row's p50 over the veth floor's p50 of "
              "the same round (median and range over rounds). CPU us per round trip, over every round: user + system "
              "time of the answering process (the owner, or the floor's rank 0), the part of it spent by its threads "
              "that run Python (one at a time: they share the GIL), and the caller's.")
    show(rec, "Each round", ["round", "connect ms", *[f"{SHORT[n]} p50 us" for n in names],
                             "distributed / floor"],
         [[i + 1, r["connect_s"] * 1e3, *[p50[n][i] for n in names], ratios["distributed"][i]]
          for i, r in enumerate(rounds)])
    rec.plot("round_trip", "p50 round trip per round: the distributed endpoint beside the gloo pair floor",
             x=list(range(1, len(rounds) + 1)), series={LABELS[n]: p50[n] for n in names}, kind="line",
             xlabel="round", ylabel="p50 round trip (us)", floors=[LABELS[n] for n in names if "floor" in SHORT[n]])
    return spread(ratios["distributed"]).median


def report_connects(rt: dict, cap: dict, rec: Results) -> None:
    rows = []

    def row(what: str, seconds: list[float]) -> None:
        ms = [s * 1e3 for s in seconds]
        lo, mid, hi = percentiles(ms, [10, 50, 90])
        rows.append([what, mid, [lo, hi], len(ms)])

    row("first endpoint of a process (its entry to the relay, its gloo device)",
        [rt["first_connect_s"], cap["connect_s"][0]])
    row("a new endpoint between rounds (process already connected once)", [r["connect_s"] for r in rt["rounds"]])
    row("endpoints opened back to back, one process", cap["connect_s"][1:])
    if cap.get("burst"):
        b = cap["burst"]
        row(f"{b['n']} endpoints connecting at once, one process (each; all done after {b['wall_s']:.2f} s)",
            b["connect_s"])
    row("bare gloo pair: its store (no relay) and one pair", [rt["floor_connect_s"]])
    show(rec, "Connect: from the first submit until its request is sent (b to a across the veth)",
         ["what", "p50 ms", "p10-p90 ms", "n"], rows,
         note="A distributed endpoint connects on its first submit: a store connection through the relay (an HMAC "
              "challenge each way), its number and announcement, the owner's answer (polled), then two gloo pairs "
              "(one per direction), whose rendezvous goes through the store too. The bare pair's figure is its store "
              "connection, one pair and its first round trip.")


def _kinds(counts: dict) -> str:
    """``{name: count}`` as text, most first (counts per endpoint keep two digits; zeros are left out)."""
    return ", ".join(f"{k} {v:.2g}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if v)


def per_endpoint(cap: dict, side: str) -> dict:
    """What one more endpoint costs ``side`` (``server`` or ``caller``): the slope between the two largest counts."""
    (n0, s0), (n1, s1) = list(zip(cap["counts"], cap[side]))[-2:]
    d = n1 - n0
    out = {k: (s1[k] - s0[k]) / d for k in ("threads", "fds", "sockets", "rss_kib", "pss_kib")}
    kinds = set(s0["python_threads"]) | set(s1["python_threads"])
    out["python_threads"] = {k: (s1["python_threads"].get(k, 0) - s0["python_threads"].get(k, 0)) / d for k in kinds}
    out["python_threads_total"] = sum(out["python_threads"].values())
    kinds = set(s0["native_threads"]) | set(s1["native_threads"])
    out["native_threads"] = {k: (s1["native_threads"].get(k, 0) - s0["native_threads"].get(k, 0)) / d for k in kinds}
    if side == "server":
        out["store_connections"] = (s1["store"]["connections"] - s0["store"]["connections"]) / d
        out["store_segs"] = (s1["store"]["data_segs_in"] - s0["store"]["data_segs_in"]) / d
        out["store_bytes"] = (s1["store"]["bytes_received"] - s0["store"]["bytes_received"]) / d
    out["span"] = (n0, n1)
    return out


def report_capacity(cap: dict, rec: Results) -> None:
    for side, title in (("server", "The owner on host a"), ("caller", "The caller on host b")):
        rows = []
        for n, s in zip(cap["counts"], cap[side]):
            store = [s["store"]["connections"], s["store"]["data_segs_in"]] if side == "server" else []
            rows.append([n, s["threads"], _kinds(s["python_threads"]), _kinds(s["native_threads"]), s["fds"],
                         s["sockets"], s["rss_kib"] / 1024, s["pss_kib"] / 1024, *store])
        e = per_endpoint(cap, side)
        rows.append([f"each endpoint ({e['span'][0]} to {e['span'][1]})", e["threads"], _kinds(e["python_threads"]),
                     _kinds(e["native_threads"]), e["fds"], e["sockets"], e["rss_kib"] / 1024, e["pss_kib"] / 1024,
                     *([e["store_connections"], e["store_segs"]] if side == "server" else [])])
        columns = ["endpoints", "threads", "Python threads by name", "native threads by name", "descriptors",
                   "sockets", "RSS MiB", "PSS MiB"]
        if side == "server":
            columns += ["store connections", "store data segments in"]
        show(rec, f"{title} by endpoints open (measured)", columns, rows,
             note="Python threads by name, digits dropped (bench-rx and bench-client-rx: an endpoint's receiving "
                  "thread; bench-up and bench-down: the relay's copying threads of one store connection; "
                  "rlsvc-entry-up and -down: this process's own entry to the relay, one store connection); native "
                  "threads by their kernel name (pt_gloo_runloop: a gloo group's worker; gloo_tcp_loop: a gloo "
                  "device's event loop; pt_tcpstore_uv: the store's). Store data segments: TCP segments carrying "
                  "data into the store over the connections open at that moment (ss -ti), about one per store request.")
    rec.plot("owner", "The owner's threads and descriptors against the endpoints open", x=cap["counts"],
             series={"threads": [s["threads"] for s in cap["server"]], "descriptors": [s["fds"] for s in cap["server"]],
                     "store connections": [s["store"]["connections"] for s in cap["server"]]},
             kind="line", xlabel="endpoints open", ylabel="count")
    before, after = cap["idle"]["before"]["store"], cap["idle"]["after"]["store"]
    seconds = cap["idle"]["seconds"]
    say(rec.note, f"Idle, {cap['counts'][-1]} endpoints open, {seconds:.1f} s: the store received "
        f"{(after['data_segs_in'] - before['data_segs_in']) / seconds:.0f} data segments/s "
        f"({(after['bytes_received'] - before['bytes_received']) / seconds:.0f} B/s) over "
        f"{after['connections']} connections: the owner polling for the next announcement")


def report_fleet(cap: dict, rt: dict, rec: Results) -> list:
    """Measured per-endpoint costs times `FLEET` (extrapolated): one owner with every collector's endpoint."""
    collectors, machines = FLEET
    base, s = cap["server"][0], per_endpoint(cap, "server")
    cbase, one = cap["caller"][0], cap["caller"][1]  # a caller process with one endpoint: one collector's process
    cpu = cpu_per_round_trip(rt["rounds"], "distributed")
    rows = [
        ["threads", base["threads"] + collectors * s["threads"], one["threads"] - cbase["threads"],
         f"{s['threads']:.1f} per endpoint on the owner ({s['python_threads_total']:.0f} of them Python's)"],
        ["descriptors", base["fds"] + collectors * s["fds"], one["fds"] - cbase["fds"],
         f"{s['fds']:.1f} per endpoint: the owner's ulimit -n must be above it"],
        ["resident memory MiB", (base["rss_kib"] + collectors * s["rss_kib"]) / 1024,
         (one["rss_kib"] - cbase["rss_kib"]) / 1024, f"{s['rss_kib']:.0f} KiB per endpoint"],
        ["store connections", base["store"]["connections"] + collectors * s["store_connections"], None,
         f"{s['store_connections']:.1f} per endpoint, each through the relay (2 threads)"],
        ["store requests to connect them all", collectors * s["store_segs"], None,
         f"{s['store_segs']:.0f} data segments into the store per connect"],
    ]
    if cap.get("burst"):
        b = cap["burst"]
        rows.append(["seconds until all are connected, starting together", b["wall_s"] / b["n"] * collectors, None,
                     f"{b['n']} at once took {b['wall_s']:.2f} s: linear in their number"])
    rows += [
        ["owner CPU s per request from each (1,000 requests)", collectors * cpu["server"] / 1e6, None,
         f"{cpu['server']:.0f} us per round trip: serving loop and wire, no policy"],
        ["requests/s before the owner's Python threads fill one core", 1e6 / cpu["server_python"], None,
         f"{cpu['server_python']:.0f} us of Python per round trip; they share one GIL"],
    ]
    show(rec, f"{collectors:,} collectors on {machines} hosts, one owner (extrapolated from the tables above)",
         ["what", "owner", "added to a collector's process", "from"], rows,
         note="Extrapolated linearly: the owner's figure with no endpoint plus the measured cost of each endpoint "
              "(between the last two counts) times the collectors; a collector's figure is what its process gained "
              "with its first endpoint. Nothing here was measured with 1,000 endpoints; the CPU rows are one request "
              "at a time, so batching across collectors (the policy's forward) is not in them.")
    return rows


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 rounds of 200 round trips (under a minute)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 15; --quick 5)")
    parser.add_argument("--n", type=int, default=None, help="round trips per block (default 1000; --quick 200)")
    parser.add_argument("--warmup", type=int, default=20, help="round trips before each block's (default 20)")
    parser.add_argument("--endpoints", type=int, nargs="+", default=[1, 8, 32],
                        help="endpoint counts the capacity part stops at (default 1 8 32)")
    parser.add_argument("--burst", type=int, default=32,
                        help="endpoints then connecting at once, from as many threads (default 32; 0: none)")
    parser.add_argument("--no-loopback", action="store_true", help="leave out the loopback pair")
    return parser


def _interrupted(signum, _frame):
    raise SystemExit(128 + signum)  # the finally below removes the hosts


def main() -> None:
    args = arguments().parse_args()
    args.rounds = args.rounds or (5 if args.quick else 15)
    args.n = args.n or (200 if args.quick else 1000)
    if sorted(set(args.endpoints)) != args.endpoints or args.endpoints[0] < 1 or len(args.endpoints) < 2:
        sys.exit("hosts.py: --endpoints takes at least two increasing counts, from 1")
    if os.geteuid() != 0:
        sys.exit("hosts.py: needs root: its hosts are network namespaces (ip netns add); run it as root, or skip it")
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupted)
    rec = Results("hosts")
    env = {**os.environ, "RLSVC_KEY": os.urandom(16).hex(), "PYTHONUNBUFFERED": "1"}
    peers: list[Peer] = []
    other = OtherLoad()
    try:
        hosts = hosts_up()
        print(f"hosts: a {hosts['a'][1]} ({hosts['a'][0]}), b {hosts['b'][1]} ({hosts['b'][0]})", flush=True)
        rt = round_trips(hosts, env, args, peers)
        cap = capacity(hosts, env, args.endpoints, args.burst, peers)
    except Unavailable as exc:
        sys.exit(f"hosts.py: no network namespaces here: {exc}")
    finally:  # what a failure or an interruption left running is killed, not asked: a floor waits for its caller
        for peer in peers:
            peer.stop(ask=False)
        hosts_down()
    other_cpu, wall = other.seconds()
    say(rec.note, f"Hosts as network namespaces on one machine ({os.cpu_count()} CPUs), set {SET}: the owner in "
        f"{hosts['a'][0]} ({hosts['a'][1]}), the caller in {hosts['b'][0]} ({hosts['b'][1]}); "
        f"{'quick' if args.quick else 'full'} run, {wall:.0f} s; other processes used {other_cpu:.0f} CPU s meanwhile",
        "# ")
    ratio = report_round_trips(rt, rec, args)
    report_connects(rt, cap, rec)
    report_capacity(cap, rec)
    report_fleet(cap, rt, rec)
    print()
    say(rec.verdict, f"{'PASS' if ratio <= TARGET else 'MISS'} distributed round trip across the veth: "
        f"{ratio:.2f}x the bare gloo pair's across the same veth (median of {len(rt['rounds'])} per-round ratios; "
        f"target <= {TARGET:.2f}x)")
    rec.save()


if __name__ == "__main__":
    main()
