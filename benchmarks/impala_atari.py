"""IMPALA and APPO on Atari from pixels: training frames/s and returns at the same frame budget, beside PPO's
synchronous rows, this recipe's overlap bound and Sample Factory's APPO, all in the same run.

- **Our rows**: ``python -m launcher +recipe=<recipe> env=atari`` subprocesses (settings:
  ``conf/recipe_env/<recipe>_atari.yaml``), one per placement and seed, each for ``--frames`` agent steps; frames/s
  is the recipe's own from its second batch on (``steady_fps``: the services' start, the first collection, which
  nothing overlaps, and the first update's warm-up left out, as Sample Factory's rate is after its first training
  iteration; the whole run's rate is printed beside it), the return the mean of the last 100 episodes (raw,
  unclipped).
- **PPO's synchronous rows** (collect a batch, then learn from it): the frames/s IMPALA is held against.
- **The overlap bound** of a recipe: its own collect phase (C1: acting the frames of one update with its policy on a
  vector env) and learn phase (L1: one update, `recipes.impala.learn`) timed on one torch thread in a fresh
  interpreter. With every core busy and nothing wasted an update takes no less than ``(C1 + L1) / cores``: no
  placement can beat ``frames per update / ((C1 + L1) / cores)`` frames/s. A bound per env backend its rows use
  (``env.backend=ale_vector`` rows against a C1 timed on ale-py's vector env, itself held to one thread); L1, the
  same update whichever backend collected its batch, is the median over every timing of the recipe.
- **Sample Factory 2.1.1's APPO** (``benchmarks/sample_factory_peer.py``, run by the interpreter of its own venv,
  ``--sf-python``): same env, the same size of network, the same frame budget, and the update our APPO makes on
  Atari (its samples per update, minibatches and passes, read from ``conf/recipe_env/appo_atari.yaml``).

    python benchmarks/impala_atari.py --frames 8192 --seeds 0 1 2
    python benchmarks/impala_atari.py --frames 50000 --seeds 0 1 2 --sf-python /tmp/sf/venv/bin/python

Frames count agent steps (each 4 emulator frames at frame skip 4), as CleanRL's ``global_step`` does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from _harness import (  # first: the checkout on sys.path (benchmarks/_harness.py)
    compose_launcher, in_child, launcher_run, spread, steady_rate)
from _results import Results, say, show
from _sample_factory import sample_factory_appo

ENV_ID = "ALE/Breakout-v5"
ROWS = [  # (label, recipe, overrides)
    ("ppo direct", "ppo", ["service=direct"]),
    ("ppo process/shared_memory", "ppo", ["service=process", "transport=shared_memory"]),
    ("impala direct", "impala", ["service=direct"]),
    ("impala process/shared_memory", "impala", ["service=process", "transport=shared_memory"]),
    ("impala process/local_policy", "impala", ["service=process", "components.collector.local_policy=true"]),
    # the driver's default (launcher.plan.learner_threads) leaves IMPALA's one-pass learner a core less one per
    # worker collecting beside it (one on 2 cores) and gives APPO's every core; these rows set two threads
    ("impala process/shared_memory 2 threads", "impala",
     ["service=process", "transport=shared_memory", "launcher.torch_threads=2"]),
    ("appo process/shared_memory", "appo", ["service=process", "transport=shared_memory"]),
    ("appo process/shared_memory 2 threads", "appo",
     ["service=process", "transport=shared_memory", "launcher.torch_threads=2"]),
    ("appo process/local_policy", "appo", ["service=process", "components.collector.local_policy=true"]),
    # the same game on ale-py's C++ vector env (env.backend=ale_vector): each row's bound is timed on its own backend
    ("ppo direct ale_vector", "ppo", ["service=direct", "env.backend=ale_vector"]),
    ("impala process/shared_memory ale_vector", "impala",
     ["service=process", "transport=shared_memory", "env.backend=ale_vector"]),
    ("impala process/local_policy ale_vector", "impala",
     ["service=process", "components.collector.local_policy=true", "env.backend=ale_vector"]),
    ("appo process/local_policy ale_vector", "appo",
     ["service=process", "components.collector.local_policy=true", "env.backend=ale_vector"]),
]
SYNC_TARGET, BOUND_TARGET = 1.3, 0.9
"""Targets: each recipe's (IMPALA's, APPO's) best row at least this multiple of the best synchronous PPO row's
frames/s, and at least this fraction of its own overlap bound."""


# ---------------------------------------------------------------------------------------------- the bound
def backend_of(overrides: list[str]) -> str:
    """The env backend a row's overrides choose (``gymnasium``, env=atari's default, unless one is named)."""
    return next((o.split("=", 1)[1] for o in overrides if o.startswith("env.backend=")), "gymnasium")


def bound_key(recipe: str, backend: str) -> str:
    return recipe if backend == "gymnasium" else f"{recipe} {backend}"


def recipe_phases(recipe: str, updates: int, seed: int, backend: str = "gymnasium",
                  overrides: tuple[str, ...] = ()) -> dict:
    """``recipe``'s collect and learn seconds per update on one torch thread (medians, the first update excluded:
    it warms up), and the frames of one update; its envs on ``backend``, a threaded one (``ale_vector``,
    ``envpool``) on one thread of its own too; ``overrides``: more launcher overrides (``--override``), composed
    as the rows compose them."""
    import torch
    from omegaconf import OmegaConf
    from tensordict import TensorDict

    from components.envs import EnvMaker
    from recipes.impala import learn, time_major, unrolls_of
    from recipes.actor_critic import Learner, make_policy

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    composed = compose_launcher([f"+recipe={recipe}", "env=atari", f"env.backend={backend}"]
                                + ([] if backend == "gymnasium" else ["++env.kwargs.num_threads=1"]) + list(overrides))
    cfg = OmegaConf.to_object(composed.recipe)
    maker = EnvMaker.from_config(composed.env)
    envs = maker.vector(cfg.num_envs)
    learner = Learner(cfg, maker.spec())
    acting = make_policy(cfg, maker.spec())  # the behaviour policy, as the inference server builds it
    acting.load_state_dict(learner.policy.state_dict())
    optimizer = learner.optimizer(cfg.lr)
    rounds = max(1, cfg.batch_size // cfg.num_envs)  # rounds of every env's unroll per update
    obs, _ = envs.reset(seed=seed)
    obs = torch.as_tensor(obs)
    collect, learn_s = [], []
    for update in range(updates):
        t0 = time.perf_counter()
        unrolls = []
        for _ in range(rounds):
            steps = []
            for _ in range(cfg.unroll_length):
                with torch.no_grad():
                    acted = acting(TensorDict({"observation": obs}, batch_size=[cfg.num_envs]))
                nxt, reward, terminated, truncated, _ = envs.step(acted.get("action").numpy())
                nxt = torch.as_tensor(nxt)
                terminated, done = torch.as_tensor(terminated), torch.as_tensor(terminated | truncated)
                steps.append(acted.update({
                    "policy_version": torch.zeros(cfg.num_envs, dtype=torch.int64),
                    "next": {"observation": nxt, "reward": torch.as_tensor(reward, dtype=torch.float32),
                             "terminated": terminated, "done": done}}))
                obs = nxt
            unrolls.append(torch.stack(steps))  # [time, env]
        t1 = time.perf_counter()
        batch = time_major(unrolls_of(torch.cat(unrolls, dim=1)[:, : cfg.batch_size]))  # as the queue hands it over
        t_learn = time.perf_counter()
        learn(batch, learner, optimizer, cfg)
        t2 = time.perf_counter()
        acting.load_state_dict(learner.policy.state_dict())  # the weight push: the next round acts as the recipe's
        if update:
            collect.append((t1 - t0) * cfg.batch_size / (rounds * cfg.num_envs))
            learn_s.append(t2 - t_learn)
    envs.close()
    return {"collect_s": statistics.median(collect), "learn_s": statistics.median(learn_s),
            "frames": cfg.batch_size * cfg.unroll_length}


# ---------------------------------------------------------------------------------------------- the rows
def run_ours(recipe: str, overrides: list[str], frames: int, seed: int, timeout: float) -> dict:
    summary, _ = launcher_run([f"+recipe={recipe}", "env=atari", f"seed={seed}", f"recipe.total_frames={frames}",
                               "launcher.progress=false", "launcher.plot=false", *overrides], timeout)
    return {"fps": steady_rate(summary), "whole_fps": summary["fps"],
            "frames": summary["frames"], "return": summary["final_mean_return"], "episodes": summary["episodes"]}


def run_sample_factory(python: str, frames: int, seed: int, timeout: float, overrides: list[str] = ()) -> dict:
    result = sample_factory_appo(python, frames, seed, timeout, wrappers="ours", overrides=overrides)
    # its rate once training started (its worker processes spawned, its first batch collected): what it gains from
    # leaving out its start-up is more than what ours leaves out (the services' start), never less
    return {"fps": steady_rate(result), "frames": result["frames"],
            "return": result["mean_return_last"], "episodes": result["episodes"]}


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=8192, help="agent steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rows", nargs="+", default=None, help="labels of our rows to run (default: all)")
    parser.add_argument("--sf-python", default=None, help="the python of Sample Factory's venv (no SF row without it)")
    parser.add_argument("--phase-updates", type=int, default=4, help="updates timed for each recipe's bound")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--override", nargs="*", default=[], metavar="KEY=VALUE",
                        help="more launcher overrides for the IMPALA and APPO rows, their overlap bounds and Sample "
                             "Factory's update (its recipe.* keys); PPO's rows, the reference, keep their settings")
    return parser


def row_overrides(recipe: str, overrides: list[str], more: list[str]) -> list[str]:
    """A row's launcher overrides: its own, then ``--override``'s unless it is one of PPO's reference rows."""
    return [*overrides, *([] if recipe == "ppo" else more)]


def main() -> None:
    args = arguments().parse_args()
    rec = Results("impala_atari")
    cores = os.cpu_count() or 1
    rows = [row for row in ROWS if not args.rows or row[0] in args.rows]
    labels = [label for label, _, _ in rows] + (["Sample Factory 2.1.1 APPO"] if args.sf_python else [])
    results: dict[str, list[dict]] = {label: [] for label in labels}
    # a bound per recipe and env backend its rows use (PPO's rows are what IMPALA is held against: no bound)
    bounded = {(recipe, backend_of(overrides)) for _, recipe, overrides in rows if recipe != "ppo"}
    phases: dict[tuple, list[dict]] = {key: [] for key in sorted(bounded)}
    key_of = {label: bound_key(recipe, backend_of(overrides)) for label, recipe, overrides in rows}
    # One round per seed, each running every row once: a drift of the machine's speed reaches every row alike.
    for seed in args.seeds:
        for recipe, backend in phases:
            phases[recipe, backend].append(in_child(
                "impala_atari", f"recipe_phases({recipe!r}, {args.phase_updates}, {seed}, {backend!r}, "
                f"{tuple(args.override)!r})", args.timeout))
            p = phases[recipe, backend][-1]
            print(f"{bound_key(recipe, backend) + ' phases':>40} seed={seed}: collect {p['collect_s']:.2f} s + learn "
                  f"{p['learn_s']:.2f} s per update of {p['frames']} frames on one thread", file=sys.stderr, flush=True)
        for label, recipe, overrides in rows:
            results[label].append(run_ours(recipe, row_overrides(recipe, overrides, args.override), args.frames,
                                           seed, args.timeout))
        if args.sf_python:
            results[labels[-1]].append(run_sample_factory(args.sf_python, args.frames, seed, args.timeout,
                                                          args.override))
        for label in labels:
            r = results[label][-1]
            whole = f" ({r['whole_fps']:,.0f} over the whole run)" if "whole_fps" in r else ""
            print(f"{label:>32} seed={seed}: {r['frames']:,} frames, {r['fps']:,.0f} frames/s{whole}, return "
                  f"{r['return'] if r['return'] is not None else float('nan'):.1f} ({r['episodes']} episodes)",
                  file=sys.stderr, flush=True)

    bounds = {}
    # L1 is the same update whichever backend collected its batch: one median over every timing of the recipe, so
    # two backends' bounds differ only by their collect phase (timed apart, two medians of 3 had differed by 12%)
    learn_times: dict[str, list[float]] = {}
    for (recipe, _), timed in phases.items():
        learn_times.setdefault(recipe, []).extend(p["learn_s"] for p in timed)
    for (recipe, backend), timed in phases.items():
        key = bound_key(recipe, backend)
        c1, l1 = statistics.median(p["collect_s"] for p in timed), statistics.median(learn_times[recipe])
        bounds[key] = timed[0]["frames"] / ((c1 + l1) / cores)
        rec.note(f"{key}'s overlap bound: C1 = {c1:.2f} s collect and L1 = {l1:.2f} s learn per update of "
                 f"{timed[0]['frames']} frames, each on one torch thread, {cores} cores: {bounds[key]:,.0f} frames/s.")
    sync = [label for label, recipe, _ in rows if recipe == "ppo"]
    fps_of = {label: spread(r["fps"] for r in results[label]) for label in labels}
    best_sync = max((fps_of[label].median for label in sync if fps_of[label]), default=None)
    title = (f"IMPALA and APPO on {ENV_ID} from pixels, {args.frames:,} frames per run, seeds {args.seeds}"
             + (f", IMPALA and APPO with {' '.join(args.override)}" if args.override else "")
             + ": median frames/s and mean return of the last 100 episodes [range]")
    columns = ["row", "frames/s", "range", "x best sync PPO", "of own bound", "return", "range"]
    table = []
    for label in labels:
        fps, returns = fps_of[label], spread(r["return"] for r in results[label])
        median = fps and fps.median
        key = key_of.get(label)
        table.append([label, median, fps.range() if fps else "-", median / best_sync if best_sync else None,
                      median / bounds[key] if key in bounds else None, returns and returns.median,
                      returns.range(",.1f") if returns else "-"])
    show(rec, title, columns, table)
    rec.plot("fps", f"IMPALA and APPO on {ENV_ID}: median frames/s per row, and each recipe's overlap bound",
             x=[r[0] for r in table] + [f"{k} bound" for k in bounds],
             series={"frames/s": [r[1] for r in table] + list(bounds.values())},
             kind="bar", xlabel="row", ylabel="frames/s")

    print(f"\n### Targets ({cores} cores)\n")
    for recipe in ("impala", "appo"):
        mine = [row for row in table if row[0].startswith(recipe + " ")]
        if not mine or not best_sync:
            continue
        best = max(mine, key=lambda row: row[1])
        verdict = "PASS" if best[3] >= SYNC_TARGET else "MISS"
        say(rec.verdict, f"{verdict} best {recipe.upper()} row {best[0]}: {best[1]:,.0f} frames/s = {best[3]:.2f}x "
            f"the best synchronous PPO row's {best_sync:,.0f} (target >= {SYNC_TARGET})")
        for backend in sorted(b for r, b in phases if r == recipe):  # each backend's best row, against its bound
            key = bound_key(recipe, backend)
            top = max((row for row in table if key_of.get(row[0]) == key), key=lambda row: row[1])
            verdict = "PASS" if top[4] >= BOUND_TARGET else "MISS"
            say(rec.verdict, f"{verdict} best {recipe.upper()} row on {backend}, {top[0]}: {top[4]:.3f} of its "
                f"overlap bound {bounds[key]:,.0f} frames/s (target >= {BOUND_TARGET})")
    ppo_return = max((row[5] for row in table if row[0].startswith("ppo ") and row[5] is not None), default=None)
    for recipe in ("impala", "appo"):
        mine = [row for row in table if row[0].startswith(recipe + " ") and row[5] is not None]
        if mine and ppo_return is not None:
            best = max(mine, key=lambda row: row[5])
            verdict = "PASS" if best[5] >= ppo_return else "MISS"
            say(rec.verdict, f"{verdict} {recipe}'s best return at {args.frames:,} frames, {best[0]}: {best[5]:.2f} "
                f"beside PPO's best {ppo_return:.2f} (target: at least PPO's)")
    sf = next((row for row in table if row[0].startswith("Sample Factory")), None)
    appo = [row for row in table if row[0].startswith("appo ")]
    if sf is not None and appo:  # like with like: Sample Factory makes APPO's update (sample_factory_appo)
        ours = max(appo, key=lambda r: r[1])
        verdict = "PASS" if ours[1] >= sf[1] else "MISS"
        say(rec.verdict, f"{verdict} our best APPO row {ours[0]}: {ours[1]:,.0f} frames/s = {ours[1] / sf[1]:.2f}x "
            f"Sample Factory's APPO {sf[1]:,.0f} (target: at least its frames/s)")
    rec.save()


if __name__ == "__main__":
    main()
