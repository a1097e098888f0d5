"""Every run writes into a directory of its own: a run started in the same second as another gets the next free
directory, and a run told to write where a live run writes is refused before it writes anything there."""

import datetime
import json
import os
import subprocess

import pytest

from launcher.cli import launch
from launcher.rundir import LOCK, RunDirLock, own_run_dir, unique
from transports.kernel.errors import ConfigurationError

from tests.helpers import cli_in_process, popen_cli

TINY = ("recipe.num_envs=2", "recipe.num_steps=16", "recipe.total_frames=64", "recipe.target_return=null",
        "launcher.progress=false", "launcher.plot=false")


def test_a_taken_directory_gives_the_next_free_one(tmp_path):
    base = str(tmp_path / "outputs" / "12-00-00")
    assert unique(base) == base and os.path.isdir(base)
    assert unique(base) == base + "-2"
    assert unique(base) == base + "-3"


def test_the_default_run_directory_of_a_second_already_taken_is_not_shared(tmp_path, monkeypatch):
    # the directories of this second and the next few exist already, as another run of the same second made them
    monkeypatch.chdir(tmp_path)
    now = datetime.datetime.now()
    taken = [tmp_path / "outputs" / f"{t:%Y-%m-%d}" / f"{t:%H-%M-%S}"
             for t in (now + datetime.timedelta(seconds=s) for s in range(4))]
    for path in taken:
        path.mkdir(parents=True)
    argv = own_run_dir(["+recipe=ppo", "seed=1"])
    assert argv[:2] == ["+recipe=ppo", "seed=1"] and argv[2].startswith("hydra.run.dir=")
    chosen = argv[2].split("=", 1)[1]
    assert os.path.isdir(chosen) and chosen.endswith("-2")
    assert os.path.abspath(chosen[: -len("-2")]) in [str(path) for path in taken]
    assert not any(any(path.iterdir()) for path in taken)  # nobody else's directory was touched


@pytest.mark.parametrize("argv", [["+recipe=ppo", "hydra.run.dir=mine"], ["--multirun", "+recipe=ppo", "seed=0,1"],
                                  ["+recipe=ppo", "--cfg", "job"]])
def test_a_directory_the_user_chose_a_sweep_and_hydra_s_own_flags_are_left_alone(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert own_run_dir(argv) == argv
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("others", [False, True], ids=["alone", "beside a job that ran"])
def test_a_refused_job_whose_directory_is_nested_leaves_nothing(others, tmp_path, monkeypatch):
    # an override's value with a "/" (env.id=ALE/Pong-v5) puts the job's directory two levels below the sweep's
    from launcher import rundir

    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "multirun" / "2026-01-01" / "12-00-00"
    job = sweep / "0_env.id=ALE" / "Pong-v5,recipe=ppo"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "config.yaml").write_text("{}\n")
    (job / "launcher.log").write_text("")
    (sweep / "multirun.yaml").write_text("{}\n")
    if others:
        (sweep / "1_env.id=CartPole-v1").mkdir()
        (sweep / "1_env.id=CartPole-v1" / "summary.json").write_text("{}\n")
    monkeypatch.setattr(rundir, "MADE_HERE", {str(sweep)})
    assert rundir.discard_unused(str(job))
    if others:  # the sweep keeps what ran
        assert sorted(p.name for p in sweep.iterdir()) == ["1_env.id=CartPole-v1", "multirun.yaml"]
    else:
        assert list(tmp_path.iterdir()) == []


def test_the_cli_runs_in_the_directory_it_claimed(tmp_path):
    proc = cli_in_process("+recipe=ppo", "launcher.dry_run=true", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    made = [p.parent for p in (tmp_path / "outputs").rglob(".hydra")]
    assert len(made) == 1 and (made[0] / "launcher.log").exists()


def test_a_run_directory_a_live_run_holds_is_refused_before_anything_is_written(compose_cfg, tmp_path):
    run_dir = tmp_path / "run"
    other = RunDirLock(str(run_dir))  # the run that writes there (a lock is per open file: this process counts)
    try:
        with pytest.raises(ConfigurationError) as info:
            launch(compose_cfg("+recipe=ppo", *TINY), str(run_dir))
        assert info.value.path == "hydra.run.dir"
        assert f"is the run directory of a run still in progress (pid {os.getpid()})" in str(info.value)
        assert sorted(p.name for p in run_dir.iterdir()) == [LOCK]  # no plan, no metrics: nothing written
    finally:
        other.release()
    result = launch(compose_cfg("+recipe=ppo", *TINY), str(run_dir))  # free again: it runs, and lets go after
    assert result["frames"] >= 64 and (run_dir / "metrics.csv").exists()
    RunDirLock(str(run_dir)).release()


@pytest.mark.slow  # two real launcher processes
def test_two_runs_started_together_write_into_directories_of_their_own(tmp_path):
    procs = [popen_cli("+recipe=ppo", f"seed={seed}", *TINY, cwd=str(tmp_path), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE) for seed in (0, 1)]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    summaries = sorted((tmp_path / "outputs").rglob("summary.json"))
    assert len(summaries) == 2 and summaries[0].parent != summaries[1].parent
    seeds = sorted(json.loads((s.parent / "plan.json").read_text())["seed"] for s in summaries)
    assert seeds == [0, 1]
    for summary in summaries:  # each metrics file is one run's: its steps never go back
        steps = [int(line.split(",")[1]) for line in (summary.parent / "metrics.csv").read_text().splitlines()[1:]
                 if line.split(",")[1]]
        assert steps == sorted(steps)
