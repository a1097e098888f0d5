"""``python -m launcher.evaluate <run dir>``: play a run's checkpointed policy and print its returns.

The policy is rebuilt as the run built it (the recipe's ``make_policy``, the run's ``resolved_config.yaml``, the
weights of its ``checkpoint.pt``) and plays whole episodes of the run's env as the evaluator service does
(`components.evaluator.play`): the deterministic policy by default, the env's own rewards, whole games.
It prints one row per episode (return, steps) and their mean, spread and range, and writes them to
``<run dir>/evaluation/evaluation.json``; with ``--video`` the first episode is recorded to
``<run dir>/evaluation/episode_0.mp4``.

A directory that is not a run's, or a run without a checkpoint: one line naming what is wrong, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Sequence

OUT_DIR = "evaluation"
"""Where in the run directory the command writes."""


def arguments() -> argparse.ArgumentParser:
    """The command's arguments."""
    parser = argparse.ArgumentParser(prog="python -m launcher.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run directory (it holds resolved_config.yaml and checkpoint.pt)")
    parser.add_argument("--episodes", type=int, default=10, help="episodes to play (default 10)")
    parser.add_argument("--mode", choices=("deterministic", "random"), default="deterministic",
                        help="the policy's interaction mode (default deterministic: its most likely actions)")
    parser.add_argument("--seed", type=int, default=1_000_000, help="episode i resets with seed + i")
    parser.add_argument("--max-episode-steps", type=int, default=None, help="end an episode after this many steps")
    parser.add_argument("--video", action="store_true", help="record the first episode (MP4; GIF without ffmpeg)")
    parser.add_argument("--fps", type=int, default=30, help="the video's frames per second")
    return parser


def evaluate(run_dir: str, episodes: int = 10, *, mode: str = "deterministic", seed: int = 1_000_000,
             max_episode_steps: int | None = None, video: bool = False, fps: int = 30) -> dict:
    """Play ``episodes`` episodes with the run's checkpointed policy; returns what ``evaluation.json`` holds.

    Raises:
        launcher.saved_run.RunError: not a run directory, no checkpoint, or a policy that cannot be rebuilt here.
        ValueError: ``episodes`` below 1.
    """
    if episodes < 1:
        raise ValueError(f"--episodes must be at least 1, got {episodes}")
    import torch
    from omegaconf import OmegaConf

    from components.envs import EnvMaker
    from components.evaluator import play
    from components.evaluator.episodes import evaluation_env_node
    from components.logger.video import write_video

    from .saved_run import read_run

    run = read_run(run_dir)
    env = evaluation_env_node(OmegaConf.to_container(run.config.env, resolve=True), render=video)
    result = play(EnvMaker.from_config(env), run.policy, episodes, seed, mode=mode, video=video,
                  max_episode_steps=max_episode_steps)
    out_dir = os.path.join(run.run_dir, OUT_DIR)
    os.makedirs(out_dir, exist_ok=True)
    result.frames, result.policy_version = run.frames, run.policy_version
    summary = {"run_dir": run.run_dir, "env_id": run.spec.env_id, "recipe": run.title, "mode": mode, "seed": seed,
               **result.summary()}
    if result.video is not None:
        summary["video"] = write_video(torch.from_numpy(result.video), os.path.join(out_dir, "episode_0"), fps)
    with open(os.path.join(out_dir, "evaluation.json"), "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def table(summary: dict) -> str:
    """The returns as a text table: one row per episode, then mean, spread, range and mean length."""
    returns, lengths = summary["returns"], summary["lengths"]
    lines = [f"{summary['recipe']} on {summary['env_id']}: checkpoint at {summary['frames']:,} frames "
             f"(policy version {summary['policy_version']}), {summary['mode']} policy",
             f"{'episode':>7}  {'return':>10}  {'steps':>7}"]
    lines += [f"{i:>7}  {r:>10.2f}  {n:>7}" for i, (r, n) in enumerate(zip(returns, lengths))]
    spread = statistics.pstdev(returns) if len(returns) > 1 else 0.0
    lines.append(f"return: mean {statistics.fmean(returns):.2f} +- {spread:.2f} (std), median "
                 f"{statistics.median(returns):.2f}, min {min(returns):.2f}, max {max(returns):.2f}; "
                 f"steps: mean {statistics.fmean(lengths):.1f}")
    if summary.get("truncated_by_limit"):
        lines.append(f"{summary['truncated_by_limit']} episode(s) ended by --max-episode-steps, not by the env")
    if summary.get("video"):
        lines.append(f"video: {summary['video']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the command; exit 2 with one line for a wrong run directory or argument."""
    args = arguments().parse_args(argv)
    from .saved_run import RunError

    try:
        summary = evaluate(args.run_dir, args.episodes, mode=args.mode, seed=args.seed,
                           max_episode_steps=args.max_episode_steps, video=args.video, fps=args.fps)
    except (RunError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(getattr(exc, "exit_code", 2))
    print(table(summary))


if __name__ == "__main__":
    main()
