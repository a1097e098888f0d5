"""Collection frames/s with no learning: the project's collectors beside a raw gymnasium loop; medians of rounds.

What is measured: environment frames collected per second of wall time on CartPole-v1, nothing learned, for

* the floors, single-process loops in this script: ``gymnasium.make_vec("CartPole-v1", num_envs=N,
  vectorization_mode="sync")`` (and ``"async"``: one subprocess per env), with same-step autoreset as the
  collectors' envs (`components.envs.make_vector_env`), stepped with the PPO recipe's actor network (4-64-64-2
  MLP, tanh; ``recipes.ppo.make_policy``) that samples an action from its ``Categorical`` under ``torch.no_grad()``;
  observations go to torch and actions back to numpy, nothing else is kept;
* `components.collectors.Collector` (batches of ``N x 32`` frames, PPO's ``num_steps``) placed

  - ``direct``, given a ``direct`` `InferenceServer` (what ``python -m launcher
    +recipe=ppo service=direct`` builds: the worker calls the server's forward in the caller's thread); beside it
    ``direct`` with the bare policy module behind ``torch.no_grad()`` and no server, which shows what the server
    path adds;
  - ``thread`` with a ``thread`` server over the ``thread`` transport, 1 and 2 workers;
  - ``process`` with a ``process`` server over ``queue``, ``shared_memory`` and ``process_slot``, 1 and 2 workers;

  - ``process`` with 2 workers each running its own copy of the policy (``PolicyReplica``, what
    ``components.collector.local_policy=true`` runs: no server, no request leaves the worker);

  each iterated with ``sync=True`` (every batch gathers one rollout from every worker) and ``sync=False`` (each
  worker's rollout as soon as it is ready; the workers collect the next one meanwhile);
* `components.collectors.AsyncBatchedCollector` with its workers placed ``thread`` and ``process``
  (``CollectorConfig.placement``; its default workers: one per core but one, here 1; N env groups of one env each,
  one policy request per env in flight, or with ``2 groups`` two groups of N/2 envs; against the server it creates
  beside them: ``thread`` transport, or ``process_slot`` by the table's ``auto`` rule), yielding flat batches of N x 32
  transitions.

Every server and the raw loops run the same policy: ``recipes.ppo.make_policy(PPOConfig(), spec)`` built from the
same seed, so every row carries identical weights (the collectors also send PPO's per-env sampling seeds, which the
policy turns into its draws; the raw loop uses ``Categorical.sample()``). Total env counts 16 and 64 (``--envs``); 2
workers split them (2 x 8, 2 x 32). ``torch.set_num_threads(1)`` here; the collectors' children are the project's own.

How: a row starts its owners (seconds reported as ``start s``, not counted in frames/s), takes a warm-up (2
iterations; ``--quick``: 1), then iterates until it has ``max(16 x N x 32, 16,384)`` frames (every row alike, whatever
one iteration yields: a ``sync=False`` iteration is one worker's rollout), so 16,384 frames at 16 envs and 32,768 at
64 with ``--quick`` and four times that in a full run, or until its time cap (4 s; ``--quick``: 1 s); then it shuts
everything down. frames/s is frames over the measured seconds (from the end of the warm-up to the arrival of the
last batch). The time cap bounds the slow rows (the AsyncBatchedCollector with one request per env, the 2-worker
rows at 16 envs): a capped row is marked ``*`` and
measured on fewer frames. Before the rounds, the forkserver that ``process`` children come from is started
(``prepare()``, as the launcher does) and the raw loop runs once per env count, discarded. Then ``--rounds`` rounds
(5; ``--quick``: 3): each runs every row at every env count, starting ``rows / rounds`` places further down the list
than the round before, so a drift of the machine (this VM's cores doze and wake) hits all rows alike and no row
always follows the same one. The table gives the median over rounds, the min-max, and the ratio of medians to the
raw sync loop at the same total env count measured in the same run. After each row, the processes it started
(server, workers, env subprocesses) must be gone within 5 s: a survivor is reported at the end, with any
shared-memory segment left. A row that raises is reported as failed and the others go on. The report also says how
much CPU other processes on the machine used meanwhile (someone's test run beside a benchmark halves its figures).

Run from the repository root (on an idle 2-core machine: ``--quick`` about 2.5 minutes, a full run about 12):

    python benchmarks/collect.py --quick
    python benchmarks/collect.py --envs 16 --rows raw direct process_slot --rounds 3
    python benchmarks/collect.py --quick --peer-python /tmp/trl/bin/python
    python benchmarks/collect.py --quick --backend vector     # or envpool: see below

``--backend vector|envpool`` makes every collector row's envs on that ``env.backend`` (CartPole's numpy
``CartPoleVectorEnv``, or EnvPool; `components.envs.backends`, both adapted to same-step autoreset) and adds
``raw vector`` / ``raw envpool``: the same policy loop over that backend natively (its own next-step autoreset),
which is then the base of the ratios and of the targets; the raw gymnasium sync loop stays as a row.

``--env atari`` collects ``ALE/Breakout-v5`` frames instead (``env=atari``'s DeepMind preprocessing, 4x84x84 uint8
stacks) with the PPO recipe's Nature CNN as the policy, at 8 and 16 envs; its raw loops step gymnasium's own
``SyncVectorEnv`` / ``AsyncVectorEnv`` over the same wrappers (``components.envs.EnvMaker`` with ``atari`` set).
Rows measure a quarter of the frames with five times the time cap, and the run is recorded as ``collect_atari``:

    python benchmarks/collect.py --env atari --rows "Collector direct" "x2 sync=False [process/shared_memory]" replica

``--rows`` keeps the rows whose label contains one of the given substrings (the raw sync loop always runs: it is
the base of the ratios).

Targets (PASS/MISS printed at the end, each on ratios of medians at the same total env count):

* ``Collector direct`` (with the direct server, as PPO's ``service=direct``) at least 0.9x the raw sync loop, at
  16 and at 64 envs;
* a ``process`` Collector with 2 workers at least 1.3x the raw sync loop (the best of its transports and
  ``sync`` settings; every one is in the table);
* ``AsyncBatchedCollector`` with its workers placed ``process`` at least 0.8x the raw sync loop.

TorchRL beside ours: ``--peer-python PATH`` names the python of a separate environment with torchrl 0.14.1 (it needs
tensordict<0.15, so it cannot share this project's). After our rows, this script runs
``PATH benchmarks/torchrl_collect_peer.py`` with the same env counts, rounds, frame budgets and policy weights (saved
to a temporary file): TorchRL's ``MultiSyncCollector`` and ``MultiAsyncCollector`` with 2 workers of N/2 envs, and a
raw sync loop in that interpreter, printed after our rows in the same tables, against our raw sync loop. Its workers
step a gymnasium ``SyncVectorEnv`` with same-step autoreset through ``GymWrapper`` (TorchRL refuses next-step
autoreset), or a ``SerialEnv`` of ``GymEnv`` where that fails; the report names which. To make that environment:

    python -m venv /tmp/trl && /tmp/trl/bin/pip install torch==2.13.0 && /tmp/trl/bin/pip install torchrl==0.14.1
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym
import torch

from _harness import HERE, OtherLoad, peer_json, spread  # first: the checkout on sys.path (benchmarks/_harness.py)
from _results import Results, say, with_floors
from components.collectors import AsyncBatchedCollector, Collector, CollectorConfig
from components.envs.families.atari import AtariConfig
from components.envs import EnvMaker
from components.hosts import host_class
from components.inference import InferenceServer, InferenceServerConfig, PolicyReplica
from recipes.configs import PPOConfig
from transports.layout import Layout
from transports.segments import segments_of

ENV_ID = "CartPole-v1"
ATARI: AtariConfig | None = None  # --env atari: ALE/Breakout-v5 with the DeepMind preprocessing (env=atari)
ENVS = {"cartpole": ("CartPole-v1", None, [16, 64]), "atari": ("ALE/Breakout-v5", AtariConfig(), [8, 16])}
"""--env: the env id, its preprocessing, the default total env counts."""
NUM_STEPS = PPOConfig().num_steps  # steps per env in one Collector batch, as the PPO recipe collects them
POLICY_SEED = 0
MIN_BATCHES, MIN_FRAMES = 16, 16_384  # a --quick row measures max(16 x N x 32, 16,384) frames; a full one 4x
PEER_TIMEOUT = 1800  # seconds for the whole TorchRL run
TARGET_DIRECT, TARGET_PROCESS2, TARGET_BATCHED = 0.9, 1.3, 0.8
BACKEND = "gymnasium"  # env.backend of every collector row (--backend); its raw loop is the base of the ratios


# ---------------------------------------------------------------------------------------------- the policy
def env_maker() -> EnvMaker:
    """The collectors' envs: `ENV_ID` (preprocessed as `ATARI` says) on `BACKEND`."""
    return EnvMaker(id=ENV_ID, backend=BACKEND, atari=ATARI)


_SPECS: dict = {}


def env_spec(env_id: str, atari: AtariConfig | None):
    """The env's `EnvSpec`, read once per process."""
    key = (env_id, repr(atari))
    if key not in _SPECS:
        _SPECS[key] = EnvMaker(id=env_id, atari=atari).spec()
    return _SPECS[key]


def build_policy(env_id: str, atari: AtariConfig | None) -> torch.nn.Module:
    """The PPO recipe's behaviour policy for the env (the MLP for CartPole, the Nature CNN for Atari frames), built
    from `POLICY_SEED` (same weights everywhere)."""
    from recipes.ppo import make_policy as ppo_policy

    with torch.random.fork_rng():  # the caller's random stream stays as it was
        torch.manual_seed(POLICY_SEED)
        return ppo_policy(PPOConfig(), env_spec(env_id, atari))


def policy_factory() -> Callable[[], torch.nn.Module]:
    """`build_policy` for this run's env, picklable: process servers and workers build it where they live
    (they import this module afresh, without the run's settings, so the factory carries them)."""
    return functools.partial(build_policy, ENV_ID, ATARI)


def make_policy() -> torch.nn.Module:
    return policy_factory()()


class NoGradPolicy:
    """The bare policy module as a Collector policy: called under ``torch.no_grad()``, no server."""

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def __call__(self, td):
        with torch.no_grad():
            return self.module(td)


def layouts(envs_per_worker: int) -> tuple[Layout, Layout]:
    """Request and response layouts of one worker's policy call (as launcher/plan.py derives them)."""
    request = env_spec(ENV_ID, ATARI).request_layout(envs_per_worker)
    with torch.no_grad():
        out = make_policy()(request.zeros())
    out.set("policy_version", torch.zeros(out.batch_size, dtype=torch.long))
    return request, Layout.from_tensordict(out.exclude(*request.keys))


# ---------------------------------------------------------------------------------------------- rows
@dataclass(frozen=True)
class Row:
    label: str
    kind: str  # "raw", "collector" or "batched"
    mode: str = ""  # raw: the vectorization mode
    placement: str = ""  # the Collector's placement, or the AsyncBatchedCollector's workers' placement
    workers: int = 1
    sync: bool = True
    server: tuple[str, str | None] = ("", None)  # the inference server's placement and transport
    bare: bool = False  # no server: the policy module itself (direct), a replica in each worker (process)
    groups: int = 1  # env groups per worker (2: double buffering)

    def envs_label(self, n: int) -> str:
        per = n // self.workers
        inner = f"2x{per // 2}" if self.groups == 2 else str(per)
        return f"{self.workers}x{inner}" if self.workers > 1 else (f"({inner})" if self.groups == 2 else str(n))


RAW_SYNC = Row("raw gymnasium sync", "raw", mode="sync")


def base_row() -> Row:
    """The raw loop of `BACKEND`: the base of the ratios."""
    return RAW_SYNC if BACKEND == "gymnasium" else Row(f"raw {BACKEND}", "raw", mode=BACKEND)


def env_factory(num_envs: int) -> Callable[[], Any]:
    """What a collector row's workers make their envs with: ``num_envs`` of `env_maker`'s envs."""
    return functools.partial(env_maker().vector, num_envs)


def all_rows() -> list[Row]:
    rows = [base_row()] + ([RAW_SYNC] if BACKEND != "gymnasium" else []) + [
            Row("raw gymnasium async", "raw", mode="async"),
            Row("Collector direct [direct server]", "collector", placement="direct", server=("direct", None)),
            Row("Collector direct [policy module, no server]", "collector", placement="direct", bare=True),
            Row("Collector process x2 sync=True [policy replica in each worker]", "collector", placement="process",
                workers=2, bare=True),
            Row("Collector process x2 sync=False [policy replica in each worker]", "collector", placement="process",
                workers=2, sync=False, bare=True)]
    servers = [("thread", ("thread", "thread"))] + [("process", ("process", t))
                                                     for t in ("queue", "shared_memory", "process_slot")]
    for placement, server in servers:
        for workers in (1, 2):
            for sync in (True, False):
                for groups in (1, 2):
                    tag = " groups=2" if groups == 2 else ""
                    rows.append(Row(f"Collector {placement} x{workers} sync={sync}{tag} [{server[0]}/{server[1]}]",
                                    "collector", placement=placement, workers=workers, sync=sync, server=server,
                                    groups=groups))
    rows += [Row("AsyncBatchedCollector thread [thread/thread]", "batched", placement="thread"),
             Row("AsyncBatchedCollector process [process/process_slot]", "batched", placement="process"),
             Row("AsyncBatchedCollector process 2 groups [process/process_slot]", "batched", placement="process",
                 groups=2)]
    return rows


@dataclass(frozen=True)
class Budget:
    warmup: int  # batches before the clock starts
    scale: float  # of MIN_BATCHES and MIN_FRAMES
    cap_s: float  # most seconds of measuring per row

    def frames(self, frames_per_batch: int) -> int:
        batches = max(MIN_BATCHES * self.scale, MIN_FRAMES * self.scale / frames_per_batch)
        return int(round(batches)) * frames_per_batch


@dataclass
class Measurement:
    fps: float
    frames: int
    seconds: float
    capped: bool
    start_s: float


def drive(next_batch: Callable[[], int], target: int, budget: Budget) -> tuple[int, float, bool]:
    """Warm up, then take whole batches (``next_batch`` returns the frames it got) until ``target`` frames or the
    time cap; (frames, seconds, capped)."""
    warm_until = time.perf_counter() + budget.cap_s
    for _ in range(budget.warmup):
        next_batch()
        if time.perf_counter() > warm_until:
            break
    frames, t0 = 0, time.perf_counter()
    while frames < target:
        frames += next_batch()
        if time.perf_counter() - t0 >= budget.cap_s:
            break
    return frames, time.perf_counter() - t0, frames < target


class Tracker:
    """Pids of the processes rows started; after each row they must be gone (see `check`)."""

    def __init__(self):
        self.pids: set[int] = set()
        self.survivors: list[str] = []

    def owners(self, *owners: Any) -> None:
        for owner in owners:
            hosts = list(owner.all_hosts()) + list(getattr(owner, "hosts", []))  # AsyncBatchedCollector: .hosts
            own_server = getattr(owner, "_own_server", None)  # ... and the server it made (not in all_hosts)
            if own_server is not None:
                hosts += own_server.all_hosts()
            self.pids.update(h.pid for h in hosts if not h.same_process and h.pid is not None)

    def check(self, label: str, pids: set[int]) -> None:
        deadline = time.monotonic() + 5.0
        alive = [p for p in pids if _alive(p)]
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [p for p in alive if _alive(p)]
        self.survivors += [f"{label}: pid {p}" for p in alive]


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def measure(row: Row, n: int, budget: Budget, tracker: Tracker) -> Measurement:
    """One round of ``row`` at ``n`` total envs: start, warm up, measure, shut down (also on error)."""
    torch.set_num_threads(1)
    if row.kind == "raw":
        return _measure_raw(row, n, budget, tracker)
    before = set(tracker.pids)
    try:
        with contextlib.ExitStack() as stack:  # owners shut down in reverse: the collector before its server
            t0 = time.perf_counter()
            owner = start_owners(row, n, stack, tracker)
            start_s = time.perf_counter() - t0
            batches = iter(owner)
            frames, seconds, capped = drive(lambda: next(batches).numel(), budget.frames(n * NUM_STEPS), budget)
            batches.close()
    finally:  # also after a failure: whatever the row started must be gone
        tracker.check(row.label, tracker.pids - before)
    return Measurement(frames / seconds, frames, seconds, capped, start_s)


def start_owners(row: Row, n: int, stack: contextlib.ExitStack, tracker: Tracker) -> Any:
    """Start the row's collector (and its server) and return it; their shutdowns go on ``stack``."""
    if row.kind == "batched":
        per_group = 1 if row.groups == 1 else n // row.groups  # an env per request, or two requests of n/2 envs
        owner = AsyncBatchedCollector(CollectorConfig(placement=row.placement, frames_per_batch=n * NUM_STEPS),
                                      create_env_fn=env_factory(per_group), num_groups=n // per_group,
                                      policy_factory=policy_factory())
        stack.callback(owner.shutdown)
        tracker.owners(owner.start())
        return owner
    per_worker = n // row.workers
    per_group = per_worker // row.groups
    if row.bare and row.placement == "direct":
        policy: Any = NoGradPolicy(make_policy())
    elif row.bare:  # what components.collector.local_policy=true runs: each worker builds the policy itself
        policy = PolicyReplica(policy_factory())
    else:
        placement, transport = row.server
        extra = {}
        if transport in ("shared_memory", "process_slot"):
            extra = dict(zip(("request_layout", "response_layout"), layouts(per_group)))
        policy = InferenceServer(InferenceServerConfig(placement=placement), policy_factory=policy_factory(),
                                 transport=transport, **extra)
        stack.callback(policy.shutdown)
        tracker.owners(policy.start())
    owner = Collector(CollectorConfig(frames_per_batch=n * NUM_STEPS, total_frames=-1, num_collectors=row.workers,
                                      placement=row.placement, sync=row.sync, env_groups=row.groups),
                      create_env_fn=env_factory(per_group), policy=policy, seed=0)
    stack.callback(owner.shutdown)
    tracker.owners(owner.start())
    return owner


def _measure_raw(row: Row, n: int, budget: Budget, tracker: Tracker) -> Measurement:
    t0 = time.perf_counter()
    actor = make_policy().actor
    seeds: Any = list(range(n))
    if row.mode == "envpool":  # the fast backends natively, with their own next-step autoreset (nothing is kept)
        import envpool

        env, seeds = envpool.make_gymnasium(ENV_ID, num_envs=n, batch_size=n, seed=0), None
    elif row.mode == "vector":
        env, seeds = gym.make_vec(ENV_ID, num_envs=n, vectorization_mode="vector_entry_point"), 0
    elif ATARI is not None:  # gymnasium's own Atari wrappers (EnvMaker with atari set), in its own vector envs
        vector = gym.vector.SyncVectorEnv if row.mode == "sync" else gym.vector.AsyncVectorEnv
        env = vector([EnvMaker(id=ENV_ID, atari=ATARI)] * n,
                     autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    else:
        env = gym.make_vec(ENV_ID, num_envs=n, vectorization_mode=row.mode,
                           vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    pids = {p.pid for p in getattr(env, "processes", [])}
    tracker.pids |= pids
    try:
        obs, _ = env.reset(seed=seeds)
        start_s = time.perf_counter() - t0

        def batch() -> int:
            nonlocal obs
            with torch.no_grad():
                for _ in range(NUM_STEPS):
                    action = actor.dist(torch.as_tensor(obs)).sample()
                    obs, _, _, _, _ = env.step(action.numpy())
            return n * NUM_STEPS

        frames, seconds, capped = drive(batch, budget.frames(n * NUM_STEPS), budget)
    finally:
        env.close()
        tracker.check(row.label, pids)
    return Measurement(frames / seconds, frames, seconds, capped, start_s)


# ---------------------------------------------------------------------------------------------- rounds
def run_rounds(rows: list[Row], envs: list[int], rounds: int, budget: Budget, tracker: Tracker,
               failures: dict) -> dict:
    """``results[(label, n)]``: one `Measurement` per round (``failures[(label, n)]``: the errors of the
    rounds that raised). Round ``r`` starts ``r * len(rows) / rounds`` rows further down the list, so each row meets the
    machine in a different state and after different rows."""
    results: dict = {}
    # before round 1: the forkserver process children start from (as the launcher prepares it), and one discarded
    # pass of the raw loop per env count (the first forward passes and env steps of the run are slower)
    if any(row.placement == "process" for row in rows):
        host_class("process").prepare()
    for n in envs:
        measure(base_row(), n, budget, tracker)
    for r in range(rounds):
        shift = r * len(rows) // rounds
        order = rows[shift:] + rows[:shift]
        for n in envs:
            for row in order:
                if row.workers > 1 and n % row.workers:
                    continue
                try:
                    m = measure(row, n, budget, tracker)
                except Exception as exc:  # noqa: BLE001 - the row is reported as failed, the others still run
                    failures.setdefault((row.label, n), []).append(f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
                    print(f"  round {r + 1}/{rounds} {n:>3} envs  {row.label:<52} FAILED: {exc!r}", file=sys.stderr,
                          flush=True)
                    continue
                results.setdefault((row.label, n), []).append(m)
                print(f"  round {r + 1}/{rounds} {n:>3} envs  {row.label:<52} {m.fps:>9,.0f} frames/s "
                      f"({m.frames:,} frames in {m.seconds:.2f} s{', capped' if m.capped else ''}; start "
                      f"{m.start_s:.2f} s)", file=sys.stderr, flush=True)
    return results


# ---------------------------------------------------------------------------------------------- TorchRL peer
def run_peer(python: str, envs: list[int], rounds: int, budget: Budget) -> dict:
    """Run benchmarks/torchrl_collect_peer.py with ``python`` (TorchRL's environment); its JSON.

    It runs in a session of its own, so that if it overruns PEER_TIMEOUT (or this script is interrupted) every
    process it started is stopped: SIGTERM first, which it answers by shutting its collectors down, then SIGKILL."""
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "actor.pt")
        torch.save(make_policy().actor.net.state_dict(), weights)
        frames = [f"{n}:{budget.frames(n * NUM_STEPS)}" for n in envs if n % 2 == 0]
        command = [python, os.path.join(HERE, "torchrl_collect_peer.py"),
                   "--weights", weights, "--rounds", str(rounds), "--num-steps", str(NUM_STEPS),
                   "--warmup", str(budget.warmup), "--cap", str(budget.cap_s), "--frames", *frames]
        return peer_json(command, PEER_TIMEOUT)  # inside: the weights file lives until the peer is done


# ---------------------------------------------------------------------------------------------- report
def summary(ms: list) -> dict:
    fps = spread(m.fps if isinstance(m, Measurement) else m for m in ms)
    return {"median": fps.median, "min": fps.low, "max": fps.high,
            "capped": any(getattr(m, "capped", False) for m in ms),
            "start": statistics.median(m.start_s for m in ms) if isinstance(ms[0], Measurement) else None}


def report(rows: list[Row], envs: list[int], results: dict, peer: dict | None, failures: dict, rec: Results) -> None:
    """A table per total env count, printed and recorded in ``rec`` (min-max as a [min, max] pair)."""
    peer_rows: dict = {}
    for r in (peer or {}).get("results", []):
        peer_rows.setdefault(r["envs"], []).append(r)
    for n in envs:
        base = results.get((base_row().label, n))
        base_fps = summary(base)["median"] if base else None
        columns = ["row", "envs", "frames/s median", "min-max", f"ratio to {base_row().label}", "start s"]
        print(f"\n### {n} envs in total\n")
        print(f"| {' | '.join(columns)} |")
        print("|---|---|---|---|---|---|")
        table = []
        for row in rows:
            ms = results.get((row.label, n))
            failed = failures.get((row.label, n))
            if ms:
                label = row.label + (" *" if summary(ms)["capped"] else "")
                if failed:
                    label += f" (failed in {len(failed)} round(s): {failed[0]})"
                table.append(_line(label, row.envs_label(n), summary(ms), base_fps))
            elif failed:
                print(f"| {row.label} (failed: {failed[0]}) | {row.envs_label(n)} | - | - | - | - |")
                table.append([f"{row.label} (failed: {failed[0]})", row.envs_label(n), None, None, None, None])
        for r in peer_rows.get(n, []):
            s = summary(r["fps"])
            s["start"] = r.get("start_s")
            table.append(_line(f"torchrl {peer['torchrl']} {r['row']}", r["envs_label"], s, base_fps))
        rec.table(f"{n} envs in total", columns, table)


def _line(label: str, envs_label: str, s: dict, base_fps: float | None) -> list:
    """Print a table row; return it as values."""
    ratio = f"{s['median'] / base_fps:.2f}" if base_fps else "-"
    start = f"{s['start']:.2f}" if s.get("start") is not None else "-"
    print(f"| {label} | {envs_label} | {s['median']:,.0f} | {s['min']:,.0f}-{s['max']:,.0f} | {ratio} | {start} |")
    return [label, envs_label, s["median"], [s["min"], s["max"]], s["median"] / base_fps if base_fps else None,
            s.get("start")]


def record_plot(rec: Results, rows: list[Row], envs: list[int], results: dict, peer: dict | None) -> None:
    """Median frames/s per row, a series per total env count, the raw loops (the floors) dashed; TorchRL's rows
    last."""
    medians = {row.label: {n: summary(results[(row.label, n)])["median"] for n in envs if results.get((row.label, n))}
               for row in rows}
    for r in (peer or {}).get("results", []):
        medians.setdefault(f"torchrl {peer['torchrl']} {r['row']}", {})[r["envs"]] = statistics.median(r["fps"])
    x = [label for label, by_n in medians.items() if by_n]
    raw = {row.label for row in rows if row.kind == "raw"}
    series, floors = with_floors(x, {f"{n} envs": [medians[label].get(n) for label in x] for n in envs},
                                 lambda label: label in raw, suffix=" (raw loop)")
    rec.plot("fps", "collection frames/s per row, a bar per total env count (raw loops dashed)", x=x, series=series,
             kind="bar", xlabel="row", ylabel="frames/s (median of rounds)", floors=floors)


def targets(rows: list[Row], envs: list[int], results: dict, rec: Results) -> None:
    """The targets' verdicts, printed and recorded in ``rec``."""
    print(f"\n### Targets (ratio of medians to the {base_row().label} loop at the same total env count)\n")

    def ratio(label: str, n: int):
        ms, base = results.get((label, n)), results.get((base_row().label, n))
        if not ms or not base:
            return None
        return summary(ms)["median"], summary(ms)["median"] / summary(base)["median"]

    for n in envs:
        got = ratio("Collector direct [direct server]", n)
        _verdict(rec, f"Collector direct [direct server] at {n} envs", got, TARGET_DIRECT)
    for n in envs:
        candidates = [(ratio(row.label, n), row.label) for row in rows
                      if row.kind == "collector" and row.placement == "process" and row.workers == 2]
        candidates = [(got, label) for got, label in candidates if got is not None]
        if not candidates:
            _verdict(rec, f"process Collector x2 at {n} envs", None, TARGET_PROCESS2)
            continue
        got, label = max(candidates, key=lambda c: c[0][1])
        _verdict(rec, f"process Collector x2 at {n} envs (best of {len(candidates)}: {label})", got, TARGET_PROCESS2)
    for n in envs:
        for label in ("AsyncBatchedCollector process [process/process_slot]",
                      "AsyncBatchedCollector process 2 groups [process/process_slot]"):
            _verdict(rec, f"{label.split(' [')[0]} at {n} envs", ratio(label, n), TARGET_BATCHED)


def beside_peer(rows: list[Row], envs: list[int], results: dict, peer: dict, rec: Results) -> None:
    """Per env count: our best 2-worker process row beside each TorchRL row (medians); the lines are notes."""
    print(f"\nBeside TorchRL {peer['torchrl']} (2 workers, frames/s medians):\n")
    for n in envs:
        ours = [(summary(results[(row.label, n)])["median"], row.label) for row in rows
                if row.placement == "process" and row.workers == 2 and results.get((row.label, n))]
        for r in (r for r in peer.get("results", []) if r["envs"] == n):
            theirs = statistics.median(r["fps"])
            if ours:
                fps, label = max(ours)
                say(rec.note, f"{n} envs: {label} {fps:,.0f} vs torchrl {r['row']} {theirs:,.0f} (ours / TorchRL "
                    f"{fps / theirs:.2f}x)")


def _verdict(rec: Results, what: str, got, target: float) -> None:
    if got is None:
        say(rec.verdict, f"{what}: not measured in this run")
        return
    fps, ratio = got
    say(rec.verdict, f"{'PASS' if ratio >= target else 'MISS'} {what}: {fps:,.0f} frames/s = {ratio:.2f}x "
        f"{base_row().label} (target >= {target:.2f}x)")


# ---------------------------------------------------------------------------------------------- main
def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds the ExitStacks above: owners are shut down


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="3 rounds, a quarter of the frames, a 1 s time cap per row")
    parser.add_argument("--env", choices=sorted(ENVS), default="cartpole",
                        help="CartPole-v1, or ALE/Breakout-v5 preprocessed as env=atari does (the PPO recipe's Nature "
                             "CNN as the policy); recorded in benchmarks/results/collect_atari.json")
    parser.add_argument("--envs", type=int, nargs="+", default=None,
                        help="total env counts (even numbers; default 16 64, Atari 8 16)")
    parser.add_argument("--rows", nargs="+", default=None, metavar="SUBSTRING",
                        help="only rows whose label contains one of these (the raw sync loop always runs)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5; --quick: 3)")
    parser.add_argument("--backend", choices=("gymnasium", "vector", "envpool"), default="gymnasium",
                        help="env.backend of the collectors' envs; the raw loop of that backend (natively) is the base "
                             "of the ratios, the raw gymnasium sync loop stays as a row")
    parser.add_argument("--peer-python", metavar="PATH", default=None,
                        help="python of an environment with torchrl 0.14.1: also measure TorchRL's multi-process "
                             "collectors")
    return parser


def main() -> None:
    args = arguments().parse_args()
    rec = Results("collect", record=None if args.env == "cartpole" else f"collect_{args.env}")
    global BACKEND, ENV_ID, ATARI
    BACKEND = args.backend
    ENV_ID, ATARI, default_envs = ENVS[args.env]
    args.envs = args.envs or default_envs
    if args.peer_python and ATARI is not None:
        raise SystemExit("--peer-python measures TorchRL's collectors on CartPole-v1 only: leave out --env atari")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    torch.set_num_threads(1)
    rounds = args.rounds or (3 if args.quick else 5)
    budget = Budget(warmup=1, scale=1.0, cap_s=1.0) if args.quick else Budget(warmup=2, scale=4.0, cap_s=4.0)
    if ATARI is not None:  # a batch of Atari frames takes about as long as a CartPole row's whole cap
        budget = Budget(budget.warmup, budget.scale / 4, budget.cap_s * 5)
    rows = [row for row in all_rows()
            if row.kind == "raw" and row.mode == BACKEND.replace("gymnasium", "sync")
            or not args.rows or any(s.lower() in row.label.lower() for s in args.rows)]

    tracker = Tracker()
    other = OtherLoad()
    started = time.monotonic()
    failures: dict = {}
    results = run_rounds(rows, args.envs, rounds, budget, tracker, failures)
    elapsed = time.monotonic() - started
    other_cpu, other_wall = other.seconds()

    peer, peer_note = None, None
    if args.peer_python:
        peer_started = time.monotonic()
        try:
            peer = run_peer(args.peer_python, args.envs, rounds, budget)
        except Exception as exc:  # noqa: BLE001 - our tables still print; the note says why TorchRL's rows are missing
            peer_note = f"TorchRL peer ({args.peer_python}) failed, so its rows are missing: {exc!r}"
        else:
            peer_note = (f"TorchRL peer ({args.peer_python}): torchrl {peer['torchrl']}, tensordict "
                         f"{peer['tensordict']}, env {peer['env']}, measured after ours "
                         f"({time.monotonic() - peer_started:.0f} s), its rounds interleaved among themselves; "
                         f"ratios against our raw sync loop. Its own raw sync loop: "
                         + ", ".join(f"{r['envs']} envs {statistics.median(r['fps']):,.0f} frames/s"
                                     for r in peer.get("raw", []))
                         + (". Skipped: " + "; ".join(f"{k}: {v}" for k, v in peer["skipped"].items())
                            if peer.get("skipped") else ""))

    say(rec.note, f"Collection frames/s, {ENV_ID}, no learning (median of {rounds} interleaved rounds; "
        f"{os.cpu_count()} CPUs; torch {torch.__version__}, gymnasium {gym.__version__}; "
        f"{'quick' if args.quick else 'full'} run, {elapsed:.0f} s)", "\n# ")
    say(rec.note, f"Each row: start, warm up {budget.warmup} iteration(s), then iterate up to "
        f"{', '.join(f'{budget.frames(n * NUM_STEPS):,} frames at {n} envs' for n in args.envs)} "
        f"or {budget.cap_s:g} s "
        "(`*`: the cap ended at least one round first). Collector batches: envs x 32 steps; AsyncBatchedCollector "
        f"batches: as many transitions, flat. ratio = median / {base_row().label} median at the same total env count; "
        f"env.backend of the collectors: {BACKEND}. start s: "
        "median seconds to start the row's owners (not counted in frames/s).", "\n")
    share = other_cpu / (other_wall * (os.cpu_count() or 1))
    say(rec.note, f"Other processes on this machine used {other_cpu:.0f} CPU-seconds during our {other_wall:.0f} s "
        f"({share:.0%} of its {os.cpu_count()} CPUs)"
        + (": the machine was shared, so these figures are lower than an idle machine gives and noisier."
           if share > 0.05 else "."), "\n")
    if peer_note:
        say(rec.note, peer_note, "\n")
    report(rows, args.envs, results, peer, failures, rec)
    targets(rows, args.envs, results, rec)
    if peer:
        beside_peer(rows, args.envs, results, peer, rec)
    if not args.peer_python:
        print("\nTo print TorchRL 0.14.1's MultiSyncCollector and MultiAsyncCollector beside these, add --peer-python "
              "PATH (the python of an environment with torchrl 0.14.1; see --help).")
    left = segments_of(tracker.pids | {os.getpid()})
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
    say(rec.note, f"cleanup: {len(tracker.pids)} processes started by the rows, "
        f"{'none' if not tracker.survivors else len(tracker.survivors)} left after their row"
        + (f" ({'; '.join(tracker.survivors)})" if tracker.survivors else "")
        + f"; {len(left)} rlsvc shared-memory segment(s) left" + (f" ({', '.join(left)})" if left else "")
        + f"; threads besides main: {', '.join(others) if others else 'none'}", "\n")
    record_plot(rec, rows, args.envs, results, peer)
    rec.save()


if __name__ == "__main__":
    main()
