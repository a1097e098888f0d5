"""Running a plan: owners start in dependency order, stop in reverse, on success and on error."""

import dataclasses

import pytest

import recipes.ppo
from components.service import Owner
from launcher.failures import ServiceFailedToStart
from launcher.plan import build_plan
from launcher.run import execute

TINY = ("+recipe=ppo", "recipe.num_envs=4", "recipe.num_steps=16", "recipe.total_frames=128",
        "recipe.target_return=null", "launcher.progress=false")


@pytest.fixture
def lifecycle_log(monkeypatch):
    events = []
    real_launch, real_ready, real_shutdown = Owner.launch, Owner.wait_ready, Owner.shutdown

    def launch(self):
        events.append(("start", self.component))
        return real_launch(self)

    def wait_ready(self):
        out = real_ready(self)
        events.append(("ready", self.component))
        return out

    def shutdown(self, timeout=None):
        events.append(("stop", self.component))
        return real_shutdown(self, timeout)

    monkeypatch.setattr(Owner, "launch", launch)
    monkeypatch.setattr(Owner, "wait_ready", wait_ready)
    monkeypatch.setattr(Owner, "shutdown", shutdown)
    return events


def test_start_in_dependency_order_and_stop_in_reverse(compose_cfg, lifecycle_log, tmp_path):
    cfg = compose_cfg(*TINY)
    plan = build_plan(cfg)
    owners = {}
    result = execute(plan, str(tmp_path), on_started=owners.update)
    assert result["frames"] == 128
    started = [c for e, c in lifecycle_log if e == "start"]
    stopped = [c for e, c in lifecycle_log if e == "stop"]
    assert started == ["logger", "weight_sync", "replay", "inference", "collector"]
    assert stopped == list(reversed(started))
    assert all(not o.is_alive for o in owners.values())
    # an owner launches only once what it depends on is ready; owners that do not depend on each other launch
    # together (logger and weight sync, then replay and inference), before either of them is waited for
    at = {event: i for i, event in enumerate(lifecycle_log)}
    for c in plan.components:
        assert all(at[("ready", d)] < at[("start", c.name)] for d in c.depends_on)
    assert at[("start", "weight_sync")] < at[("ready", "logger")]
    assert at[("start", "inference")] < at[("ready", "replay")]


def test_teardown_runs_when_the_recipe_raises(compose_cfg, lifecycle_log, tmp_path, monkeypatch):
    def broken(cfg, clients):
        clients.logger.log_scalar("before_failure", 1.0, step=0)
        raise RuntimeError("recipe failed")

    monkeypatch.setattr(recipes.ppo, "RECIPE", dataclasses.replace(recipes.ppo.RECIPE, run=broken))
    cfg = compose_cfg(*TINY)
    owners = {}
    with pytest.raises(RuntimeError, match="recipe failed"):
        execute(build_plan(cfg), str(tmp_path), on_started=owners.update)
    assert [c for e, c in lifecycle_log if e == "stop"] == ["collector", "inference", "replay", "weight_sync", "logger"]
    assert all(not o.is_alive for o in owners.values())
    assert "before_failure" in (tmp_path / "metrics.csv").read_text()  # the logger flushed on the error path


def test_a_failed_start_tears_down_what_started(compose_cfg, lifecycle_log, tmp_path, monkeypatch):
    from components.collectors import Collector

    def failing_start(self):
        raise OSError("env creation failed")

    monkeypatch.setattr(Collector, "_launch", failing_start)
    cfg = compose_cfg(*TINY)
    with pytest.raises(ServiceFailedToStart, match=r"collector \(direct\) failed to start: OSError: env creation") \
            as failed:
        execute(build_plan(cfg), str(tmp_path))
    assert isinstance(failed.value.__cause__, OSError)  # the builder's own error, for launcher.log's traceback
    assert [c for e, c in lifecycle_log if e == "stop"] == ["collector", "inference", "replay", "weight_sync", "logger"]


def test_probe_times_every_edge_and_writes_it_into_the_plan(compose_cfg, tmp_path, capsys):
    import json

    from launcher.cli import launch

    launch(compose_cfg(*TINY, "service=thread", "launcher.probe=true"), str(tmp_path))
    out = capsys.readouterr().out
    assert "probe (round trips from the driver; us):" in out
    records = {r["edge"]: r for r in json.loads((tmp_path / "plan.json").read_text())["probe"]}
    assert set(records) == {"collector -> inference", "learner -> replay (command)", "learner -> weight push"}
    inference = records["collector -> inference"]
    assert (inference["placement"], inference["transport"]) == ("thread", "thread")
    assert all(0 < r["p50_us"] <= r["p95_us"] for r in records.values())
    assert (tmp_path / "summary.json").exists()  # training ran after the probe
