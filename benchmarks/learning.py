"""Learning curves: a recipe's mean episode return against frames for several seeds, per placement, through the
launcher; several recipes side by side (``--recipes ppo impala appo``) at the same budget.

Each run is ``python -m launcher +recipe=R <env> seed=S recipe.total_frames=N`` in its own subprocess; its curve
is the ``train/mean_return`` series of its ``metrics.csv`` (the mean return of the recent finished episodes, as the
launcher's progress line and ``learning_curve.png`` show it). The curves of the seeds are read at common frame
counts (each seed's latest point at or before the count) and summarised as the median with the range over seeds.
Published figures (`QUOTED` in `benchmarks/_results.py`) are printed beside them with the frame count they were
measured at, and drawn on the curves as quoted stars.

    python benchmarks/learning.py minatar --seeds 0 1 2 --frames 1000000
    python benchmarks/learning.py breakout --seeds 0 1 2 --frames 2000000
    python benchmarks/learning.py minatar --services direct "process/shared_memory" --frames 300000
    python benchmarks/learning.py minatar --recipes ppo impala appo --services "process/shared_memory"
    python benchmarks/learning.py breakout --recipes ppo impala --services "process/local_policy" --frames 300000 --jobs 3
    python benchmarks/learning.py breakout --recipes ppo appo --services "process/local_policy" --frames 300000 \
        --jobs 3 --ppo-from 2
    python benchmarks/learning.py breakout --recipes ppo appo --services "process/local_policy" --frames 300000 \
        --jobs 3 --ppo-from 2 --sf-python /tmp/sf/venv/bin/python

``--sf-python PYTHON`` (Atari presets) adds Sample Factory 2.1.1's APPO (``benchmarks/sample_factory_peer.py``, run
by the interpreter of its own venv) on each seed, on the game as ``env=atari`` plays it (``--wrappers ours``: sticky
actions, no end on a lost life, no FIRE at reset), making our APPO's update (``conf/recipe_env/appo_atari.yaml``,
with ``--override``'s ``recipe.*`` keys); its curve is the mean return of its last 100 games, at the agent steps SF
had counted when each ended.

``--ppo-from N`` reads PPO's rows from run N of the results file (``benchmarks/results/learning_<preset>.json``,
1 the oldest kept) instead of training PPO again: the run must have had the same budget, seeds and placement (it
is refused otherwise), and the tables name the run they come from. PPO is synchronous: its returns at a frame count
depend on the seed and the frames, not on the machine's load, so a recorded curve stands in for one trained beside
the others; its frames/s belongs to its own run.

Frames/s are each run's rate from its second batch on (the recipes' ``steady_fps``; Sample Factory's after its first
training iteration). Frames count agent steps, as the recipes and CleanRL's ``global_step`` do: on Atari each is 4
emulator frames (frame skip 4); MinAtar and MuJoCo have no frame skip. Presets (``conf/recipe_env``): ``minatar``
(MinAtar/Breakout-v1), ``breakout`` (ALE/Breakout-v5), ``pong`` (ALE/Pong-v5), ``halfcheetah`` (HalfCheetah-v5);
each recipe runs with its own settings for the env (``conf/recipe_env/<recipe>_<env>.yaml``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shlex
import statistics
import sys
from dataclasses import dataclass

from _harness import ROOT, launcher_run, spread, steady_rate  # first: the checkout on sys.path (_harness.py)
from _results import QUOTED, RESULTS_DIR, Quoted, Results, load, say, show
from _sample_factory import sample_factory_appo


@dataclass(frozen=True)
class Preset:
    overrides: tuple[str, ...]
    frames: int
    unit: str
    published: Quoted | None = None


PRESETS = {
    "minatar": Preset(("env=minatar", "env.id=MinAtar/Breakout-v1"), 1_000_000, "agent steps (no frame skip)"),
    "breakout": Preset(("env=atari", "env.id=ALE/Breakout-v5"), 2_000_000,
                       "agent steps (4 emulator frames each)", QUOTED["ALE/Breakout-v5"]),
    "pong": Preset(("env=atari", "env.id=ALE/Pong-v5"), 2_000_000, "agent steps (4 emulator frames each)",
                   QUOTED["ALE/Pong-v5"]),
    "halfcheetah": Preset(("env=mujoco", "env.id=HalfCheetah-v5"), 1_000_000, "agent steps (no frame skip)",
                          QUOTED["HalfCheetah-v5"]),
}
"""The presets; their published figures are `QUOTED`'s (`benchmarks/_results.py`), which the plots draw too."""
PLACEMENTS = {
    "direct": ["service=direct"],
    "process/shared_memory": ["service=process", "transport=shared_memory"],
    "process/local_policy": ["service=process", "components.collector.local_policy=true"],
    "process/shared_memory async": ["service=process", "transport=shared_memory", "components.collector.sync=false"],
    "ray/distributed async": ["service=ray", "transport=distributed", "components.collector.sync=false"],
}
RECIPES = ("ppo", "impala", "appo")
SF_LABEL = "Sample Factory 2.1.1 APPO"
"""The row of ``--sf-python``: Sample Factory's APPO on the same game, same wrappers, seeds and budget."""
POINTS = 20
"""Frame counts the curves are read at (evenly spaced up to the budget)."""
READ_AT = (POINTS // 4 - 1, POINTS // 2 - 1, POINTS - 1)
"""The counts the tables show: a quarter, half and all of the budget."""


def run_one(preset: Preset, placement: list[str], seed: int, frames: int, extra: list[str], timeout: float,
            keep: str | None = None, label: str = "", recipe: str = "ppo") -> dict:
    """One launcher run; returns its curve (``(frames, mean return)`` points), frames/s and wall seconds. Its run
    directory is kept under ``keep`` (``<label>/seed<S>``) where given."""
    from launcher.sweep import read_job

    run_dir = os.path.join(keep, label.replace("/", "_").replace(" ", "_"), f"seed{seed}") if keep else None
    job, seconds = launcher_run([f"+recipe={recipe}", *preset.overrides, *placement, f"seed={seed}",
                                 f"recipe.total_frames={frames}", "launcher.progress=false", "launcher.plot=false",
                                 *extra], timeout, run_dir, read=read_job)
    return {"curve": job.curve, "fps": steady_rate(job.summary), "wall_s": seconds, "frames": job.summary.get("frames")}


def at(curve: list[tuple[float, float]], frames: float) -> float | None:
    """A curve's value at ``frames``: its latest point at or before it (``None`` before its first point)."""
    value = None
    for x, y in curve:
        if x > frames:
            break
        value = y
    return value


def summarise(curves: list[list[tuple[float, float]]], grid: list[int]) -> tuple[list, list, list]:
    """Median, low and high over seeds at each frame count of ``grid`` (``None`` where a seed has no point yet)."""
    med, low, high = [], [], []
    for g in grid:
        values = [at(c, g) for c in curves]
        got = spread(values) if None not in values else None
        med.append(got and got.median)
        low.append(got and got.low)
        high.append(got and got.high)
    return med, low, high


def per_frame_against(rec: Results, label: str, other: str, series: dict, grid: list[int]) -> None:
    """Verdicts: row ``label``'s learning per frame against row ``other``'s, by the median final return and by the
    median curve's mean over the budget (the area under it: how early it learns)."""
    def area(curve: list) -> float | None:
        return None if None in curve else statistics.fmean(curve)

    ours, theirs_curve = series[label], series[other]
    for what, mine, theirs in (("final return", ours[-1], theirs_curve[-1]),
                               ("mean over the curve", area(ours), area(theirs_curve))):
        if mine is None or theirs is None:
            continue
        verdict = "PASS" if mine >= theirs else "MISS"
        ratio = f" ({mine / theirs:.2f}x)" if theirs else ""
        say(rec.verdict, f"{verdict} {label}: {what} {mine:.2f} against {other}'s {theirs:.2f}{ratio} at "
            f"{grid[-1]:,} frames")


def sample_factory_curve(result: dict, window: int = 100) -> list[tuple[float, float]]:
    """Sample Factory's games as a curve like ours: at each game's end (the agent steps SF had counted when its
    report arrived), the mean return of the last ``window`` games."""
    returns, curve = result["returns"], []
    for i, frames in enumerate(result["returns_at"]):
        recent = returns[max(0, i + 1 - window): i + 1]
        curve.append((frames, sum(recent) / len(recent)))
    return curve


def recorded_ppo(preset_name: str, run_number: int, frames: int, seeds: list[int], placements: list[str],
                 directory: str | None = None) -> dict:
    """PPO's rows from run ``run_number`` (1 the oldest) of ``learning_<preset>.json`` (in ``directory``, default
    ``benchmarks/results``), per placement: its median curve and band over seeds, its summary row and its per-seed
    rows. Refuses a run whose budget or seeds differ, or that lacks PPO in one of ``placements``."""
    path = os.path.join(directory or RESULTS_DIR, f"learning_{preset_name}.json")
    runs = load(path)
    if not 1 <= run_number <= len(runs):
        raise SystemExit(f"--ppo-from {run_number}: {os.path.relpath(path, ROOT)} holds runs 1-{len(runs)}")
    run = runs[run_number - 1]
    ran = arguments().parse_args(shlex.split(run["command"])[2:])
    ran_frames = ran.frames or PRESETS[preset_name].frames
    if ran.preset != preset_name or ran_frames != frames or ran.seeds != seeds:
        raise SystemExit(f"--ppo-from {run_number}: that run trained {ran_frames:,} frames on seeds {ran.seeds}, "
                         f"this one {frames:,} on {seeds}: {run['command']}")
    plot = next(p for p in run["plots"] if p["name"] == "curves")
    summary, each = run["tables"][0], run["tables"][1]
    # named by its date and commit (the history table's columns), not by its place in the file
    where = f"recorded in {os.path.basename(path)} on {run['date'][:10]} at {run['commit']}"
    found = {}
    for placement in placements:
        label = f"ppo {placement}"
        if label not in plot["series"]:
            raise SystemExit(f"--ppo-from {run_number}: no '{label}' in {where}")
        found[placement] = {
            "median": plot["series"][label], "band": tuple(plot["bands"][label]),
            "row": next([f"{label} ({where})", *r[1:]] for r in summary["rows"] if r[0] == label),
            "per_seed": [[f"{label} (recorded)", *r[1:]] for r in each["rows"] if r[0] == label], "where": where,
            "command": run["command"]}
    return found


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("--frames", type=int, default=None, help="agent steps per run (default: the preset's)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--recipes", nargs="+", default=["ppo"], choices=RECIPES,
                        help="recipes to run in every placement, rows named '<recipe> <placement>' (default: ppo)")
    parser.add_argument("--services", nargs="+", default=["direct"], choices=sorted(PLACEMENTS),
                        help="placements to run (default: direct)")
    parser.add_argument("--override", nargs="*", default=[], help="more launcher overrides for every run")
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds one run may take")
    parser.add_argument("--jobs", type=int, default=1,
                        help="seeds run at once (each on one torch thread; their frames/s then share the cores)")
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep every run directory under DIR")
    parser.add_argument("--sf-python", default=None, metavar="PYTHON",
                        help="Atari presets: also train Sample Factory 2.1.1's APPO on each seed, on the game as "
                             "env=atari plays it, with this interpreter of its venv")
    parser.add_argument("--ppo-from", type=int, default=None, metavar="N",
                        help="read PPO's rows from run N of this preset's results file instead of training it "
                             "(same budget, seeds and placements)")
    return parser


def main() -> None:
    parser = arguments()
    args = parser.parse_args()
    if args.ppo_from is not None and "ppo" not in args.recipes:
        parser.error("--ppo-from reads PPO's rows: add ppo to --recipes")
    if args.sf_python and "env=atari" not in PRESETS[args.preset].overrides:
        parser.error(f"--sf-python runs Sample Factory's Atari APPO: preset {args.preset} is not an Atari game")
    preset = PRESETS[args.preset]
    frames = args.frames or preset.frames
    rec = Results("learning", record=f"learning_{args.preset}")
    grid = [round(frames * (i + 1) / POINTS) for i in range(POINTS)]
    series, bands, rows, per_seed = {}, {}, [], []
    several = len(args.recipes) > 1 or bool(args.sf_python)
    at_once = min(args.jobs, len(args.seeds))  # the seeds of a row run at once; the rows one after another
    labels = [(recipe, placement, f"{recipe} {placement}" if several else placement)
              for recipe in args.recipes for placement in args.services]
    recorded = ({} if args.ppo_from is None else
                recorded_ppo(args.preset, args.ppo_from, frames, args.seeds, args.services))

    def add_row(label: str, runs: list[dict]) -> None:  # a row's runs, one per seed: its curve, table rows, frames/s
        med, low, high = summarise([r["curve"] for r in runs], grid)
        series[label], bands[label] = med, (low, high)
        fps = spread(r["fps"] for r in runs)
        cells = ["-" if med[i] is None else f"{med[i]:.2f} [{low[i]:.2f}-{high[i]:.2f}]" for i in READ_AT]
        rows.append([label, *cells, fps.median, fps.range()])
        per_seed.extend([label, seed, *(at(r["curve"], grid[i]) for i in READ_AT), r["fps"]]
                        for seed, r in zip(args.seeds, runs))

    for recipe, placement, label in labels:
        if recipe == "ppo" and placement in recorded:
            found = recorded[placement]
            series[label], bands[label] = found["median"], found["band"]
            rows.append(found["row"])
            per_seed += found["per_seed"]
            continue
        extra = [*args.override, *(["launcher.torch_threads=1"] if at_once > 1 else [])]

        def one(seed: int, label: str = label, extra: list[str] = extra, recipe: str = recipe,
                placement: str = placement) -> dict:
            run = run_one(preset, PLACEMENTS[placement], seed, frames, extra, args.timeout, args.keep, label, recipe)
            final = run["curve"][-1][1] if run["curve"] else float("nan")
            print(f"{label:>28} seed={seed}: {run['frames']:,} frames in {run['wall_s']:.0f} s "
                  f"({run['fps']:,.0f} frames/s), final mean return {final:.2f}", file=sys.stderr, flush=True)
            return run

        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            add_row(label, list(pool.map(one, args.seeds)))

    env_id = next(o.split("=", 1)[1] for o in preset.overrides if o.startswith("env.id="))
    if args.sf_python:
        game = env_id.split("/")[1].split("-")[0].lower()

        def peer(seed: int) -> dict:
            result = sample_factory_appo(args.sf_python, frames, seed, args.timeout, wrappers="ours",
                                         env=f"atari_{game}", overrides=args.override)
            result["curve"] = sample_factory_curve(result)
            result["fps"] = steady_rate(result)
            print(f"{SF_LABEL:>28} seed={seed}: {result['frames']:,} frames ({result['fps']:,.0f} frames/s), "
                  f"{result['episodes']} games, final mean return {result['mean_return_last'] or float('nan'):.2f}",
                  file=sys.stderr, flush=True)
            return result

        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            runs = list(pool.map(peer, args.seeds))
        add_row(SF_LABEL, runs)
        labels.append(("sf", "", SF_LABEL))
    returns_at = [f"return at {grid[i]:,}" for i in READ_AT]
    columns = ["run" if several else "placement", *returns_at, "frames/s", "frames/s range"]
    names = " and ".join([r.upper() for r in args.recipes] + (["Sample Factory's APPO"] if args.sf_python else []))
    title = (f"{names} on {env_id}, {frames:,} {preset.unit}, seeds {args.seeds}: median mean return of recent "
             f"episodes [range over seeds], and training frames/s")
    show(rec, title, columns, rows, note="" if at_once == 1 else
         f"{at_once} seeds ran at once on one torch thread each: frames/s shares the cores among them.")
    show(rec, f"Each seed: mean return of recent episodes at {', '.join(f'{grid[i]:,}' for i in READ_AT)} frames",
         ["run" if several else "placement", "seed", *returns_at, "frames/s"], per_seed)
    rec.plot("curves", f"{names} on {env_id}: median over seeds {args.seeds}, shaded: their range", x=grid,
             series=series, bands=bands, xlabel=preset.unit, ylabel="mean episode return",
             references=[env_id] if env_id in QUOTED else [])
    if several and "ppo" in args.recipes:  # each other recipe against PPO in the same placement
        for recipe, placement, label in labels:
            if recipe != "ppo" and f"ppo {placement}" in series:
                per_frame_against(rec, label, f"ppo {placement}", series, grid)
    if args.sf_python:  # our APPO rows against Sample Factory's, and Sample Factory's against PPO's
        for recipe, placement, label in labels:
            if recipe == "appo":
                per_frame_against(rec, label, SF_LABEL, series, grid)
            elif recipe == "ppo":
                per_frame_against(rec, SF_LABEL, label, series, grid)
    for placement, found in recorded.items():
        say(rec.note, f"PPO {placement} was not trained again: its curve, returns and frames/s are {found['where']} "
            f"({found['command']}).")
    if preset.published is not None:
        pub = preset.published
        where = "at the same frame count" if pub.frames == frames else f"at {pub.frames:,} agent steps"
        say(rec.note, f"Published: {pub.source} ({pub.url}): {pub.mean:g} +/- {pub.spread:g} {where}.")
        if pub.frames == frames:
            for *_, label in labels:
                final = series[label][-1]
                verdict = "PASS" if final is not None and final >= pub.mean - pub.spread else "MISS"
                say(rec.verdict, f"{verdict} {label}: median final return "
                    f"{'none' if final is None else f'{final:.2f}'} against the published {pub.mean:g} - "
                    f"{pub.spread:g} at {frames:,} agent steps")
    rec.save()


if __name__ == "__main__":
    main()
