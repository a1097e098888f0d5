"""PPO on Atari from pixels: training frames/s per placement, beside a CleanRL-style loop written here and the
overlap bound, all measured in the same run.

- **CleanRL-style loop**: one process doing what CleanRL's ``ppo_atari.py`` does, written in this file: gymnasium's
  sync vector env of 8 Breakout envs with the same preprocessing (``components.envs.families.atari``), the same
  Nature CNN (``recipes.networks``), the same hyperparameters (``conf/recipe_env/ppo_atari.yaml``), torch's default
  threads.
- **Our rows**: ``python -m launcher +recipe=ppo env=atari`` subprocesses, one per placement and seed, for the same
  number of updates; frames/s is the recipe's own (training, start-up excluded).
- **The overlap bound**: the loop once more on one torch thread, timing its collect phase (C1) and its learn phase
  (L1) per update. With every core busy and nothing wasted an update takes no less than ``(C1 + L1) / cores``, so
  no placement can beat ``frames per update / ((C1 + L1) / cores)`` frames/s; each row is reported as a fraction of
  it. (This is the most collection overlapping learning can give, ``sync=false``; the learner, not collection, is
  what a CPU machine has to hide.)

    python benchmarks/atari.py --updates 4
    python benchmarks/atari.py --updates 4 --services direct "process/shared_memory async" --seeds 0 1 2

Frames count agent steps (each 4 emulator frames at frame skip 4), as CleanRL's ``global_step`` does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from _harness import in_child, launcher_run, spread  # first: the checkout on sys.path (benchmarks/_harness.py)
from _results import Results, say, show

ENV_ID = "ALE/Breakout-v5"
PLACEMENTS = [
    ("direct", ["service=direct"]),
    ("thread async", ["service=thread", "components.collector.sync=false"]),
    ("process/shared_memory", ["service=process", "transport=shared_memory"]),
    ("process/shared_memory async", ["service=process", "transport=shared_memory", "components.collector.sync=false"]),
    ("process/local_policy async", ["service=process", "components.collector.local_policy=true",
                                    "components.collector.sync=false"]),
    ("process/local_policy async nice", ["service=process", "components.collector.local_policy=true",
                                         "components.collector.sync=false", "components.collector.resources.nice=19"]),
    ("process/shared_memory async nice", ["service=process", "transport=shared_memory",
                                          "components.collector.sync=false", "components.collector.resources.nice=19",
                                          "components.inference.resources.nice=19"]),
    ("ray/distributed async", ["service=ray", "transport=distributed", "components.collector.sync=false"]),
]
ASYNC_TARGET, LOOP_TARGET = 0.9, 1.0
"""Targets: the best ``async`` process or Ray row at least this fraction of the overlap bound; direct at least this
multiple of the CleanRL-style loop's frames/s."""


# ---------------------------------------------------------------------------------------------- the loop
def cleanrl_loop(updates: int, threads: int | None, seed: int) -> dict:
    """CleanRL's ppo_atari update, written out: collect ``num_envs x num_steps``, GAE, ``update_epochs`` passes of
    ``num_minibatches`` minibatches; returns frames, seconds and the collect and learn seconds per update (the first
    update, which warms up, excluded from the phase times)."""
    import numpy as np
    import torch
    from torch import nn

    from components.envs.families.atari import AtariConfig
    from components.envs import EnvMaker
    from recipes.networks import encoder, layer

    if threads is not None:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    num_envs, num_steps, minibatches, epochs = 8, 128, 4, 4
    lr, gamma, lam, clip, ent_coef, vf_coef, max_norm = 2.5e-4, 0.99, 0.95, 0.1, 0.01, 0.5, 0.5
    envs = EnvMaker(id=ENV_ID, atari=AtariConfig()).vector(num_envs)
    trunk = encoder("nature_cnn", (4, 84, 84), 1 / 255)
    actor, critic = layer(nn.Linear(512, envs.single_action_space.n), 0.01), layer(nn.Linear(512, 1), 1.0)
    params = [*trunk.parameters(), *actor.parameters(), *critic.parameters()]
    optimizer = torch.optim.Adam(params, lr=lr, eps=1e-5)
    obs_buf = torch.zeros((num_steps, num_envs, 4, 84, 84), dtype=torch.uint8)
    act_buf, logp_buf = torch.zeros((num_steps, num_envs), dtype=torch.long), torch.zeros((num_steps, num_envs))
    rew_buf, done_buf, val_buf = (torch.zeros((num_steps, num_envs)) for _ in range(3))
    obs, _ = envs.reset(seed=[seed + i for i in range(num_envs)])
    obs, done = torch.from_numpy(np.asarray(obs)), torch.zeros(num_envs)
    collect, learn = [], []
    start = time.perf_counter()
    for update in range(updates):
        optimizer.param_groups[0]["lr"] = lr * (1 - update / updates)
        t0 = time.perf_counter()
        for step in range(num_steps):
            obs_buf[step], done_buf[step] = obs, done
            with torch.no_grad():
                features = trunk(obs)
                dist = torch.distributions.Categorical(logits=actor(features))
                action = dist.sample()
                logp_buf[step], val_buf[step] = dist.log_prob(action), critic(features).squeeze(-1)
            act_buf[step] = action
            nxt, reward, terminated, truncated, _ = envs.step(action.numpy())
            rew_buf[step] = torch.as_tensor(np.sign(reward), dtype=torch.float32)
            obs, done = torch.from_numpy(np.asarray(nxt)), torch.as_tensor(terminated | truncated, dtype=torch.float32)
        t1 = time.perf_counter()
        with torch.no_grad():
            next_value = critic(trunk(obs)).squeeze(-1)
            advantages, running = torch.zeros_like(rew_buf), torch.zeros(num_envs)
            for t in reversed(range(num_steps)):
                not_done = 1.0 - (done if t == num_steps - 1 else done_buf[t + 1])
                following = next_value if t == num_steps - 1 else val_buf[t + 1]
                delta = rew_buf[t] + gamma * following * not_done - val_buf[t]
                running = delta + gamma * lam * not_done * running
                advantages[t] = running
            returns = advantages + val_buf
        b_obs, b_act, b_logp = obs_buf.reshape(-1, 4, 84, 84), act_buf.reshape(-1), logp_buf.reshape(-1)
        b_adv, b_ret, b_val = advantages.reshape(-1), returns.reshape(-1), val_buf.reshape(-1)
        size = num_envs * num_steps // minibatches
        for _ in range(epochs):
            order = torch.randperm(num_envs * num_steps)
            for mb in order.split(size):
                features = trunk(b_obs[mb])
                dist = torch.distributions.Categorical(logits=actor(features))
                ratio = (dist.log_prob(b_act[mb]) - b_logp[mb]).exp()
                adv = (b_adv[mb] - b_adv[mb].mean()) / (b_adv[mb].std() + 1e-8)
                pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
                value = critic(features).squeeze(-1)
                clipped = b_val[mb] + (value - b_val[mb]).clamp(-clip, clip)
                v_loss = 0.5 * torch.max((value - b_ret[mb]) ** 2, (clipped - b_ret[mb]) ** 2).mean()
                loss = pg - ent_coef * dist.entropy().mean() + vf_coef * v_loss
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, max_norm)
                optimizer.step()
        t2 = time.perf_counter()
        if update:  # the first update warms up (allocations, the first convolutions)
            collect.append(t1 - t0)
            learn.append(t2 - t1)
    seconds = time.perf_counter() - start
    envs.close()
    frames = updates * num_envs * num_steps
    return {"frames": frames, "seconds": seconds, "fps": frames / seconds,
            "collect_s": statistics.median(collect) if collect else float("nan"),
            "learn_s": statistics.median(learn) if learn else float("nan")}


def loop_in_child(updates: int, threads: int | None, seed: int, timeout: float) -> dict:
    """`cleanrl_loop` in a fresh interpreter (its own torch threads, nothing warm from the others)."""
    return in_child("atari", f"cleanrl_loop({updates}, {threads!r}, {seed})", timeout)


# ---------------------------------------------------------------------------------------------- our rows
def run_ours(overrides: list[str], updates: int, seed: int, timeout: float) -> dict:
    return launcher_run(["+recipe=ppo", "env=atari", f"seed={seed}", f"recipe.total_frames={updates * 8 * 128}",
                         "launcher.progress=false", "launcher.plot=false", *overrides], timeout)[0]


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=4, help="PPO updates per run (8 x 128 frames each)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--services", nargs="+", default=None, help="labels of our rows to run (default: all)")
    parser.add_argument("--timeout", type=float, default=900)
    return parser


def main() -> None:
    args = arguments().parse_args()
    if args.updates < 2:
        raise SystemExit("--updates must be at least 2 (the first update warms up)")
    rec = Results("atari")
    cores = os.cpu_count() or 1
    med = statistics.median
    placements = [(label, o) for label, o in PLACEMENTS if not args.services or label in args.services]
    loops, single, fps = [], [], {label: [] for label, _ in placements}
    # One round per seed, each running every row once: a drift of the machine's speed (cores doze and wake over
    # minutes) reaches the loop, the bound and our rows alike instead of whichever rows run last.
    for seed in args.seeds:
        loops.append(loop_in_child(args.updates, None, seed, args.timeout))
        single.append(loop_in_child(args.updates, 1, seed, args.timeout))
        print(f"{'CleanRL-style loop':>30} seed={seed}: {loops[-1]['fps']:,.0f} frames/s; on 1 thread "
              f"{single[-1]['fps']:,.0f} (collect {single[-1]['collect_s']:.2f} s "
              f"+ learn {single[-1]['learn_s']:.2f} s "
              f"per update)", file=sys.stderr, flush=True)
        for label, overrides in placements:
            summary = run_ours(overrides, args.updates, seed, args.timeout)
            fps[label].append(summary["fps"])
            print(f"{label:>30} seed={seed}: {summary['frames']:,} frames, {summary['fps']:,.0f} frames/s",
                  file=sys.stderr, flush=True)
    c1, l1 = med(r["collect_s"] for r in single), med(r["learn_s"] for r in single)
    bound = 8 * 128 / ((c1 + l1) / cores)
    print(f"overlap bound: C1 {c1:.2f} s + L1 {l1:.2f} s per update on one thread each, {cores} cores: "
          f"{bound:,.0f} frames/s at most", file=sys.stderr)
    rows = [("CleanRL-style loop (this file)", [r["fps"] for r in loops]),
            ("CleanRL-style loop, 1 thread", [r["fps"] for r in single]), *fps.items()]

    title = (f"PPO on {ENV_ID} from pixels, {args.updates} updates of 8 x 128 frames, seeds {args.seeds}: median "
             f"frames/s [range], beside the CleanRL-style loop and the overlap bound ({bound:,.0f} frames/s)")
    columns = ["row", "frames/s", "range", "x loop", "of the bound"]
    loop_fps = med(rows[0][1])
    spreads = [(label, spread(v)) for label, v in rows]
    table = [[label, s.median, s.range(), s.median / loop_fps, s.median / bound] for label, s in spreads]
    show(rec, title, columns, table)
    rec.note(f"Overlap bound: C1 = {c1:.2f} s collect and L1 = {l1:.2f} s learn per update, each on one torch thread "
             f"(the CleanRL-style loop), {cores} cores: 1,024 frames / ((C1 + L1) / {cores}) = {bound:,.0f} frames/s.")
    rec.plot("fps", f"PPO on {ENV_ID}: median frames/s per row, and the overlap bound",
             x=[r[0] for r in table] + ["overlap bound"], series={"frames/s": [r[1] for r in table] + [bound]},
             kind="bar", xlabel="row", ylabel="frames/s")
    print(f"\n### Targets ({cores} cores)\n")
    direct = next((row for row in table if row[0] == "direct"), None)
    if direct is not None:
        verdict = "PASS" if direct[3] >= LOOP_TARGET else "MISS"
        say(rec.verdict, f"{verdict} direct: {direct[1]:,.0f} frames/s = {direct[3]:.2f}x the CleanRL-style loop's "
            f"{loop_fps:,.0f} (target >= {LOOP_TARGET:.1f}x)")
    overlapping = [row for row in table if " async" in row[0] and row[0].split("/")[0] in ("process", "ray")]
    if overlapping:
        best = max(overlapping, key=lambda row: row[1])
        verdict = "PASS" if best[4] >= ASYNC_TARGET else "MISS"
        say(rec.verdict, f"{verdict} best overlapping row {best[0]}: {best[1]:,.0f} frames/s = {best[4]:.2f} of the "
            f"overlap bound {bound:,.0f} (target >= {ASYNC_TARGET})")
    rec.save()


if __name__ == "__main__":
    main()
