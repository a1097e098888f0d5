"""Frames and seconds to solve CartPole-v1: IMPALA and APPO beside PPO, per placement, medians over seeds.

Each run is a real ``python -m launcher +recipe=<recipe> seed=S <placement>`` subprocess; its ``summary.json`` gives
whether it solved (mean return of the last 20 episodes >= 475), the frames it took, its training seconds and
frames/s. Every recipe runs on its default settings; PPO collects synchronously (its batch, then its update),
IMPALA and APPO asynchronously (a worker collects its next unrolls while the learner updates). "x PPO" is the
median frames to solve over PPO's in the same placement of the same run.

    python benchmarks/impala_cartpole.py --seeds 0 1 2
    python benchmarks/impala_cartpole.py --recipes ppo appo --services direct process/shared_memory --seeds 0 1 2 3 4
    python benchmarks/impala_cartpole.py --services thread process/process_slot ray ray/distributed monarch \
        "slurm collectors"
"""

from __future__ import annotations

import argparse
import statistics

from _harness import launcher_run, spread  # first: the checkout on sys.path (benchmarks/_harness.py)
from _results import Results, say

PLACEMENTS = {
    "direct": ["service=direct"],
    "thread": ["service=thread"],
    "process/shared_memory": ["service=process", "transport=shared_memory"],
    "process/process_slot": ["service=process", "transport=process_slot"],
    "process/local_policy": ["service=process", "components.collector.local_policy=true"],
    "ray": ["service=ray"],
    "ray/distributed": ["service=ray", "transport=distributed"],
    "monarch": ["service=monarch"],
    "slurm collectors": ["components.collector.placement=submitit", "components.collector.num_collectors=2"],
}
"""Placements by name. ``ray`` starts a local Ray cluster per run unless ``RAY_ADDRESS`` names one; ``slurm
collectors`` submits the collector workers as jobs to the Slurm the environment reaches (``.ci/local_slurm.sh start``
on one machine)."""


def run_once(recipe: str, overrides: list[str], seed: int, timeout: float) -> dict:
    return launcher_run([f"+recipe={recipe}", f"seed={seed}", "launcher.progress=false", *overrides], timeout)[0]


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--recipes", nargs="+", default=["ppo", "impala", "appo"])
    parser.add_argument("--services", nargs="+", default=["direct", "process/shared_memory", "process/local_policy"],
                        choices=sorted(PLACEMENTS))
    parser.add_argument("--timeout", type=float, default=600)
    return parser


def main() -> None:
    args = arguments().parse_args()
    rec = Results("impala_cartpole")
    results: dict[tuple[str, str], list[dict]] = {}
    for seed in args.seeds:  # in rounds: every row sees the machine in the same state, seed by seed
        for label in args.services:
            for recipe in args.recipes:
                r = run_once(recipe, PLACEMENTS[label], seed, args.timeout)
                results.setdefault((recipe, label), []).append(r)
                print(f"{recipe:>7} {label:>22} seed={seed}: {'solved' if r['solved'] else 'NOT solved'} after "
                      f"{r['frames']:,} frames, {r['wall_seconds']:.1f} s, {r['fps']:,.0f} frames/s", flush=True)
    rows = []
    for label in args.services:
        ppo = results.get(("ppo", label))
        ppo_frames = statistics.median(r["frames"] for r in ppo) if ppo else None
        for recipe in args.recipes:
            runs = results[(recipe, label)]
            frames = [r["frames"] for r in runs]
            ratio = f"{statistics.median(frames) / ppo_frames:.2f}" if ppo_frames else "-"
            rows.append([label, recipe, f"{sum(r['solved'] for r in runs)}/{len(runs)}", spread(frames).text(",.0f"),
                         ratio, spread(r["wall_seconds"] for r in runs).text(".1f"),
                         spread(r["fps"] for r in runs).text(",.0f")])
    columns = ["placement", "recipe", "solved", "frames to solve", "x PPO", "train s", "frames/s"]
    rec.table("CartPole-v1: medians (range) over seeds", columns, rows)
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(map(str, row)) + " |")
    for row in rows:
        if row[1] != "ppo" and row[4] != "-":
            verdict = "PASS" if row[2].split("/")[0] == row[2].split("/")[1] and float(row[4]) <= 1.5 else "MISS"
            say(rec.verdict, f"{verdict} {row[1]} {row[0]}: solved {row[2]}, frames to solve {row[4]}x PPO's "
                             "(target: every seed, within 1.5x)")
    print(f"recorded in {rec.save()}")


if __name__ == "__main__":
    main()
