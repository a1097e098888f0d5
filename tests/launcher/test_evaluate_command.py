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
    """``python -m launcher.evaluate`` with ``args``, in this process: ``(exit status, stdout, stderr)``."""
    import contextlib
    import io

    from launcher.evaluate import main

    out, err, status = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as ended:
            status = ended.code
    return status, out.getvalue(), err.getvalue()


def test_the_checkpointed_policy_plays_and_prints_its_returns_with_a_video(run_dir):
    status, out, err = evaluate(run_dir, "--episodes", 3, "--video", "--max-episode-steps", 200)
    assert status == 0, err[-2000:]
    saved = json.loads((run_dir / "evaluation" / "evaluation.json").read_text())
    assert saved["frames"] == 4096 and saved["mode"] == "deterministic" and len(saved["returns"]) == 3
    assert saved["returns"] == [float(n) for n in saved["lengths"]]  # CartPole: one point per step
    lines = out.splitlines()
    assert lines[0].startswith("ppo on CartPole-v1: checkpoint at 4,096 frames")
    assert [float(line.split()[1]) for line in lines[2:5]] == saved["returns"]
    assert "return: mean" in out and f"video: {saved['video']}" in out
    frames, size = decoded_video(saved["video"])
    assert frames == saved["lengths"][0] + 1 and size == (600, 400)


def test_the_same_seed_plays_the_same_deterministic_episodes(run_dir):
    first = evaluate(run_dir, "--episodes", 2, "--max-episode-steps", 100)
    second = evaluate(run_dir, "--episodes", 2, "--max-episode-steps", 100)
    assert first[0] == second[0] == 0
    assert first[1] == second[1]


def test_what_is_not_a_run_is_refused_in_one_line(tmp_path, run_dir):
    status, _, err = evaluate(tmp_path / "nothing")
    assert status == 2 and err.strip().startswith("error:") and "is not a directory" in err
    status, _, err = evaluate(run_dir.parent)  # the folder that holds the run
    assert status == 2 and "it holds the runs run: name one of them" in err
    status, _, err = evaluate(run_dir, "--episodes", 0)
    assert status == 2 and "--episodes must be at least 1" in err
    assert len(err.strip().splitlines()) == 1


def test_the_command_runs_as_a_module(run_dir):
    done = subprocess.run([sys.executable, "-m", "launcher.evaluate", str(run_dir), "--episodes", "1",
                           "--max-episode-steps", "20"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[1].split() == ["episode", "return", "steps"] and lines[2].split()[0] == "0"
    assert lines[3].startswith("return: mean")  # one episode, then the summary
