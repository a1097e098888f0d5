"""Replay buffer extend and sample per placement and transport, beside the floors under them; medians.

For every replay cell built today (``direct/direct``, ``thread/thread``, ``process/queue``,
``process/shared_memory``, ``process/distributed``, ``ray/ray`` and ``ray/distributed``, in a local Ray cluster on
127.0.0.1 the script starts) and two transition layouts (observation float32 [4], or uint8 [84, 84, 4]; each
transition also carries an int64 ``action`` and a float32 ``reward``), a real
`components.replay.ReplayBuffer` (uniform sampler, batch size 256) is started and driven through
``owner.client()`` (a direct owner is its own client):

* ``extend`` of one pre-built batch of 256 transitions, repeated (p50 latency, transitions/s);
* ``sample(256)``, repeated (p50 and p95 latency, sampled transitions/s).

The floors, measured in the same run with the same layout and capacity:

* the ``direct`` row itself: the buffer's own ``sample`` with no transport at all;
* ``floor: torch gather``: preallocated storage tensors of the same layout and capacity, one
  ``torch.randint`` for 256 indices and ``torch.index_select`` of every leaf into new tensors;
* ``floor: Ray actor call returning 256 rows`` (with the ``ray/ray`` row): an actor call whose result is a
  prebuilt batch of the same layout, the least a Ray sample can cost.
* ``floor: gloo round trip of 256 rows`` (with the distributed rows): a standalone two-rank gloo group between
  this process and a child; an 8-byte request goes out and the bytes of a batch of the same layout come back.

``ratio`` is a row's sample p50 over the ``direct`` row's sample p50 at the same layout. For the process
rows at 84x84x4 the run also times the pieces a sample goes through (one command round trip with no
payload, the owner-side sample, the shared-memory staging copies or the pickling of the batch) so a miss
says where the time goes. Run from the repository root:

    python benchmarks/replay.py                          # everything (about a minute on 2 cores)
    python benchmarks/replay.py --quick                  # a fifth of the calls
    python benchmarks/replay.py --obs 84x84x4 --cells process/shared_memory direct/direct
    python benchmarks/replay.py --frames 100000          # also DQN-Atari storage: whole stacks or frame by frame

With ``--frames N`` the run adds DQN's Atari transitions (observation and next observation, uint8 [4, 84, 84]
stacks that shift by one frame a step, 8 envs, episodes of 100 steps) in a storage of ``N`` transitions, stored as
whole stacks and frame by frame (``components.replay.frames``), side by side: the bytes each holds against the
frames' own bytes (one 7,056-byte frame per transition), ``extend`` of 32 transitions (one collector batch of
8 envs x 4 steps) and ``sample(32)``, medians with their 25th-75th percentiles, every sample checked against the
stacks written.

Every owner is shut down before the script exits (also on error or Ctrl-C); the last line says whether any
``rlsvc_*`` shared-memory segment of this run's processes is left in ``/dev/shm``.

Target (PASS/MISS printed at the end): at 84x84x4, a process placement's sample p50 at most 2x the direct
buffer's sample p50; the report says which process transport meets it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import sys
import time

import numpy as np
import torch
from tensordict import TensorDict

from _harness import (  # first: the checkout on sys.path (benchmarks/_harness.py)
    interleaved, latency, percentiles, start_owner)
from _results import Results, say, show, with_floors
from components.replay import ReplayBuffer, ReplayConfig
from transports.segments import segments_of
from transports.queue.wire import from_wire, to_wire

BATCH = 256
# label -> (description, dtype, shape, capacity, (extend calls, sample calls) of a full run)
OBS = {
    "4f": ("observation float32 [4]", torch.float32, (4,), 100_000, (400, 2000)),
    "84x84x4": ("observation uint8 [84, 84, 4] (28,224 bytes)", torch.uint8, (84, 84, 4), 8192, (80, 300)),
}
CELLS = ["direct/direct", "thread/thread", "process/queue", "process/shared_memory", "process/distributed", "ray/ray",
         "ray/distributed"]
RAY_FLOOR = "floor: Ray actor call returning 256 rows"
GLOO_FLOOR = "floor: gloo round trip of 256 rows"
TARGET_OBS, TARGET_RATIO = "84x84x4", 2.0
BUDGET_S = 12.0  # most seconds one measurement may take (a full run stays bounded on a loaded machine)


def make_batch(obs: str, n: int = BATCH, seed: int = 0) -> TensorDict:
    _, dtype, shape, _, _ = OBS[obs]
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.uint8:
        observation = torch.randint(0, 256, (n, *shape), dtype=torch.uint8, generator=g)
    else:
        observation = torch.randn((n, *shape), generator=g)
    return TensorDict({
        "observation": observation,
        "action": torch.randint(0, 6, (n,), dtype=torch.int64, generator=g),
        "reward": torch.randn((n,), generator=g),
    }, batch_size=[n])


def calls(obs: str, quick: bool) -> tuple[int, int]:
    n_extend, n_sample = OBS[obs][4]
    div = 5 if quick else 1
    return max(10, n_extend // div), max(20, n_sample // div)


# ---------------------------------------------------------------------------------------------- floors
def gather_floor(obs: str):
    """The floor: randint + index_select of 256 rows of every leaf of preallocated storage into new tensors."""
    capacity = OBS[obs][3]
    storage = {k: v.clone() for k, v in make_batch(obs, capacity, seed=1).items()}

    def call():
        index = torch.randint(capacity, (BATCH,))
        return {k: torch.index_select(t, 0, index) for k, t in storage.items()}
    return call


class _BatchActor:
    """The Ray floor: an actor that returns a prebuilt batch of 256 transitions (no sampling at all)."""

    def __init__(self, batch):
        self.batch = batch

    def get(self):
        return self.batch


def ray_floor(obs: str, stack: contextlib.ExitStack):
    from transports.ray import import_ray

    ray = import_ray()
    actor = ray.remote(_BatchActor).options(num_cpus=0).remote(make_batch(obs))
    stack.callback(ray.kill, actor)
    return lambda: ray.get(actor.get.remote())


def _gloo_echo(address, nbytes: int) -> None:
    """The gloo floor's other rank: answers each 8-byte request with ``nbytes`` bytes until told 0."""
    from transports.distributed.gloo import connect_store, pair

    torch.set_num_threads(1)
    store = connect_store(*address, 60, "gloo floor")
    pg = pair(store, "floor/", 0, address[0])
    request, payload = torch.zeros(1, dtype=torch.int64), torch.ones(nbytes, dtype=torch.uint8)
    while True:
        pg.recv([request], 1, 0).wait()
        if int(request) == 0:
            return
        pg.send([payload], 1, 0).wait()


def gloo_floor(obs: str, stack: contextlib.ExitStack):
    import multiprocessing as mp

    from transports.distributed.gloo import connect_store, open_store, pair

    nbytes = sum(t.numel() * t.element_size() for t in make_batch(obs).values())
    store, port, _ = open_store("127.0.0.1", 0, 60)  # no relay on loopback
    child = mp.get_context("spawn").Process(target=_gloo_echo, args=(("127.0.0.1", port), nbytes), daemon=True)
    child.start()
    pg = pair(connect_store("127.0.0.1", port, 60, "gloo floor"), "floor/", 1, "127.0.0.1")
    one, out = torch.ones(1, dtype=torch.int64), torch.empty(nbytes, dtype=torch.uint8)

    def stop():
        pg.send([torch.zeros(1, dtype=torch.int64)], 0, 0).wait()
        child.join(10)
        held.clear()  # the store stops listening
    held = [store]
    stack.callback(stop)

    def call():
        pg.send([one], 0, 0).wait()
        pg.recv([out], 0, 0).wait()
    return call


def breakdown(client, transport: str, obs: str, quick: bool) -> list[tuple[str, float]]:
    """Where a process sample's time goes: each piece's p50 (us), measured in this process or through
    ``client``, interleaved with the process sample itself (the last entry)."""
    n = max(20, calls(obs, quick)[1] // 2)
    direct = ReplayBuffer(ReplayConfig(capacity=OBS[obs][3], batch_size=BATCH, placement="direct"), transport="direct",
                          seed=0).start()
    try:
        batch = make_batch(obs)
        for _ in range(OBS[obs][3] // BATCH):
            direct.extend(batch)
        sample = direct.sample(BATCH)
        pieces = {
            "command round trip with no payload (len(client))": lambda: len(client),
            "owner: ReplayBuffer.sample, run here (TensorDict index + clone)": lambda: direct.sample(BATCH),
        }
        if transport == "shared_memory":
            # the owner answers with indices; the client gathers rows from the shared storage itself
            pieces["owner: draw indices + generations, and their reply"] = lambda: client._call("_sample_indices", BATCH)
            client.sample(BATCH)  # attaches the client to the owner's shared storage
            storage = client._storage[0]

            def gather():
                index = torch.randint(len(client), (BATCH,))
                return storage.slots.apply(lambda leaf: torch.index_select(leaf, 0, index), batch_size=[BATCH])
            pieces["client: gather 256 rows from shared storage"] = gather
        else:
            blob = pickle.dumps((0, 0, to_wire(sample)), protocol=pickle.HIGHEST_PROTOCOL)
            pieces[f"owner: to_wire + pickle.dumps of the reply ({len(blob) / 1e6:.1f} MB)"] = \
                lambda: pickle.dumps((0, 0, to_wire(sample)), protocol=pickle.HIGHEST_PROTOCOL)
            pieces["client: pickle.loads + from_wire"] = lambda: from_wire(pickle.loads(blob)[2])
        pieces["TOTAL"] = lambda: client.sample(BATCH)
        measured = interleaved(pieces, 3, n, budget=6.0)
    finally:
        direct.shutdown()
    return [(name, float(np.median(lat))) for name, (lat, _) in measured.items()]


# ---------------------------------------------------------------------------------------------- cells
def run_obs(obs: str, cells, quick: bool, pids: set, results: dict, breakdowns: dict) -> None:
    """Start every cell's owner for ``obs``, then measure extend and sample of all of them interleaved."""
    n_extend, n_sample = calls(obs, quick)
    batch = make_batch(obs)
    with contextlib.ExitStack() as stack:
        clients = {}
        for cell in cells:
            placement, transport = cell.split("/")
            owner = ReplayBuffer(ReplayConfig(capacity=OBS[obs][3], batch_size=BATCH, placement=placement),
                                 transport=transport, seed=0)
            stack.callback(owner.shutdown)
            took = start_owner(owner, pids)
            clients[cell] = owner.client()
            print(f"  started {cell:<22} {obs:>8} in {took:.1f} s", file=sys.stderr, flush=True)
        ext = interleaved({cell: (lambda c=c: c.extend(batch)) for cell, c in clients.items()},
                          max(2, n_extend // 10), n_extend, budget=BUDGET_S)
        for cell, c in clients.items():
            assert c.sample(BATCH)["observation"].shape == (BATCH, *OBS[obs][2])
        rows = {"floor: torch gather": gather_floor(obs)}
        if "ray/ray" in clients:
            rows[RAY_FLOOR] = ray_floor(obs, stack)
        if any(cell.endswith("/distributed") for cell in clients):
            rows[GLOO_FLOOR] = gloo_floor(obs, stack)
        rows.update({cell: (lambda c=c: c.sample(BATCH)) for cell, c in clients.items()})
        smp = interleaved(rows, max(3, n_sample // 10), n_sample, budget=BUDGET_S)
        for name in rows:
            results[(name, obs)] = {"sample": latency(*smp[name], BATCH)}
            if name in ext:
                results[(name, obs)]["extend"] = latency(*ext[name], BATCH)
            r = results[(name, obs)]
            print(f"  measured {name:<22} {obs:>8}  sample p50 {r['sample']['p50']:9.1f} us", file=sys.stderr, flush=True)
        if obs == TARGET_OBS:
            for cell, c in clients.items():
                if cell in ("process/queue", "process/shared_memory"):
                    breakdowns[(cell, obs)] = breakdown(c, cell.split("/")[1], obs, quick)
        clients.clear()


# ---------------------------------------------------------------------------------------------- report
COLUMNS = ["placement/transport", "extend p50 us", "extend transitions/s", "sample p50 us", "sample p95 us",
           "sampled transitions/s", "sample p50 / direct"]
FLOORS = ["floor: torch gather", RAY_FLOOR, GLOO_FLOOR]  # the rows before the cells'


def report(results: dict, breakdowns: dict, obs_list, cells, rec: Results) -> None:
    """The tables and the target, printed and recorded in ``rec``."""
    for obs in obs_list:
        title = f"{obs}: {OBS[obs][0]} + action int64 + reward float32; batch {BATCH}; capacity {OBS[obs][3]}"
        print(f"\n### {title}\n")
        print(f"| {' | '.join(COLUMNS)} |")
        print("|---|---|---|---|---|---|---|")
        direct = results.get(("direct/direct", obs))
        base = direct["sample"]["p50"] if direct else None
        rows = []
        for cell in [*FLOORS, *cells]:
            r = results.get((cell, obs))
            if r is None:
                continue
            e = r.get("extend")
            s = r["sample"]
            ext = f"{e['p50']:.1f} | {e['rate']:,.0f}" if e else "- | -"
            ratio = f"{s['p50'] / base:.2f}" if base else "-"
            print(f"| {cell} | {ext} | {s['p50']:.1f} | {s['p95']:.1f} | {s['rate']:,.0f} | {ratio} |")
            rows.append([cell, e and e["p50"], e and e["rate"], s["p50"], s["p95"], s["rate"],
                         s["p50"] / base if base else None])
        rec.table(title, COLUMNS, rows)
    if breakdowns:
        title = (f"Where a process sample's time goes ({TARGET_OBS}; pieces timed separately, interleaved with the "
                 "process sample itself)")
        print(f"\n### {title}\n")
        print("| row | piece | p50 us |")
        print("|---|---|---|")
        rows = []
        for (cell, obs), parts in breakdowns.items():
            total = dict(parts)["TOTAL"]
            pieces = [(k, v) for k, v in parts if k != "TOTAL"]
            rest = ("rest (pipe transfer, scheduling, waits): the process sample minus the pieces",
                    total - sum(v for _, v in pieces))
            for name, value in [*pieces, rest]:
                print(f"| {cell} | {name} | {value:.1f} |")
                rows.append([cell, name, value])
            print(f"| {cell} | **process sample(256) in this window** | **{total:.1f}** |")
            rows.append([cell, "**process sample(256) in this window**", total])
        rec.table(title, ["row", "piece", "p50 us"], rows)

    print(f"\n### Target ({TARGET_OBS}: process sample p50 at most {TARGET_RATIO:.0f}x the direct buffer's sample p50)\n")
    direct = results.get(("direct/direct", TARGET_OBS))
    meets = []
    for cell in [c for c in cells if c.startswith("process/")]:
        r = results.get((cell, TARGET_OBS))
        if r is None or direct is None:
            say(rec.verdict, f"{cell}: not measured in this run")
            continue
        ratio = r["sample"]["p50"] / direct["sample"]["p50"]
        ok = ratio <= TARGET_RATIO
        if ok:
            meets.append(cell)
        say(rec.verdict, f"{'PASS' if ok else 'MISS'} {cell}: sample p50 {r['sample']['p50']:.1f} us = {ratio:.2f}x "
            f"direct ({direct['sample']['p50']:.1f} us); target <= {TARGET_RATIO:.2f}x")
    say(rec.verdict, f"process transports meeting the target: {', '.join(meets) if meets else 'none'}")


def record_plot(rec: Results, obs_list) -> None:
    """Sample p50 (ms) per row of the layouts' tables (the first ``len(obs_list)`` recorded), a series per layout;
    the floor rows (the direct buffer's own sample among them) dashed."""
    by_obs = {obs: {row[0]: row[3] / 1000 for row in table["rows"]} for obs, table in zip(obs_list, rec.tables)}
    x = list(dict.fromkeys(label for rows in by_obs.values() for label in rows))
    series, floors = with_floors(x, {obs: [rows.get(label) for label in x] for obs, rows in by_obs.items()},
                                 lambda label: label in FLOORS or label == "direct/direct")  # direct: a floor too
    rec.plot("sample", f"sample({BATCH}) p50 per row, a bar per observation layout (floors dashed)", x=x,
             series=series, kind="bar", xlabel="row", ylabel="sample p50 (ms)", log=True, floors=floors)


def frame_stacks(capacity: int, quick: bool, rec: Results) -> None:
    """DQN-Atari transitions in a storage of ``capacity``: whole stacks beside frame by frame."""
    from components.replay.storage import ReplayStorage

    envs, steps, episode, frame = 8, 4, 100, 84 * 84
    rows = []
    for label, keys in (("whole stacks", []), ("frame by frame", ["observation", "next.observation"])):
        store = ReplayStorage(capacity=capacity, sampler="uniform", batch_size=32, frames=keys, seed=0)
        g = torch.Generator().manual_seed(0)
        stack = torch.randint(0, 256, (envs, 5, 84, 84), dtype=torch.uint8, generator=g)
        written, extend, t = 0, [], 0
        target = capacity + capacity // (10 if quick else 5)  # fill, then wrap
        while written < target:
            parts = []
            for _ in range(steps):
                t += 1
                new = torch.randint(0, 256, (envs, 1, 84, 84), dtype=torch.uint8, generator=g)
                stack = torch.cat([stack[:, 1:], new], 1) if t % episode else new.expand(envs, 5, 84, 84).clone()
                parts.append(TensorDict({"observation": stack[:, :4].clone(), "next": {"observation": stack[:, 1:].clone()},
                                         "action": torch.zeros(envs, dtype=torch.long), "reward": torch.zeros(envs)}, [envs]))
            batch = torch.cat(parts)
            start = time.perf_counter()
            store.extend(batch)
            extend.append(time.perf_counter() - start)
            written += len(batch)
        sample = []
        for _ in range(60 if quick else 300):
            start = time.perf_counter()
            out = store.sample(32)
            sample.append(time.perf_counter() - start)
        # a sampled next observation is its observation shifted by one frame (the stream above), except at a reset
        shifted = (out["observation"][:, 1:] == out["next", "observation"][:, :3]).flatten(1).all(1)
        assert bool(shifted.float().mean() > 0.5), "frame-by-frame storage returned stacks that were never written"
        held = store.nbytes
        ext, smp = (percentiles(np.asarray(seconds) * 1e3, (25, 50, 75)) for seconds in (extend, sample))
        rows.append([label, round(held / 2**30, 3), round(held / (capacity * frame), 2), round(ext[1], 2),
                     f"{ext[0]:.2f}-{ext[2]:.2f}", round(smp[1], 2), f"{smp[0]:.2f}-{smp[2]:.2f}", store.stale_frames])
        store.close()
        del store
    title = (f"DQN-Atari transitions, capacity {capacity:,}: observation and next observation uint8 [4, 84, 84]")
    columns = ["storage", "GiB held", "x frames' bytes", "extend(32) p50 ms", "p25-p75", "sample(32) p50 ms",
               "p25-p75", "stale rows"]
    show(rec, title, columns, rows)


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a fifth of the calls")
    parser.add_argument("--obs", nargs="+", default=list(OBS), choices=list(OBS))
    parser.add_argument("--cells", nargs="+", default=CELLS, choices=CELLS)
    parser.add_argument("--frames", type=int, default=0, metavar="N",
                        help="also DQN-Atari storage of N transitions, whole stacks beside frame by frame")
    return parser


def main() -> None:
    args = arguments().parse_args()
    rec = Results("replay")
    torch.set_num_threads(1)
    cells = [c for c in CELLS if c in args.cells]

    results: dict = {}
    breakdowns: dict = {}
    pids = {os.getpid()}
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        if any(cell.startswith("ray/") for cell in cells):  # a local cluster on 127.0.0.1 for the ray rows
            from components.hosts.ray import RayClusterConfig, ray_cluster

            stack.enter_context(ray_cluster(RayClusterConfig(temp_dir=f"/tmp/rb{os.getpid()}")))
        for obs in args.obs:
            run_obs(obs, cells, args.quick, pids, results, breakdowns)

    say(rec.note, f"Replay buffer extend and sample (median over calls; {os.cpu_count()} CPUs; torch "
        f"{torch.__version__}; {'quick' if args.quick else 'full'} run, {time.monotonic() - started:.0f} s)", "# ")
    say(rec.note, "Each row drives a started ReplayBuffer through owner.client(); extend writes 256 transitions, "
        "sample returns 256. `floor: torch gather` is randint + index_select of every leaf from preallocated tensors; "
        "the `direct/direct` row is the buffer's own sample. ratio = sample p50 / direct sample p50.", "\n")
    report(results, breakdowns, args.obs, cells, rec)
    left = segments_of(pids)
    say(rec.note, f"cleanup: every owner shut down; {len(left)} rlsvc segment(s) of this run left in /dev/shm"
        + (f": {', '.join(left)}" if left else ""), "\n")
    record_plot(rec, args.obs)
    if args.frames:
        frame_stacks(args.frames, args.quick, rec)
    rec.save()


if __name__ == "__main__":
    main()
