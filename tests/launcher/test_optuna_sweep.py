"""Optuna sweeps (``hydra/sweeper=optuna``; the example ``conf/hydra/sweeper/ppo_cartpole_optuna.yaml``): the objective
a trial returns (the evaluated return, else the training return; NaN for a run without one), the sweep summary's
objective column and Optuna's best trial, the preflight at the ends of the search space, its dry run, and a real
sweep of PPO on CartPole with a tiny budget."""

from __future__ import annotations

import csv
import json
import math
import os

import pytest
import yaml

pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="pip install -e '.[optuna]'")
# optuna 2.10 declares its (unused here) database models with SQLAlchemy 1's API as it is imported
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:optuna.*")

from launcher.preflight import TRIAL_SUBDIR, SearchEnds, check_argv, preflight, sweep_jobs, trial_dirs  # noqa: E402
from launcher.sweep import (  # noqa: E402
    CSV_NAME, MARKDOWN_NAME, OPTUNA_RESULTS, OPTUNA_SWEEPER, objective, write_sweep_summary,
)
from tests.helpers import run_cli  # noqa: E402
from transports.kernel.errors import ConfigurationError  # noqa: E402

EXAMPLE = "hydra/sweeper=ppo_cartpole_optuna"
SPACE = ("recipe.lr=tag(log, interval(3e-4, 3e-2))", "recipe.update_epochs=choice(2, 4, 8)",
         "recipe.ent_coef=interval(0.0, 0.02)")  # the example's params, as its file writes them


# ---------------------------------------------------------------------------------------------- the objective
def test_the_objective_is_the_evaluated_return_where_the_evaluator_ran_else_the_training_return():
    trained = {"frames": 2048, "final_mean_return": 24.35, "solved": False}
    assert objective(trained) == 24.35
    assert objective({**trained, "eval_mean_return": 179.0, "eval_return_std": 93.0}) == 179.0
    assert objective({**trained, "eval_mean_return": None}) == 24.35  # an evaluation with no figure: the training's


@pytest.mark.parametrize("summary", [
    {"frames": 16, "final_mean_return": None},                     # no episode ended in the budget
    {"frames": 16, "final_mean_return": float("nan")},
    {"interrupted": False, "signal": None, "failed": "replay (process, pid 1) died", "frames": 1024,
     "mean_return": 31.5},                                         # what a failed run's summary.json holds
    {"interrupted": True, "signal": "SIGTERM", "failed": None, "frames": 1024, "mean_return": 18.0},
], ids=["no-episode", "nan", "failed", "interrupted"])
def test_a_run_without_a_finished_return_has_a_nan_objective(summary):
    assert math.isnan(objective(summary))


# ---------------------------------------------------------------------------------------------- the summary
def _trial(sweep_dir, num: int, params: dict, summary: dict | None) -> str:
    """A trial's job directory as Optuna's sweeper and the launcher leave it."""
    overrides = [f"{k}={v}" for k, v in params.items()] + ["recipe=ppo", "recipe.total_frames=2048"]
    run_dir = os.path.join(str(sweep_dir), f"{num}_{','.join(overrides)}")
    os.makedirs(os.path.join(run_dir, ".hydra"))
    with open(os.path.join(run_dir, ".hydra", "overrides.yaml"), "w") as f:
        yaml.safe_dump(overrides, f)
    with open(os.path.join(run_dir, ".hydra", "hydra.yaml"), "w") as f:
        yaml.safe_dump({"hydra": {"job": {"num": num}, "sweeper": {"_target_": OPTUNA_SWEEPER}}}, f)
    if summary is not None:
        with open(os.path.join(run_dir, "summary.json"), "w") as f:
            json.dump(summary, f)
    return run_dir


def _three_trials(sweep_dir) -> list[dict]:
    params = [{"recipe.lr": 0.00375619614449984, "recipe.update_epochs": 2},
              {"recipe.lr": 0.005873669160363897, "recipe.update_epochs": 8},
              {"recipe.lr": 0.011496650551478362, "recipe.update_epochs": 8}]
    _trial(sweep_dir, 0, params[0], {"frames": 2048, "final_mean_return": 30.2, "eval_mean_return": 41.5})
    _trial(sweep_dir, 1, params[1], {"frames": 2048, "final_mean_return": 24.1, "eval_mean_return": 88.0})
    _trial(sweep_dir, 2, params[2], {"frames": 2048, "final_mean_return": None})  # NaN: Optuna failed it
    return params


def test_the_summary_has_each_trials_objective_and_names_optunas_best_trial(tmp_path, capsys):
    params = _three_trials(tmp_path)
    with open(os.path.join(str(tmp_path), OPTUNA_RESULTS), "w") as f:  # as the sweeper writes it (OmegaConf.save)
        yaml.safe_dump({"name": "optuna", "best_params": params[1], "best_value": 88.0}, f)

    table = write_sweep_summary(str(tmp_path))

    assert [r["objective"] for r in table] == [41.5, 88.0, None]
    assert [r["final_mean_return"] for r in table] == [30.2, 24.1, None]
    with open(os.path.join(str(tmp_path), CSV_NAME), newline="") as f:
        assert [r["objective"] for r in csv.DictReader(f)] == ["41.5", "88.0", ""]
    with open(os.path.join(str(tmp_path), MARKDOWN_NAME)) as f:
        text = f.read()
    assert text in capsys.readouterr().out
    assert "| final return | objective |" in text
    assert "| 1 | recipe.lr=0.005873669160363897 recipe.update_epochs=8 | finished | - | - | 2,048 | - | - | 24.1 " \
           "| 88.0 |" in text
    assert ("Optuna's best trial (optimization_results.yaml): job 1, objective 88.00: "
            "recipe.lr=0.005873669160363897 recipe.update_epochs=8") in text
    assert "- job 2: no finite return to maximize (no episode ended): Optuna marked the trial failed" in text


def test_a_sweep_that_ended_before_optuna_wrote_its_results_names_the_best_so_far(tmp_path):
    _three_trials(tmp_path)
    _trial(tmp_path, 3, {"recipe.lr": 0.02, "recipe.update_epochs": 4},
           {"interrupted": True, "signal": "SIGINT", "failed": None, "frames": 1024, "mean_return": 500.0})

    table = write_sweep_summary(str(tmp_path), ended_early=True)

    assert [r["objective"] for r in table] == [41.5, 88.0, None, None]  # an interrupted trial has none
    with open(os.path.join(str(tmp_path), MARKDOWN_NAME)) as f:
        text = f.read()
    assert ("Best trial so far (the sweep ended before Optuna wrote optimization_results.yaml): job 1, objective "
            "88.00: recipe.lr=0.005873669160363897 recipe.update_epochs=8") in text


def test_a_sweep_of_another_sweeper_keeps_its_table_without_an_objective_column(tmp_path):
    run_dir = _trial(tmp_path, 0, {"seed": 0}, {"frames": 2048, "final_mean_return": 30.2})
    with open(os.path.join(run_dir, ".hydra", "hydra.yaml"), "w") as f:
        yaml.safe_dump({"hydra": {"job": {"num": 0}, "sweeper": {
            "_target_": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"}}}, f)
    write_sweep_summary(str(tmp_path))
    with open(os.path.join(str(tmp_path), MARKDOWN_NAME)) as f:
        text = f.read()
    assert "objective" not in text and "| final return |\n" in text


# ---------------------------------------------------------------------------------------------- the preflight
def test_an_optuna_sweep_is_checked_at_the_ends_of_its_search_space():
    argv = ["--multirun", EXAMPLE, "recipe=ppo", "recipe.total_frames=2048", "recipe.clip_coef=choice(0.1,0.3)"]
    jobs = sweep_jobs(argv)
    assert isinstance(jobs, SearchEnds)
    fixed = ["recipe=ppo", "recipe.total_frames=2048"]
    first = {"recipe.lr": "0.0003", "recipe.update_epochs": "2", "recipe.ent_coef": "0.0", "recipe.clip_coef": "0.1"}

    def job(changed: dict | None = None) -> list[str]:
        return sorted([*(f"{k}={v}" for k, v in {**first, **(changed or {})}.items()), *fixed])

    assert sorted(map(sorted, jobs)) == sorted([  # the first ends, then each other end of one key
        job(), job({"recipe.lr": "0.03"}), job({"recipe.update_epochs": "4"}), job({"recipe.update_epochs": "8"}),
        job({"recipe.ent_coef": "0.02"}), job({"recipe.clip_coef": "0.3"})])
    configs = check_argv(argv)
    assert isinstance(configs, SearchEnds) and len(configs) == 6
    assert sorted(cfg.recipe.lr for cfg in configs) == [0.0003] * 5 + [0.03]


@pytest.mark.parametrize("extra, refused, path", [
    (["recipe.lr=interval(0, 1e-2)"], "recipe.lr must be > 0, got 0.0 (at recipe.lr=0.0 ", "recipe.lr"),
    (["recipe.num_minibatches=choice(4, 3)"],  # 16 envs x 32 steps = 512 rows: 3 minibatches do not divide them
     "must be divisible by num_minibatches=3 (at ", "recipe.num_minibatches"),
    (["hydra.sweeper.direction=minimize"], "hydra.sweeper.direction=minimize: a trial's objective is one number",
     "hydra.sweeper.direction"),
    (["hydra.sweeper.direction=[maximize,maximize]"], "direction=['maximize', 'maximize']: a trial's objective is one",
     "hydra.sweeper.direction"),
    (["recipe.num_minibatches=interval(1, 8)"],  # Hydra's interval() is of floats: Optuna would draw 3.7 minibatches
     "must be an integer, got 1.0 (at ", "recipe.num_minibatches"),
    (["recipe.lrr=0.1"], "recipe has no key 'lrr'", "recipe.lrr"),
], ids=["interval-end", "choice", "float-interval", "minimize", "two-objectives", "unknown-key"])
def test_a_search_space_no_trial_could_run_is_refused_before_any_trial(extra, refused, path):
    with pytest.raises(ConfigurationError) as err:
        check_argv(["--multirun", EXAMPLE, "recipe=ppo", *extra])
    assert refused in str(err.value) and err.value.path == path
    if extra[0].startswith("recipe.") and "(at " in refused:  # names the search space it came from
        assert "an end of the Optuna search space" in str(err.value)
    if "integer" in refused:
        assert "int(interval(a, b)) draws integers" in str(err.value)


def test_plain_hydra_sweeper_optuna_minimizes_unless_told_so_it_is_refused():
    with pytest.raises(ConfigurationError, match="set hydra.sweeper.direction=maximize"):
        check_argv(["--multirun", "hydra/sweeper=optuna", "recipe=ppo", "recipe.lr=interval(1e-4, 1e-2)"])
    told = check_argv(["--multirun", "hydra/sweeper=optuna", "hydra.sweeper.direction=maximize", "recipe=ppo",
                       "recipe.lr=interval(1e-4, 1e-2)"])
    assert sorted(cfg.recipe.lr for cfg in told) == [1e-4, 1e-2]


def test_a_database_storage_this_optuna_cannot_open_is_refused():
    import optuna
    import sqlalchemy

    if int(optuna.__version__.split(".")[0]) >= 3 or int(sqlalchemy.__version__.split(".")[0]) < 2:
        pytest.skip(f"optuna {optuna.__version__} with SQLAlchemy {sqlalchemy.__version__} opens databases")
    with pytest.raises(ConfigurationError, match="leave hydra.sweeper.storage=null") as err:
        check_argv(["--multirun", EXAMPLE, "recipe=ppo", "hydra.sweeper.storage=sqlite:///study.db"])
    assert err.value.path == "hydra.sweeper.storage"


def test_another_sweeper_is_left_to_hydra():
    assert sweep_jobs(["--multirun", "hydra/sweeper=basic", "recipe=ppo", "seed=0,1"]) is None


def test_an_optuna_trials_directory_is_named_by_its_job_number_unless_the_user_names_it():
    optuna = ["--multirun", EXAMPLE, "recipe=ppo"]
    assert trial_dirs(optuna) == [*optuna, f"hydra.sweep.subdir={TRIAL_SUBDIR}"]
    assert trial_dirs([*optuna, "hydra.sweep.subdir=t${hydra.job.num}"])[-1] == "hydra.sweep.subdir=t${hydra.job.num}"
    assert trial_dirs(["--multirun", "recipe=ppo", "seed=0,1"]) == ["--multirun", "recipe=ppo", "seed=0,1"]


def test_the_dry_run_of_an_optuna_sweep_plans_the_ends_of_its_search_space_and_runs_no_trial(tmp_path, capsys,
                                                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    from launcher.cli import dry_run_search

    with pytest.raises(SystemExit) as ended:
        dry_run_search(preflight(["--multirun", EXAMPLE, "+recipe=ppo", "launcher.dry_run=true"]))
    assert ended.value.code == 0
    out = capsys.readouterr().out
    assert out.count("plan: recipe=ppo env=CartPole-v1") == 5  # lr x2, update_epochs x3, ent_coef x2: 1 + 1 + 2 + 1
    assert "at recipe.lr=0.03 recipe.update_epochs=2 recipe.ent_coef=0.0:" in out
    assert out.rstrip().splitlines()[-1].startswith("dry run of an Optuna sweep: the 5 jobs at the ends")
    assert os.listdir(tmp_path) == []  # no sweep directory, no run directory


# ---------------------------------------------------------------------------------------------- a real sweep
@pytest.mark.slow
def test_a_real_optuna_sweep_returns_each_runs_return_and_optuna_keeps_the_best(tmp_path):
    import optuna
    from optuna.distributions import CategoricalDistribution, LogUniformDistribution, UniformDistribution

    sweep_dir = os.path.join(str(tmp_path), "sweep")
    result = run_cli("--multirun", EXAMPLE, "hydra.sweeper.n_trials=3", "+recipe=ppo", "recipe.total_frames=2048",
                     "recipe.target_return=null", "launcher.progress=false", "launcher.plot=false",
                     "components.evaluator.eval_every=2048", "components.evaluator.episodes=2",
                     "recipe.clip_coef=choice(0.1, 0.3)", f"hydra.sweep.dir={sweep_dir}", cwd=str(tmp_path),
                     timeout=240)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-4000:]}"
    assert "Failed experiment" not in result.stdout + result.stderr  # Optuna took every trial's return value

    with open(os.path.join(sweep_dir, CSV_NAME), newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["job"] for r in rows] == ["0", "1", "2"] and {r["status"] for r in rows} == {"finished"}
    assert [r["run_dir"] for r in rows] == ["0", "1", "2"]  # named by job number (hydra.sweep.subdir, trial_dirs)
    trials = []
    for row in rows:  # every trial's run directory, its summary and what the summary lists for it
        run_dir = os.path.join(sweep_dir, row["run_dir"])
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        with open(os.path.join(run_dir, ".hydra", "overrides.yaml")) as f:
            given = dict(o.split("=", 1) for o in yaml.safe_load(f))
        assert summary["frames"] == 2048 and len(summary["evaluations"]) >= 1
        assert float(row["objective"]) == summary["eval_mean_return"]  # the evaluated return, not the training's
        trials.append((summary["eval_mean_return"], given))

    with open(os.path.join(sweep_dir, OPTUNA_RESULTS)) as f:
        results = yaml.safe_load(f)
    best_value, best_given = max(trials, key=lambda t: t[0])
    assert results["best_value"] == best_value  # what Optuna kept for its best trial is that run's return
    assert set(results["best_params"]) == {"recipe.lr", "recipe.update_epochs", "recipe.ent_coef", "recipe.clip_coef"}
    assert {k: str(v) for k, v in results["best_params"].items()} == {k: best_given[k] for k in results["best_params"]}
    with open(os.path.join(sweep_dir, MARKDOWN_NAME)) as f:
        text = f.read()
    best_job = next(r["job"] for r, (value, _) in zip(rows, trials) if value == best_value)
    assert f"Optuna's best trial (optimization_results.yaml): job {best_job}, objective " in text
    assert text in result.stdout

    # the sampler's seed (0, in the example): the trials are those a fresh TPE sampler of that seed draws
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
    space = {"recipe.lr": LogUniformDistribution(3e-4, 3e-2),  # the example's params, then the command line's
             "recipe.update_epochs": CategoricalDistribution([2, 4, 8]),
             "recipe.ent_coef": UniformDistribution(0.0, 0.02),
             "recipe.clip_coef": CategoricalDistribution([0.1, 0.3])}
    for value, given in trials:
        trial = study.ask(space)
        assert {k: str(v) for k, v in trial.params.items()} == {k: given[k] for k in space}
        study.tell(trial, value)


@pytest.mark.slow
def test_a_trial_that_fails_stops_the_sweep_with_its_status_and_the_trials_that_ran_are_summarized(tmp_path):
    # 16 envs x 32 steps = 512 rows: both ends of int(interval(1, 8)) divide them, so the preflight lets the sweep
    # start; the seeded sampler's second trial draws 6 minibatches, which do not (seed 1 draws 1, then 6)
    sweep_dir = os.path.join(str(tmp_path), "sweep")
    result = run_cli("--multirun", EXAMPLE, "hydra.sweeper.n_trials=3", "hydra.sweeper.sampler.seed=1", "+recipe=ppo",
                     "recipe.total_frames=1024", "recipe.target_return=null", "launcher.progress=false",
                     "launcher.plot=false", "recipe.num_minibatches=int(interval(1, 8))",
                     f"hydra.sweep.dir={sweep_dir}",
                     cwd=str(tmp_path), timeout=240)
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-4000:]}"
    assert "must be divisible by num_minibatches=6" in result.stderr
    with open(os.path.join(sweep_dir, CSV_NAME), newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["status"]) for r in rows] == [("0", "finished")]  # the refused trial left no directory
    assert "recipe.num_minibatches=1" in rows[0]["overrides"] and float(rows[0]["objective"]) > 0
    assert not os.path.exists(os.path.join(sweep_dir, OPTUNA_RESULTS))  # Optuna writes it only once every trial ran
    with open(os.path.join(sweep_dir, MARKDOWN_NAME)) as f:
        text = f.read()
    assert "(the sweep ended early)" in text.splitlines()[0]
    assert "Best trial so far (the sweep ended before Optuna wrote optimization_results.yaml): job 0" in text


@pytest.mark.slow
def test_a_trial_without_a_finished_episode_is_failed_by_optuna_and_the_search_goes_on(tmp_path):
    # 128 envs x 4 steps: 512 frames end no CartPole episode (NaN), 2048 do; seed 0 draws 512, then 2048
    sweep_dir = os.path.join(str(tmp_path), "sweep")
    result = run_cli("--multirun", EXAMPLE, "hydra.sweeper.n_trials=2", "+recipe=ppo", "recipe.num_envs=128",
                     "recipe.num_steps=4", "recipe.total_frames=choice(512, 2048)", "recipe.target_return=null",
                     "launcher.progress=false", "launcher.plot=false", f"hydra.sweep.dir={sweep_dir}",
                     cwd=str(tmp_path), timeout=240)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-4000:]}"
    assert "Failed experiment" in result.stdout + result.stderr  # the plugin's line for the trial Optuna failed
    with open(os.path.join(sweep_dir, CSV_NAME), newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["status"], r["frames"]) for r in rows] == [("finished", "512"), ("finished", "2048")]
    assert rows[0]["objective"] == "" and float(rows[1]["objective"]) > 0
    with open(os.path.join(sweep_dir, OPTUNA_RESULTS)) as f:
        results = yaml.safe_load(f)
    assert results["best_value"] == float(rows[1]["objective"])
    assert results["best_params"]["recipe.total_frames"] == 2048
    with open(os.path.join(sweep_dir, MARKDOWN_NAME)) as f:
        text = f.read()
    assert "- job 0: no finite return to maximize (no episode ended): Optuna marked the trial failed" in text
    assert "Optuna's best trial (optimization_results.yaml): job 1, " in text
