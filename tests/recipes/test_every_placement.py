"""Every recipe in every placement (and every process transport) through the launcher, on a tiny budget.

``launcher.cli.launch`` runs in this process (what ``python -m launcher`` calls once Hydra has composed the config;
tests/launcher/test_cli.py runs the real command): the run directory, the plan, the metrics are the same, and
the leak checks of conftest apply to every run.
"""

import json
import os

import pytest

from launcher.cli import launch
from tests.helpers import tracebacks
from recipes import RECIPES

pytestmark = pytest.mark.slow  # seconds each: every run starts its owners and trains

RUNS = [(r, ["service=direct"]) for r in RECIPES] + [(r, ["service=thread"]) for r in RECIPES] + [
    (r, ["service=process", f"transport={t}"]) for r in RECIPES
    for t in ("queue", "shared_memory", "process_slot", "distributed")
] + [(r, ["service=ray", f"transport={t}"]) for r in RECIPES for t in ("ray", "distributed")] + [  # the session's cluster
    (r, ["service=monarch"]) for r in RECIPES] + [  # each owner in a Monarch actor of its own
    (r, ["service=process", "transport=process_slot", "components.collector.sync=false"]) for r in RECIPES
]  # collection overlapping learning
TINY = {
    "ppo": ["recipe.num_envs=4", "recipe.num_steps=16", "recipe.total_frames=256", "recipe.target_return=null"],
    "dqn": ["recipe.num_envs=4", "recipe.num_steps=4", "recipe.total_frames=256", "recipe.target_return=null",
            "recipe.learning_starts=64", "recipe.batch_size=16"],
    "impala": ["recipe.num_envs=4", "recipe.unroll_length=16", "recipe.batch_size=4", "recipe.total_frames=256",
               "recipe.target_return=null"],
}


@pytest.mark.parametrize("recipe, overrides", RUNS, ids=[f"{r}-{'-'.join(o)}" for r, o in RUNS])
@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")  # a thread's traceback fails it
def test_recipe_runs_in_every_placement(recipe, overrides, compose_cfg, request, tmp_path, capfd):
    if "service=ray" in overrides:
        request.getfixturevalue("ray_cluster")
    run_dir = tmp_path / "run"
    launch(compose_cfg(f"+recipe={recipe}", *overrides, *TINY[recipe], "launcher.progress=false"), str(run_dir))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] >= 256 and summary["fps"] > 0
    plan = json.loads((run_dir / "plan.json").read_text())
    service = overrides[0].split("=")[1]
    assert {c["placement"] for c in plan["components"]} == {service}
    collector = next(c for c in plan["components"] if c["name"] == "collector")
    # impala's workers always hand over unrolls as they come
    assert collector["options"]["sync"] is ("components.collector.sync=false" not in overrides and recipe != "impala")
    if len(overrides) > 1:
        transport = overrides[1].split("=")[1]
        assert next(c for c in plan["components"] if c["name"] == "inference")["transport"] == transport
        if transport == "distributed":  # the plan says which edges use gloo: inference and replay, not the others
            kinds = {c["name"]: c["transport"] for c in plan["components"]}
            assert kinds["replay"] == "distributed" and kinds["logger"] != "distributed"
    metrics = (run_dir / "metrics.csv").read_text()
    assert metrics.count("train/mean_return") >= 1
    if recipe == "impala":  # the learner's queue was drained into updates, each with its lag measured
        assert "lag/mean" in metrics and "learner/idle_fraction" in metrics and "queue/depth" in metrics
    assert os.listdir(run_dir / "tensorboard"), "no TensorBoard event files beside the CSV"
    assert "edge/replay/size" in metrics and "edge/policy_lag" in metrics  # per-edge figures, read at the end
    if service != "direct":
        assert "edge/inference/batch_fill" in metrics
    assert not tracebacks(capfd.readouterr().err)


PIXEL_RUNS = [("atari", o) for o in (["service=direct"], *(  # thread: the same transports as direct, in-process
    ["service=process", f"transport={t}"] for t in ("queue", "shared_memory", "process_slot", "distributed")),
    ["service=ray", "transport=ray"], ["service=ray", "transport=distributed"], ["service=monarch"])] + [
    ("minatar", ["service=direct"]), ("minatar", ["service=process", "transport=shared_memory"])]


@pytest.mark.parametrize("env, overrides", PIXEL_RUNS, ids=[f"{e}-{'-'.join(o)}" for e, o in PIXEL_RUNS])
def test_ppo_from_pixels_runs_in_every_placement(env, overrides, compose_cfg, request, tmp_path, capfd):
    """PPO with its CNN on Atari frame stacks and MinAtar grids: observations stay bytes on every wire."""
    if "service=ray" in overrides:
        request.getfixturevalue("ray_cluster")
    run_dir = tmp_path / "run"
    launch(compose_cfg("+recipe=ppo", f"env={env}", *overrides, *TINY["ppo"], "launcher.progress=false",
                       "launcher.torch_threads=1"), str(run_dir))  # two test workers share the cores
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] >= 256 and summary["fps"] > 0
    plan = {c["name"]: c for c in json.loads((run_dir / "plan.json").read_text())["components"]}
    leaf = plan["inference"]["layouts"]["request"]["leaves"][0]
    assert leaf["dtype"] == "torch.uint8" and leaf["shape"][1:] == ([4, 84, 84] if env == "atari" else [10, 10, 4])
    if len(overrides) > 1:
        assert plan["inference"]["transport"] == overrides[1].split("=")[1]
    assert not tracebacks(capfd.readouterr().err)


@pytest.mark.parametrize("overrides", [["service=direct"], ["service=process", "transport=shared_memory"]])
@pytest.mark.parametrize("env", ["minatar", "atari"])
def test_dqn_from_pixels_runs(env, overrides, compose_cfg, tmp_path, capfd):
    """DQN's CNN Q-network on MinAtar grids and Atari frames: n-step transitions of bytes through the prioritized
    buffer, Atari's frame stacks stored there one frame at a time (rebuilt where the sample is read)."""
    run_dir = tmp_path / "run"
    launch(compose_cfg("+recipe=dqn", f"env={env}", *overrides, *TINY["dqn"], "recipe.buffer_size=1000",
                       "launcher.progress=false", "launcher.torch_threads=1"), str(run_dir))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] >= 256 and summary["episodes"] >= (1 if env == "minatar" else 0)
    sizes = [float(row.split(",")[2]) for row in (run_dir / "metrics.csv").read_text().splitlines()
             if row.startswith("edge/replay/size,")]
    assert sizes and sizes[-1] > 0  # learning from frame 64 on: sampled stacks went through the Q-network
    plan = {c["name"]: c for c in json.loads((run_dir / "plan.json").read_text())["components"]}
    assert plan["replay"]["options"]["frames"] == (["observation", "next.observation"] if env == "atari" else [])
    assert not tracebacks(capfd.readouterr().err)


@pytest.mark.parametrize("placement", ["distributed", "rpc"])
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_collectors_as_worker_ranks(recipe, placement, compose_cfg, tmp_path, capfd):
    """Worker ranks of a torch.distributed job, or workers driven through torch.distributed.rpc."""
    run_dir = tmp_path / "run"
    launch(compose_cfg(f"+recipe={recipe}", f"components.collector.placement={placement}",
                       "components.collector.num_collectors=2", *TINY[recipe], "launcher.progress=false"), str(run_dir))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] >= 256 and summary["fps"] > 0
    plan = {c["name"]: c for c in json.loads((run_dir / "plan.json").read_text())["components"]}
    assert plan["collector"]["placement"] == placement
    # nobody placed the inference server: the plan serves it from a thread of the driver, over gloo, for the ranks
    assert (plan["inference"]["placement"], plan["inference"]["transport"]) == ("thread", "distributed")
    services = json.loads((run_dir / "services.json").read_text())
    assert len(set(services["collector"]["pids"]) - {os.getpid()}) == 2
    err = capfd.readouterr().err
    assert not tracebacks(err) and "tensorpipe" not in err  # rpc worlds end without the agents' reports


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_collector_processes_with_their_own_policy_replicas(recipe, compose_cfg, tmp_path, capfd):
    run_dir = tmp_path / "run"
    launch(compose_cfg(f"+recipe={recipe}", "service=process", "components.collector.local_policy=true",
                       "components.collector.num_collectors=2", *TINY[recipe], "launcher.progress=false"), str(run_dir))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] >= 256 and summary["fps"] > 0
    plan = json.loads((run_dir / "plan.json").read_text())["components"]
    assert [c["name"] for c in plan] == ["logger", "weight_sync", "replay", "collector"]  # no inference server
    services = json.loads((run_dir / "services.json").read_text())
    assert "inference" not in services and len(services["collector"]["pids"]) == 2
    assert not tracebacks(capfd.readouterr().err)
