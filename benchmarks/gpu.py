"""The GPU rows: inference, the learner and APPO on Atari with CUDA, each beside its CPU or eager counterpart measured
in the same run; medians with their spread.

- **Inference** (``--rows inference``): a real `components.inference.InferenceServer` placed ``process`` with
  the PPO recipe's behaviour policy on Atari (the Nature CNN; `collect.build_policy`) on ``cuda``, serving one
  4x84x84 uint8 frame (28 KB) per request over ``shared_memory`` slots. 64 clients, threads of worker processes as
  `inference`'s clients are, each making sequential round trips; the server waits for all 64
  (``min_batch_size=64``), so every forward pass is a batch of 64. requests/s for four servers, started together and
  measured in interleaved rounds: ``static_batch_size=64`` (CUDA-graph batches) or eager, pinned host staging
  (``pin_memory=true``, the default) or not. Targets: static graphs at least 1.5x eager's requests/s (both pinned,
  the defaults); pinned at least 1.3x unpinned (both eager, the default); each on the median of the per-round ratios.
- **Learner** (``--rows learner``): updates/s of the PPO recipe's learner on Atari (``conf/recipe_env/ppo_atari.yaml``:
  the Nature CNN, a batch of 8 x 128 frames, 4 epochs of 4 minibatches), with the recipe's own advantage estimate
  and update (`recipes.ppo.estimate_advantages`, `recipes.ppo.update`) on a batch of that shape, moved
  to the learner's device once per update as the recipe moves it; on ``cuda`` (also with ``recipe.amp=true``, and
  in a full run ``recipe.compile=true`` too) and on this machine's CPU cores (torch threads: one per core), each in a
  fresh interpreter. Target: the GPU (float32, not compiled) at least 5x the CPU.
- **APPO** (``--rows appo``): ``python -m launcher +recipe=appo env=atari recipe.device=cuda`` with its collector
  workers on the other cores (one per core but two, 4 envs each, an update per round of every env's unroll), acting
  with a policy replica in each worker (``local_policy``) or through an inference server on the GPU; frames/s from
  the second batch on (``steady_fps``). Beside it the pure-simulation loop: as many processes, each stepping the same
  4 envs (``EnvMaker``, ``env=atari``) with random actions and no policy, measured before and after the runs. Target:
  the best APPO row at least 0.75 of the pure-simulation frames/s (Sample Factory's published ratio on 36 cores and one
  GPU).

Where this machine has no CUDA, every row is skipped: each table says so (``skipped: no CUDA``), and the script exits
0. ``--smoke`` runs the same code on the CPU with tiny counts (rows that need CUDA skipped): it checks the script on a
machine without a GPU, and records nothing.

    python benchmarks/gpu.py                          # every row (about 5 minutes on one GPU and 16 cores)
    python benchmarks/gpu.py --quick                  # fewer rounds and frames (what benchmarks/gpu_check.sh runs)
    python benchmarks/gpu.py --rows inference learner --rounds 5
    python benchmarks/gpu.py --smoke --rows inference learner
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import signal
import statistics
import sys
import threading
import time
import traceback

from _harness import (  # first: the checkout on sys.path (benchmarks/_harness.py)
    compose_launcher, in_child, launcher_run, round_trips, spread, steady_rate, stop_child, summarize)
from _results import Results, say, show

ROWS = ("inference", "learner", "appo")
ENV_ID = "ALE/Breakout-v5"
BATCH = 64
"""Requests per forward pass in the inference rows (and their static batch size)."""
INFERENCE = [  # label, static_batch_size, pin_memory
    ("eager, pinned", None, True),
    ("static graphs, pinned", BATCH, True),
    ("eager, unpinned", None, False),
    ("static graphs, unpinned", BATCH, False),
]
STATIC_TARGET, PINNED_TARGET, LEARNER_TARGET, SIMULATION_TARGET = 1.5, 1.3, 5.0, 0.75
SKIPPED = "skipped: no CUDA"


def cuda_here() -> str | None:
    """Why the GPU rows cannot run here (``None``: they can)."""
    import torch

    if not torch.cuda.is_available():
        return f"{SKIPPED} (torch {torch.__version__} sees no CUDA device on this machine)"
    return None


def gpu_name() -> str:
    """The GPU the rows ran on, as the page names it."""
    import torch

    props = torch.cuda.get_device_properties(0)
    return (f"{props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}, "
            f"{torch.cuda.device_count()} device(s) visible")


# ---------------------------------------------------------------------------------------------- inference
def atari_policy():
    """The PPO recipe's behaviour policy on Atari frames (the Nature CNN), the same weights in every process."""
    from collect import build_policy
    from components.envs.families.atari import AtariConfig

    return build_policy(ENV_ID, AtariConfig())


def inference_layouts():
    """One request (a 4x84x84 uint8 frame, no batch dimension: one row each) and its answer."""
    import torch
    from tensordict import TensorDict

    request = TensorDict({"observation": torch.zeros(4, 84, 84, dtype=torch.uint8)}, [])
    with torch.no_grad():
        out = atari_policy()(request.unsqueeze(0).clone())[0]
    out.set("policy_version", torch.zeros((), dtype=torch.long))
    return request, out.exclude("observation")


def make_inference_server(device: str, static: int | None, pinned: bool, request, response):
    """A ``process`` server of `atari_policy` on ``device`` over ``shared_memory``, every batch of 64."""
    from components.inference import InferenceServer, InferenceServerConfig
    from transports.config import TransportConfig

    settings = {"static_batch_size": static} if static is not None else {}
    config = InferenceServerConfig(placement="process", max_batch_size=BATCH, min_batch_size=BATCH, timeout=0.1,
                                   policy_device=device, pin_memory=pinned, **settings)
    return InferenceServer(config, policy_factory=atari_policy,
                           transport=TransportConfig("shared_memory", {"num_slots": BATCH}),
                           request_layout=request, response_layout=response)


def _inference_worker(conn, clients: dict, request) -> None:
    """A process of client threads: for each message ``(label, warm-up, n)``, every client of that server makes its
    round trips at once; the parts (`round_trips`) go back."""
    import torch

    torch.set_num_threads(1)
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            break
        label, warmup, n = msg
        mine = clients[label]
        parts: list = [None] * len(mine)
        errors: list = []
        barrier = threading.Barrier(len(mine))

        def work(i: int) -> None:
            try:
                barrier.wait()
                parts[i] = round_trips(lambda: mine[i].submit(request).result(60), warmup, n)
            except BaseException:  # noqa: BLE001 - reported to the main process
                errors.append(traceback.format_exc())
                barrier.abort()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(mine))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        conn.send(("error", errors[0]) if errors else ("ok", parts))


def measure_inference(device: str, rows: list, rounds: int, n: int, workers: int) -> dict:
    """requests/s of each row's server in each round: ``{label: [rate per round]}`` (``None`` for a round that
    failed; the reason under ``"errors"``)."""
    ctx = mp.get_context("spawn")
    request, response = inference_layouts()
    rates: dict = {label: [] for label, _, _ in rows}
    errors: dict = {}
    with contextlib.ExitStack() as stack:
        servers = {label: make_inference_server(device, static, pinned, request, response)
                   for label, static, pinned in rows}
        failed = {}

        def start(label: str) -> None:
            try:
                servers[label].start()  # warm-up and capture happen here
            except BaseException as exc:  # noqa: BLE001 - that row is reported as failed, the others go on
                failed[label] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"

        for server in servers.values():
            stack.callback(server.shutdown)
        starters = [threading.Thread(target=start, args=(label,)) for label in servers]
        for t in starters:
            t.start()
        for t in starters:
            t.join()
        errors.update(failed)
        live = [label for label in servers if label not in failed]
        per_worker = BATCH // workers
        conns = []
        for _ in range(workers):  # the clients are made here and travel as Process arguments
            clients = {label: [servers[label].client() for _ in range(per_worker)] for label in live}
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_inference_worker, args=(child, clients, request), daemon=True)
            proc.start()
            stack.callback(_stop_worker, proc, parent)
            conns.append(parent)
        for conn in conns:
            assert conn.recv() == "ready"
        for r in range(rounds):
            for label in live:
                for conn in conns:
                    conn.send((label, max(5, n // 5), n))
                replies = [conn.recv() for conn in conns]
                bad = next((value for status, value in replies if status != "ok"), None)
                if bad is not None:
                    errors[label] = bad.strip().splitlines()[-1][:300]
                    rates[label].append(None)
                    continue
                rates[label].append(summarize([part for _, parts in replies for part in parts])["rate"])
                print(f"  inference {label:<24} round {r + 1}: {rates[label][-1]:,.0f} requests/s", file=sys.stderr,
                      flush=True)
    return {"rates": rates, "errors": errors}


def _stop_worker(proc, conn) -> None:
    stop_child(proc, lambda: conn.send(None))
    conn.close()


def _per_round(rates: dict, ours: str, theirs: str) -> list[float]:
    return [a / b for a, b in zip(rates.get(ours, []), rates.get(theirs, [])) if a and b]


def report_inference(rec: Results, result: dict | None, why: str | None, args) -> None:
    title = (f"Inference: the Nature CNN on 4x84x84 uint8 frames (28 KB), {BATCH} clients, batches of {BATCH}, "
             "process server over shared_memory: requests/s")
    columns = ["server", "requests/s", "range", "x eager, pinned"]
    if result is None:
        show(rec, title, columns, [], note=why)
        return
    rates = result["rates"]
    base = spread(rates.get("eager, pinned", []))
    rows = []
    for label, values in rates.items():
        s = spread(values)
        rows.append([label, s and s.median, s.range() if s else result["errors"].get(label, "-"),
                     s.median / base.median if s and base else None])
    show(rec, title, columns, rows, note=f"{args.rounds} interleaved rounds of {args.requests} round trips per "
         f"client after a warm-up; {args.workers} client processes of {BATCH // args.workers} threads each")
    for label, error in result["errors"].items():
        say(rec.note, f"{label}: failed: {error}")
    for what, ours, theirs, target in (("static graphs vs eager (pinned)", "static graphs, pinned", "eager, pinned",
                                        STATIC_TARGET),
                                       ("pinned vs unpinned (eager)", "eager, pinned", "eager, unpinned",
                                        PINNED_TARGET)):
        ratios = _per_round(rates, ours, theirs)
        if not ratios:
            say(rec.verdict, f"{what}: not measured in this run")
            continue
        ratio = statistics.median(ratios)
        say(rec.verdict, f"{'PASS' if ratio >= target else 'MISS'} inference {what}: {ratio:.2f}x requests/s, median "
            f"of the per-round ratios ({', '.join(f'{x:.2f}' for x in ratios)}); target >= {target}x")
    static_unpinned = _per_round(rates, "static graphs, unpinned", "static graphs, pinned")
    if static_unpinned:
        say(rec.note, f"with static graphs, unpinned over pinned: {statistics.median(static_unpinned):.2f}x")


# ---------------------------------------------------------------------------------------------- learner
def ppo_learner(device: str, updates: int, threads: int | None, amp: bool = False, compile: bool = False,
                seed: int = 0) -> dict:
    """Seconds per update of the PPO recipe's learner on Atari on ``device`` (after one warm-up update): the batch
    moved to the device, advantages estimated, ``update_epochs x num_minibatches`` gradient steps through the
    recipe's own update (`recipes.ppo.update`, its loss under `recipes.update.UpdateStep`: ``amp``,
    ``compile``), as `recipes.ppo.run` learns; the minibatches are the rows at a random permutation drawn on the
    device, as the replay buffer's numbers give them there."""
    import torch
    from omegaconf import OmegaConf
    from tensordict import TensorDict

    from components.envs import EnvMaker
    from recipes.actor_critic import Learner
    from recipes.ppo import estimate_advantages, ppo_loss, update
    from recipes.update import UpdateStep, learner_device

    if threads is not None:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    composed = compose_launcher(["+recipe=ppo", "env=atari", f"recipe.device={device}", f"recipe.amp={amp}",
                                 f"recipe.compile={compile}"])
    cfg = OmegaConf.to_object(composed.recipe)
    spec = EnvMaker.from_config(composed.env).spec()
    place = learner_device(cfg)
    learner = Learner(cfg, spec).to(place)
    optimizer = learner.optimizer(cfg.lr)
    step = UpdateStep(lambda minibatch: ppo_loss(minibatch, learner, cfg), cfg, place)
    steps, envs = cfg.num_steps, cfg.num_envs
    obs = torch.randint(0, 256, (steps, envs, *spec.observation_shape), dtype=torch.uint8)
    batch = TensorDict({"observation": obs, "action": torch.randint(0, spec.n_actions, (steps, envs)),
                        "sample_log_prob": torch.full((steps, envs), -1.4),
                        "next": {"observation": obs.roll(-1, 0), "reward": torch.randn(steps, envs),
                                 "done": torch.rand(steps, envs) < 0.01, "terminated": torch.rand(steps, envs) < 0.01}},
                       batch_size=[steps, envs])
    count = cfg.update_epochs * cfg.num_minibatches
    seconds = []

    def sync() -> None:
        if place.type == "cuda":
            torch.cuda.synchronize(place)

    for n in range(updates + 1):
        sync()
        t0 = time.perf_counter()
        rows = estimate_advantages(batch.to(place), learner, cfg).reshape(-1)
        order = torch.cat([torch.randperm(rows.shape[0], device=place) for _ in range(cfg.update_epochs)])
        update((rows[index] for index in order.split(rows.shape[0] // cfg.num_minibatches)), learner, optimizer,
               step, cfg)
        sync()
        if n:  # the first update warms up (allocations, kernels chosen, the compilation)
            seconds.append(time.perf_counter() - t0)
    label = device + (" amp" if amp else "") + (" compile" if compile else "")
    return {"device": label, "threads": torch.get_num_threads(), "seconds": seconds, "frames": steps * envs,
            "minibatch_steps": count}


def measure_learner(device: str, updates: dict, timeout: float) -> dict:
    """Each learner in a fresh interpreter: ``updates`` maps ``cpu`` / ``gpu`` / ``gpu amp`` / ``gpu amp compile``
    to its timed updates; the CPU learner on every core."""
    cores = os.cpu_count() or 1
    out = {}
    for where, n in updates.items():
        place = "cpu" if where == "cpu" else device
        threads = cores if where == "cpu" else 1
        call = f"ppo_learner({place!r}, {n}, {threads}, amp={'amp' in where}, compile={'compile' in where})"
        out[where] = in_child("gpu", call, timeout)
        per = statistics.median(out[where]["seconds"])
        print(f"  learner {out[where]['device']} ({out[where]['threads']} threads): {1 / per:.2f} updates/s",
              file=sys.stderr, flush=True)
    return out


def report_learner(rec: Results, result: dict | None, why: str | None) -> None:
    title = "PPO-Atari learner (8 x 128 frames, 4 epochs of 4 minibatches per update): updates/s"
    columns = ["learner", "torch threads", "updates/s", "range", "x CPU"]
    if result is None:
        show(rec, title, columns, [], note=why)
        return
    cpu = 1 / statistics.median(result["cpu"]["seconds"])
    rows = {}
    for where, r in result.items():
        s = spread(1 / x for x in r["seconds"])
        rows[where] = [r["device"], r["threads"], s.median, s.range(".2f"), s.median / cpu]
    show(rec, title, list(columns), list(rows.values()), note="the median over timed updates (each learner after one "
         "warm-up update, in a fresh interpreter) and their range; the CPU learner uses every core of this machine")
    if "gpu" in rows:
        ratio = rows["gpu"][-1]
        say(rec.verdict, f"{'PASS' if ratio >= LEARNER_TARGET else 'MISS'} learner updates/s on "
            f"{result['gpu']['device']}: {ratio:.1f}x the CPU learner's {cpu:.2f} on {result['cpu']['threads']} "
            f"threads (target >= {LEARNER_TARGET}x)")


# ---------------------------------------------------------------------------------------------- APPO
def appo_plan(cores: int) -> tuple[int, int]:
    """Collector workers (one per core but two: the learner's and the driver's) and the envs over all of them."""
    workers = max(1, cores - 2)
    return workers, 4 * workers


def appo_rows(device: str, workers: int, envs: int) -> list[tuple[str, list[str]]]:
    """The APPO runs: the learner on ``device``, the collectors on the other cores, acting in each worker or through
    an inference server on the GPU."""
    common = ["service=process", f"recipe.device={device}", f"recipe.num_envs={envs}", f"recipe.batch_size={envs}",
              f"components.collector.num_collectors={workers}", "components.collector.sync=false"]
    return [(f"learner on {device}, a policy replica in each worker",
             [*common, "components.collector.local_policy=true"]),
            (f"learner and inference on {device} (shared_memory)",
             [*common, "transport=shared_memory", f"components.inference.policy_device={device}"])]


def _simulate(maker, n: int, seconds: float, seed: int, start, results) -> None:
    """One pure-simulation process: ``n`` envs of ``maker`` stepped with random actions, no policy; the frames
    stepped in ``seconds`` after a warm-up, started together with the others (``start``)."""
    envs = maker.vector(n)
    try:
        envs.reset(seed=seed)
        envs.action_space.seed(seed)
        for _ in range(20):
            envs.step(envs.action_space.sample())
        start.wait()
        frames, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            envs.step(envs.action_space.sample())
            frames += n
        results.put((frames, time.perf_counter() - t0))
    finally:
        envs.close()


def pure_simulation(workers: int, envs: int, seconds: float) -> float:
    """frames/s of ``workers`` processes each stepping ``envs / workers`` Atari envs (``env=atari``) with random
    actions."""
    from components.envs import EnvMaker

    maker = EnvMaker.from_config(compose_launcher(["+recipe=appo", "env=atari"]).env)
    ctx = mp.get_context("spawn")
    start, results = ctx.Barrier(workers + 1), ctx.Queue()
    procs = [ctx.Process(target=_simulate, args=(maker, envs // workers, seconds, i, start, results), daemon=True)
             for i in range(workers)]
    for p in procs:
        p.start()
    try:
        start.wait(timeout=300)
        done = [results.get(timeout=seconds + 120) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.terminate()
                p.join(5)
    return sum(frames for frames, _ in done) / max(s for _, s in done)


def measure_appo(device: str, frames: int, rounds: int, seconds: float, timeout: float) -> dict:
    workers, envs = appo_plan(os.cpu_count() or 1)
    rows = appo_rows(device, workers, envs)
    out: dict = {"workers": workers, "envs": envs, "simulation": [], "runs": {label: [] for label, _ in rows},
                 "errors": {}}
    for _ in range(rounds):
        out["simulation"].append(pure_simulation(workers, envs, seconds))
        print(f"  pure simulation, {workers} processes x {envs // workers} envs: {out['simulation'][-1]:,.0f} "
              "frames/s", file=sys.stderr, flush=True)
        for label, overrides in rows:
            try:
                summary, _ = launcher_run(["+recipe=appo", "env=atari", f"recipe.total_frames={frames}",
                                           "launcher.progress=false", "launcher.plot=false", *overrides], timeout)
                out["runs"][label].append(steady_rate(summary))
            except Exception as exc:  # noqa: BLE001 - the row is reported as failed, the others go on
                out["errors"][label] = str(exc).strip().splitlines()[-1][:300]
                out["runs"][label].append(None)
            print(f"  appo {label}: {out['runs'][label][-1] or 0:,.0f} frames/s", file=sys.stderr, flush=True)
    out["simulation"].append(pure_simulation(workers, envs, seconds))
    return out


def report_appo(rec: Results, result: dict | None, why: str | None, frames: int) -> None:
    title = f"APPO on {ENV_ID}: frames/s beside the pure-simulation loop on the same cores"
    columns = ["row", "frames/s", "range", "of pure simulation"]
    if result is None:
        show(rec, title, columns, [], note=why)
        return
    sim = spread(result["simulation"])
    rows = [[f"pure simulation ({result['workers']} processes x {result['envs'] // result['workers']} envs, random "
             "actions)", sim.median, sim.range(), 1.0]]
    for label, values in result["runs"].items():
        s = spread(values)
        rows.append([label, s and s.median, s.range() if s else result["errors"].get(label, "-"),
                     s.median / sim.median if s else None])
    show(rec, title, columns, rows, note=f"APPO runs of {frames:,} frames each, frames/s from the second batch on; "
         f"{result['workers']} collector workers of 4 envs; the pure-simulation loop measured before and after them")
    for label, error in result["errors"].items():
        say(rec.note, f"{label}: failed: {error}")
    measured = [row for row in rows[1:] if row[1] is not None]
    if not measured:
        say(rec.verdict, "APPO against pure simulation: not measured in this run")
        return
    best = max(measured, key=lambda row: row[1])
    say(rec.verdict, f"{'PASS' if best[3] >= SIMULATION_TARGET else 'MISS'} APPO, {best[0]}: {best[1]:,.0f} frames/s "
        f"= {best[3]:.2f} of pure simulation's {sim.median:,.0f} (target >= {SIMULATION_TARGET})")


# ---------------------------------------------------------------------------------------------- main
def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, round trips, updates and frames")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5; --quick 3)")
    parser.add_argument("--requests", type=int, default=None,
                        help="round trips per inference client per round (default 200; --quick 60)")
    parser.add_argument("--workers", type=int, default=8, help="client processes of the inference rows")
    parser.add_argument("--frames", type=int, default=None,
                        help="frames per APPO run (default 100,000; --quick 30,000)")
    parser.add_argument("--results-dir", default=None,
                        help="write the results file there instead of benchmarks/results")
    parser.add_argument("--smoke", action="store_true",
                        help="the same code on the CPU with tiny counts; the CUDA rows skipped, nothing recorded")
    parser.add_argument("--timeout", type=float, default=600, help="seconds for each child and launcher run")
    parser.add_argument("--commit", default=None, help="the commit to record where the checkout has no git directory")
    return parser


class Stopped(Exception):
    """SIGTERM (``timeout`` ending the GPU check's step): the rows measured so far are reported and recorded."""


def _stop(signum, frame) -> None:
    raise Stopped()


class GpuResults(Results):
    """`_results.Results` whose commit may be given: on a GPU machine the checkout travels without its git
    directory (``--commit``)."""

    def __init__(self, commit: str | None):
        super().__init__("gpu")
        self.given_commit = commit

    def as_dict(self) -> dict:
        """As `Results.as_dict`, with the given commit where git names none."""
        out = super().as_dict()
        if out.get("commit") is None and self.given_commit:
            out["commit"] = self.given_commit
        return out


def main() -> None:
    args = arguments().parse_args()
    if BATCH % args.workers:
        raise SystemExit(f"--workers must divide {BATCH}")
    args.rounds = args.rounds or (1 if args.smoke else 3 if args.quick else 5)
    args.requests = args.requests or (10 if args.smoke else 60 if args.quick else 200)
    args.frames = args.frames or (4096 if args.smoke else 30_000 if args.quick else 100_000)
    rec = GpuResults(args.commit)
    why = None if args.smoke else cuda_here()
    device = "cpu" if args.smoke else "cuda"
    if why:
        print(f"gpu.py: {why}; every GPU row is skipped (benchmarks/gpu_check.sh runs them on a machine with a GPU)",
              file=sys.stderr)
    elif not args.smoke:
        say(rec.note, f"GPU: {gpu_name()}")
    else:
        say(rec.note, "smoke run: the CPU stands in for CUDA, the rows that need CUDA are skipped; not a GPU result")

    def inference() -> None:
        rows = [row for row in INFERENCE if not args.smoke or row[1] is None and row[2]]
        result = None if why else measure_inference(device, rows, args.rounds, args.requests, args.workers)
        report_inference(rec, result, why, args)

    def learner() -> None:
        updates = {"cpu": 1 if args.smoke else 2 if args.quick else 4}
        if not args.smoke:  # the target's row, then mixed precision (and, in a full run, compiled too)
            updates.update({"gpu": 5 if args.quick else 20, "gpu amp": 5 if args.quick else 20})
            if not args.quick:
                updates["gpu amp compile"] = 20
        report_learner(rec, None if why else measure_learner(device, updates, args.timeout), why)

    def appo() -> None:
        seconds = 3.0 if args.smoke else 10.0 if args.quick else 20.0
        rounds = 1 if args.quick or args.smoke else args.rounds
        report_appo(rec, None if why else measure_appo(device, args.frames, rounds, seconds, args.timeout), why,
                    args.frames)

    sections = {"inference": inference, "learner": learner, "appo": appo}
    started = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _stop)
    todo = [name for name in ROWS if name in args.rows]
    try:
        while todo:
            sections[todo[0]]()
            todo.pop(0)
    except Stopped:
        say(rec.note, f"stopped by SIGTERM after {time.monotonic() - started:.0f} s (a time limit): not measured: "
            f"{', '.join(todo)}")
    signal.signal(signal.SIGTERM, previous)
    print(f"\n({time.monotonic() - started:.0f} s)", file=sys.stderr)
    if args.smoke:
        print("smoke run: nothing recorded")
    elif args.results_dir or not why:
        rec.save(*([args.results_dir] if args.results_dir else []))
    else:
        print("nothing measured: nothing recorded")


if __name__ == "__main__":
    main()
