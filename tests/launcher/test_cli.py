"""``python -m launcher``: what the composed config and the plan decide, checked in this process through
``launcher.cli.launch``; and, as a user runs it (real subprocesses, marked slow), what only a real process shows:
exit codes and stderr, the run directory Hydra makes, Ctrl-C."""

import json
import os
import shutil
import signal
import time

import pytest

from components.errors import ConfigurationError, NotImplementedYetError
from launcher.cli import launch
from launcher.conventions import EXIT_CONFIG
from tests.helpers import cli_in_process, pgroup_members, popen_cli, run_cli, wait_until


def _error_text(compose_cfg, *overrides: str) -> str:
    """What Hydra prints for a composition error: the error and its cause."""
    with pytest.raises(Exception) as info:
        compose_cfg(*overrides)
    text, exc = [], info.value
    while exc is not None:
        text.append(str(exc))
        exc = exc.__cause__
    return "\n".join(text)


# ---------------------------------------------------------------------------------------------- in this process
def test_incompatible_plan_is_a_configuration_error_naming_everything(compose_cfg, tmp_path):
    cfg = compose_cfg("+recipe=ppo", "service=ray", "transport=shared_memory", "launcher.dry_run=true")
    with pytest.raises(ConfigurationError) as info:  # the CLI prints it after "configuration error: ", exits 2
        launch(cfg, str(tmp_path))
    for needle in ("placed on 'ray'", "transport 'shared_memory'", "full_key: transport", "supported: auto, ray, distributed"):
        assert needle in str(info.value)
    assert os.listdir(tmp_path) == []


def test_dry_run_prints_the_plan_and_starts_nothing(compose_cfg, tmp_path, capsys):
    cfg = compose_cfg("+recipe=ppo", "service=process", "transport=shared_memory", "launcher.dry_run=true")
    assert launch(cfg, str(tmp_path)) is None
    out = capsys.readouterr().out
    assert "NOT IMPLEMENTED YET" not in out and "shared_memory" in out
    assert "inference.request: observation [16, 4] float32" in out
    assert "collector.sync" not in out and "env_groups" not in out  # defaults are not worth a line
    assert not (tmp_path / "metrics.csv").exists()


def test_two_env_groups_halve_the_request_and_say_what_they_cost(compose_cfg, tmp_path, capsys):
    cfg = compose_cfg("+recipe=ppo", "service=process", "components.collector.env_groups=2", "launcher.dry_run=true")
    assert launch(cfg, str(tmp_path)) is None
    out = capsys.readouterr().out
    assert "inference.request: observation [8, 4] float32" in out  # one of the worker's two groups of 8 envs
    assert "collector.env_groups: 2 (each worker steps one half of its envs" in out and "not bit-reproducible" in out


def test_dry_run_says_when_collection_overlaps_learning(compose_cfg, tmp_path, capsys):
    launch(compose_cfg("+recipe=ppo", "service=process", "components.collector.sync=false", "launcher.dry_run=true"),
           str(tmp_path))
    out = capsys.readouterr().out
    assert "collector.sync: false" in out and "policy lag <= 1" in out
    error = _error_text(compose_cfg, "+recipe=ppo", "components.collector.sync=maybe", "launcher.dry_run=true")
    assert "components.collector.sync" in error and "maybe" in error


def test_dry_run_marks_cells_not_built_yet(compose_cfg, tmp_path, capsys):
    launch(compose_cfg("+recipe=ppo", "service=ray", "components.inference.placement=distributed",
                       "components.replay.placement=distributed", "launcher.dry_run=true"), str(tmp_path))
    out = capsys.readouterr().out
    assert out.count("NOT IMPLEMENTED YET") == 2 + 1  # two components and the footnote
    assert "this plan cannot run yet" in out


def test_running_a_plan_not_built_yet_fails_before_anything_starts(compose_cfg, tmp_path):
    with pytest.raises(NotImplementedYetError, match="is not implemented yet") as info:
        launch(compose_cfg("+recipe=ppo", "service=ray", "components.inference.placement=distributed"), str(tmp_path))
    assert isinstance(info.value, ConfigurationError)  # what the CLI turns into exit status 2
    assert info.value.path == "components.inference.placement" and "distributed" not in info.value.alternatives
    assert not (tmp_path / "metrics.csv").exists() and not (tmp_path / "plan.json").exists()


def test_plain_recipe_form_works_too(compose_cfg, tmp_path, capsys):
    launch(compose_cfg("recipe=ppo", "launcher.dry_run=true"), str(tmp_path))
    assert "plan: recipe=ppo env=CartPole-v1 seed=0" in capsys.readouterr().out


def test_schema_errors_name_the_config_path(compose_cfg):
    error = _error_text(compose_cfg, "+recipe=ppo", "recipe.lr=fast")
    assert "recipe.lr" in error and "fast" in error
    error = _error_text(compose_cfg, "+recipe=ppo", "service=cloud")
    assert "service" in error and "process" in error


@pytest.mark.parametrize("recipe, sync, preset, kept", [
    ("ppo", "false", None, "PASSIVE"), ("ppo", "false", "ACTIVE", "ACTIVE"), ("ppo", "true", None, None),
    ("impala", None, None, "PASSIVE"),  # its collector always overlaps learning: no sync=false on the command line
])
def test_torch_threads_sleep_while_they_wait_where_collection_overlaps_learning(recipe, sync, preset, kept,
                                                                               monkeypatch, tmp_path):
    # set before torch loads in a run's process, inherited by every process the run starts; the user's word wins
    if preset is None:
        monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    else:
        monkeypatch.setenv("OMP_WAIT_POLICY", preset)
    proc = cli_in_process(f"+recipe={recipe}", "service=process",
                          *([f"components.collector.sync={sync}"] if sync else []),
                          "launcher.dry_run=true", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert os.environ.get("OMP_WAIT_POLICY") == kept


@pytest.mark.parametrize("recipe", ["impala", "appo"])
def test_the_summary_line_names_the_recipe_as_it_was_asked_for(recipe, compose_cfg, tmp_path, capsys):
    """``+recipe=appo`` runs the IMPALA recipe with PPO's clipped surrogate: its summary says appo, not impala."""
    from launcher.cli import plan, report

    built = plan(compose_cfg(f"+recipe={recipe}", "launcher.plot=false"))
    report(built, {"frames": 2048, "wall_seconds": 2.0, "fps": 1024.0, "final_mean_return": 21.5}, str(tmp_path))
    assert capsys.readouterr().out.startswith(f"{recipe} CartPole-v1 finished: 2,048 frames in 2.0 s")
    assert json.loads((tmp_path / "summary.json").read_text())["frames"] == 2048


def _strict(text: str):
    """JSON as a strict parser reads it: ``NaN`` and the infinities are not JSON."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_run_stopped_before_any_episode_ended_writes_strict_json(compose_cfg, tmp_path, capsys):
    """An Atari run stopped in its first minute has no mean return yet: ``null``, never a bare NaN."""
    from launcher.cli import _write_summary, plan, report

    _write_summary(str(tmp_path), {"interrupted": True, "frames": 512, "mean_return": float("nan")})
    assert _strict((tmp_path / "summary.json").read_text()) == {"interrupted": True, "frames": 512,
                                                                "mean_return": None}
    built = plan(compose_cfg("+recipe=ppo", "launcher.plot=false"))
    report(built, {"frames": 512, "wall_seconds": 1.0, "fps": 512.0, "final_mean_return": float("nan"),
                   "curve": [(256, float("inf"))]}, str(tmp_path))
    assert _strict((tmp_path / "summary.json").read_text())["final_mean_return"] is None
    assert "final mean return none yet (no episode ended)" in capsys.readouterr().out


@pytest.mark.parametrize("recipe", ["impala", "appo"])
def test_the_plan_names_the_recipe_as_it_was_asked_for(recipe, compose_cfg):
    from launcher.cli import plan

    built = plan(compose_cfg(f"+recipe={recipe}", "launcher.dry_run=true"))
    assert built.render().startswith(f"plan: recipe={recipe} env=CartPole-v1")
    assert built.to_dict()["recipe"] == recipe and built.recipe == "impala"  # the recipe module that runs it


def test_the_resolved_config_says_what_runs(compose_cfg, tmp_path):
    """APPO's collector always collects while the learner trains: ``resolved_config.yaml`` says ``sync: false`` even
    where the YAML or the command line said ``true``."""
    from omegaconf import OmegaConf

    from launcher.cli import plan, prepare

    cfg = compose_cfg("+recipe=appo", "components.collector.sync=true")
    prepared = prepare(plan(cfg), cfg, str(tmp_path))
    prepared.release()
    written = OmegaConf.load(tmp_path / "resolved_config.yaml")
    assert written.components.collector.sync is False and written.recipe.clip_coef == 0.2


# ---------------------------------------------------------------------------------------------- real processes
@pytest.mark.slow
def test_incompatible_plan_exits_2_with_a_short_message(tmp_path):
    proc = run_cli("+recipe=ppo", "service=ray", "transport=shared_memory", "launcher.dry_run=true",
                   f"hydra.run.dir={tmp_path}", cwd=str(tmp_path))
    assert proc.returncode == EXIT_CONFIG == 2
    assert proc.stderr.startswith("configuration error: ")
    for needle in ("placed on 'ray'", "transport 'shared_memory'", "full_key: transport", "supported: auto, ray, distributed"):
        assert needle in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.slow
def test_tiny_ppo_run_writes_the_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli("+recipe=ppo", "recipe.num_envs=4", "recipe.num_steps=32", "recipe.total_frames=1024",
                   "recipe.target_return=null", "logger=tensorboard", f"hydra.run.dir={run_dir}", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("ppo CartPole-v1 finished: 1,024 frames in ") and str(run_dir) in last
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] == 1024 and summary["episodes"] > 0 and summary["fps"] > 0
    assert (run_dir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plan = json.loads((run_dir / "plan.json").read_text())
    assert [c["name"] for c in plan["components"]] == ["logger", "weight_sync", "replay", "inference", "collector"]
    assert "recipe:" in (run_dir / "resolved_config.yaml").read_text()
    assert os.listdir(run_dir / "tensorboard")
    log = (run_dir / "launcher.log").read_text()
    assert log.index("stopping collector") < log.index("stopping logger")


@pytest.mark.slow
def test_ctrl_c_tears_everything_down(tmp_path):
    run_dir = tmp_path / "run"
    with open(tmp_path / "stdout", "w") as out, open(tmp_path / "stderr", "w") as err:
        proc = popen_cli("+recipe=ppo", "recipe.total_frames=10000000", "recipe.target_return=null",
                         "logger.flush_every=1000000", f"hydra.run.dir={run_dir}", cwd=str(tmp_path), stdout=out, stderr=err)
    try:
        # training is under way once the first progress line is out (the recipe logs its metrics just before)
        wait_until(lambda: proc.poll() is not None or "[progress] frames=" in (tmp_path / "stderr").read_text(),
                   timeout=60, what="the first trained batch")
        assert proc.poll() is None, (tmp_path / "stderr").read_text()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = (tmp_path / "stderr").read_text()
    assert proc.returncode == 130, err
    assert "interrupted: every service was shut down" in err
    text = (run_dir / "launcher.log").read_text()
    for name in ("collector", "inference", "replay", "weight_sync", "logger"):
        assert f"stopping {name}" in text
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert len(rows) > 1, "the logger did not flush on Ctrl-C"
    assert pgroup_members(proc.pid) == []


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_a_ray_run_starts_a_local_cluster_of_its_own_and_stops_it(tmp_path, monkeypatch):
    # the one run that starts a cluster (the other Ray runs join the session's): its processes all end with it
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)  # as a user's shell has it (Ray sets it where it started one)
    run_dir, temp_dir = tmp_path / "run", f"/tmp/rl{os.getpid()}_{os.urandom(2).hex()}"  # short: Unix sockets
    proc = run_cli("+recipe=ppo", "service=ray", f"ray.temp_dir={temp_dir}", "recipe.num_envs=4", "recipe.num_steps=16",
                   "recipe.total_frames=256", "recipe.target_return=null", "launcher.progress=false",
                   f"hydra.run.dir={run_dir}", cwd=str(tmp_path), timeout=240)
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr
        plan = json.loads((run_dir / "plan.json").read_text())
        assert {c["placement"] for c in plan["components"]} == {"ray"}
        assert json.loads((run_dir / "summary.json").read_text())["frames"] >= 256
        log = (run_dir / "launcher.log").read_text()
        assert "ray cluster: started on 127.0.0.1" in log
        # token authentication stays on, said in the log and not printed between the plan and the progress line
        assert "ray: Token authentication is enabled for this Ray cluster" in log
        assert "Token authentication is enabled" not in proc.stderr
        wait_until(lambda: _processes_mentioning(temp_dir) == [], timeout=30, what="the cluster's processes to end")
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_a_ray_address_where_nothing_listens_fails_at_once(tmp_path):
    import socket

    with socket.socket() as s:  # a port on loopback that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    proc = run_cli("+recipe=ppo", "service=ray", f"ray.address=127.0.0.1:{port}", "ray.connect_timeout=600",
                   f"hydra.run.dir={tmp_path / 'run'}", cwd=str(tmp_path), timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"no Ray cluster listens at ray.address='127.0.0.1:{port}' (connection refused)" in proc.stderr
    assert "full_key: ray.address" in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - started < 60  # not the 600 s it was told it may wait; Ray alone waits minutes
    assert not (tmp_path / "run").exists()  # refused while planning: no run directory left


def test_a_signal_during_a_dead_services_shutdown_still_reports_the_death():
    from launcher.endings import died_first
    from launcher.failures import ServiceDied, Terminated

    died = ServiceDied("collector", "distributed", None, "collector-1-rank2: rank 2 closed its connection")
    try:
        try:
            raise died
        except ServiceDied:
            raise Terminated()  # what a SIGTERM raises while the teardown runs
    except Terminated as exc:
        assert died_first(exc) is died
    assert died_first(Terminated()) is None
