"""Evaluation of a real run made here (a short PPO CartPole run, every service on a thread, with the evaluator and a
checkpoint): what the evaluator logged while it trained, then ``python -m launcher.evaluate <run dir>``: the table,
the JSON, the video; and the one-line refusals."""

import csv
import json
import subprocess
import sys

import pytest

from tests.helpers import decoded_video, run_cli

pytestmark = pytest.mark.slow  # real launcher runs


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("evaluate") / "run"
    done = run_cli("+recipe=ppo", "recipe.total_frames=4096", "recipe.target_return=null", "service=thread",
                   "components.evaluator.eval_every=2048", "components.evaluator.episodes=2",
                   "components.evaluator.video=true", "components.evaluator.max_episode_steps=300",
                   "launcher.checkpoint_every=2048", "launcher.progress=false", "launcher.plot=false",
                   f"hydra.run.dir={path}", cwd=str(path.parent))
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((path / "summary.json").read_text())
    assert (f"evaluated {summary['eval_mean_return']:.1f} +- {summary['eval_return_std']:.1f} over 2 episodes"
            in done.stdout)  # the summary line
    return path


def evaluate(*args):
    return subprocess.run([sys.executable, "-m", "launcher.evaluate", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def test_the_evaluator_logged_each_eval_every_and_the_final_weights_with_videos(run_dir):
    summary = json.loads((run_dir / "summary.json").read_text())
    evaluations = summary["evaluations"]
    assert [e["frames"] for e in evaluations] == [2048, 4096]  # the last at the end: the final weights
    assert summary["eval_mean_return"] == evaluations[-1]["mean_return"]
    assert all(len(e["returns"]) == 2 and e["policy_version"] >= 1 for e in evaluations)
    for e in evaluations:
        frames, size = decoded_video(e["video"])
        assert frames == e["lengths"][0] + 1 and size == (600, 400)
    with open(run_dir / "metrics.csv") as f:
        logged = [(int(r["step"]), float(r["value"])) for r in csv.DictReader(f) if r["tag"] == "eval/mean_return"]
    assert logged == [(e["frames"], pytest.approx(e["mean_return"])) for e in evaluations]


def test_the_checkpointed_policy_plays_and_prints_its_returns_with_a_video(run_dir):
    done = evaluate(run_dir, "--episodes", 3, "--video", "--max-episode-steps", 200)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads((run_dir / "evaluation" / "evaluation.json").read_text())
    assert saved["frames"] == 4096 and saved["mode"] == "deterministic" and len(saved["returns"]) == 3
    assert saved["returns"] == [float(n) for n in saved["lengths"]]  # CartPole: one point per step
    lines = done.stdout.splitlines()
    assert lines[0].startswith("ppo on CartPole-v1: checkpoint at 4,096 frames")
    assert [float(line.split()[1]) for line in lines[2:5]] == saved["returns"]
    assert "return: mean" in done.stdout and f"video: {saved['video']}" in done.stdout
    frames, size = decoded_video(saved["video"])
    assert frames == saved["lengths"][0] + 1 and size == (600, 400)


def test_the_same_seed_plays_the_same_deterministic_episodes(run_dir):
    first = evaluate(run_dir, "--episodes", 2, "--max-episode-steps", 100)
    second = evaluate(run_dir, "--episodes", 2, "--max-episode-steps", 100)
    assert first.returncode == second.returncode == 0
    assert first.stdout == second.stdout


def test_what_is_not_a_run_is_refused_in_one_line(tmp_path, run_dir):
    done = evaluate(tmp_path / "nothing")
    assert done.returncode == 2 and done.stderr.strip().startswith("error:") and "is not a directory" in done.stderr
    done = evaluate(run_dir.parent)  # the folder that holds the run
    assert done.returncode == 2 and "it holds the runs run: name one of them" in done.stderr
    done = evaluate(run_dir, "--episodes", 0)
    assert done.returncode == 2 and "--episodes must be at least 1" in done.stderr
