"""The IMPALA recipe: unrolls through the FIFO learner queue, the lag bound, learning CartPole, a collector worker
killed mid-run."""

from __future__ import annotations

import csv
import os
import signal
import threading

import pytest
import torch
from tensordict import TensorDict

from components.replay import ReplayBuffer, ReplayConfig
from launcher.plan import build_plan
from launcher.run import execute
from recipes.impala import lag_metrics, time_major, unrolls_of, within_lag
from tests.helpers import proc_state, wait_until


def _chunk(steps=5, envs=3, version=0):
    """A collected ``[time, env]`` chunk whose values name their step and env."""
    ids = (torch.arange(steps).unsqueeze(1) * 10 + torch.arange(envs)).float()
    return TensorDict({
        "observation": ids.unsqueeze(-1).expand(steps, envs, 4).clone(), "action": ids.long(),
        "sample_log_prob": -ids, "policy_version": torch.full((steps, envs), version), "sample_seed": ids.long(),
        "next": {"observation": ids.unsqueeze(-1).expand(steps, envs, 4) + 0.5, "reward": torch.ones(steps, envs),
                 "terminated": torch.zeros(steps, envs, dtype=torch.bool),
                 "done": torch.zeros(steps, envs, dtype=torch.bool), "episode_return": torch.zeros(steps, envs)},
    }, batch_size=[steps, envs])


def test_unrolls_go_through_the_fifo_queue_whole_and_come_back_time_major():
    chunk = _chunk()
    rows = unrolls_of(chunk)
    assert rows.batch_size == torch.Size([3]) and rows["observation"].shape == (3, 5, 4)
    assert "sample_seed" not in rows.keys() and ("next", "episode_return") not in rows.keys(True)
    with ReplayBuffer(ReplayConfig(capacity=8, sampler="fifo", batch_size=2)) as queue:
        queue.extend(rows)
        queue.extend(unrolls_of(_chunk(version=1)))
        assert len(queue) == 6
        first = time_major(queue.sample().exclude("index"))
        assert first.batch_size == torch.Size([5, 2])  # env 0 and env 1 of the first chunk, every step in order
        assert torch.equal(first["action"], chunk["action"][:, :2])
        assert torch.equal(first["next", "observation"], chunk["next", "observation"][:, :2])
        assert len(queue) == 4


def test_unrolls_beyond_max_policy_lag_are_dropped_and_counted():
    rows = torch.cat([unrolls_of(_chunk(version=v)) for v in (3, 5, 6)])  # nine unrolls, three per version
    rows["policy_version"][7, 2] = 2  # one step of an otherwise fresh unroll is older: the unroll's lag is its oldest's
    kept, lags, dropped = within_lag(rows, version=6, max_policy_lag=1)
    assert dropped == 4 and kept["policy_version"].amin(dim=1).tolist() == [5, 5, 5, 6, 6]
    assert lags.shape == (9, 5) and int(lags.max()) == 4
    every, _, none = within_lag(rows, version=6, max_policy_lag=None)
    assert none == 0 and len(every) == 9
    metrics = lag_metrics(lags)
    assert metrics["lag/max"] == 4 and metrics["lag/hist_3"] == pytest.approx(15 / 45)
    assert sum(v for k, v in metrics.items() if k.startswith("lag/hist_")) == pytest.approx(1.0)


def _metrics(run_dir) -> dict[str, list[float]]:
    series: dict[str, list[float]] = {}
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        for row in csv.DictReader(f):
            series.setdefault(row["tag"], []).append(float(row["value"]))
    return series


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["impala", "appo"])
def test_solves_cartpole_with_default_settings(recipe, compose_cfg, tmp_path):
    cfg = compose_cfg(f"+recipe={recipe}", "launcher.progress=false", "seed=0")
    result = execute(build_plan(cfg), str(tmp_path))
    assert result["solved"] and result["final_mean_return"] >= 475, result
    metrics = _metrics(tmp_path)
    assert max(metrics["lag/max"]) <= 1  # in the caller, an unroll waits at most one update in the queue


@pytest.mark.slow
def test_with_max_policy_lag_0_overlapped_unrolls_are_all_dropped(compose_cfg, tmp_path):
    """A worker process collects its next unrolls while the learner updates: each is one version behind when it is
    learned from, so a bound of 0 drops every one (counted) and none is learned from."""
    cfg = compose_cfg("+recipe=impala", "service=process", "transport=shared_memory", "recipe.num_envs=4",
                      "recipe.unroll_length=8", "recipe.batch_size=4", "recipe.total_frames=320",
                      "recipe.target_return=null", "recipe.max_policy_lag=0", "launcher.progress=false")
    result = execute(build_plan(cfg), str(tmp_path))
    metrics = _metrics(tmp_path)
    unrolls = result["frames"] // 8
    # the first batch was acted by the weights it is learned with; a later one is dropped when it lags (under load a
    # worker may start its next unrolls after the push, and those are fresh)
    assert metrics["lag/dropped"][-1] <= unrolls - 4
    assert (max(metrics["lag/max"]) > 0) == (metrics["lag/dropped"][-1] > 0)
    assert "loss/policy" in metrics and len(metrics["loss/policy"]) >= 1


@pytest.mark.slow
def test_a_killed_collector_worker_restarts_and_every_handed_over_unroll_is_learned_from(compose_cfg, tmp_path):
    cfg = compose_cfg("+recipe=impala", "service=process", "transport=shared_memory", "recipe.num_envs=4",
                      "recipe.unroll_length=16", "recipe.batch_size=2", "recipe.total_frames=4096",
                      "recipe.target_return=null", "components.collector.num_collectors=2",
                      "components.collector.resources.max_restarts=1", "launcher.progress=false")
    killed: dict = {}

    def kill_one_worker(owners):
        collector = owners["collector"]

        def kill():
            wait_until(lambda: collector.frames >= 512, timeout=60, what="the first unrolls")
            killed["pid"] = pid = collector.hosts[1].pid
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: proc_state(pid) in ("gone", "Z"), timeout=10, what="the worker dead")
            wait_until(lambda: collector.hosts[1].pid not in (None, pid), timeout=60, what="the worker restarted")
            killed["restarted"] = collector.hosts[1].pid

        thread = killed["thread"] = threading.Thread(target=kill, daemon=True)
        thread.start()

    result = execute(build_plan(cfg), str(tmp_path), on_started=kill_one_worker)
    killed["thread"].join(timeout=30)
    assert killed.get("restarted") not in (None, killed["pid"]), killed
    assert result["frames"] == 4096
    metrics = _metrics(tmp_path)
    # each handed-over chunk holds two unrolls, one batch: every one was learned from, none dropped or lost
    assert metrics["train/updates"][-1] == 4096 // (16 * 2) and metrics["lag/dropped"][-1] == 0


@pytest.mark.slow
@pytest.mark.parametrize("env, overrides", [("atari", ["service=direct"]),
                                            ("minatar", ["service=process", "transport=shared_memory"])])
def test_learns_from_pixels(env, overrides, compose_cfg, tmp_path):
    """The CNN's unrolls of uint8 frames through the queue: every batch learned from, none dropped."""
    cfg = compose_cfg("+recipe=impala", f"env={env}", *overrides, "recipe.num_envs=4", "recipe.unroll_length=16",
                      "recipe.batch_size=4", "recipe.total_frames=256", "recipe.target_return=null",
                      "launcher.progress=false", "launcher.torch_threads=1")
    result = execute(build_plan(cfg), str(tmp_path))
    metrics = _metrics(tmp_path)
    assert result["frames"] == 256 and metrics["train/updates"][-1] == 4 and metrics["lag/dropped"][-1] == 0
    assert len(metrics["loss/policy"]) == 4
