"""A seeded run learns the same in every local placement and transport: the same episode returns, batch by batch.

Runs go through the launcher in this process (see test_every_placement.py), with ``sync=true`` collection. What
makes them agree is tested piece by piece in tests/components/test_sampling_seeds.py.
"""

import pytest

from launcher.cli import launch

pytestmark = pytest.mark.slow  # seconds each: every run starts its owners and trains

BUDGET = ["recipe.num_envs=4", "recipe.num_steps=64", "recipe.total_frames=3072", "recipe.target_return=null",
          "recipe.window=5", "seed=3", "components.collector.sync=true", "launcher.progress=false",
          "launcher.plot=false"]
DQN_BUDGET = ["recipe.total_frames=3072", "recipe.learning_starts=512", "recipe.eps_frames=2048",
              "recipe.target_return=null", "recipe.window=5", "seed=3", "components.collector.sync=true",
              "launcher.progress=false", "launcher.plot=false"]
PLACEMENTS = [["service=thread"]] + [["service=process", f"transport={t}"]
                                      for t in ("queue", "shared_memory", "process_slot")] + [
    ["service=process", "components.collector.local_policy=true"]]  # the policy in the worker, fed by weight sync


def curve(compose_cfg, tmp_path, *overrides: str, recipe: str = "ppo") -> list:
    budget = BUDGET if recipe == "ppo" else DQN_BUDGET
    result = launch(compose_cfg(f"+recipe={recipe}", *overrides, *budget), str(tmp_path / "-".join(overrides)))
    assert result["episodes"] > 10  # enough finished episodes to tell runs apart
    return [(frames, round(mean, 6)) for frames, mean in result["curve"]]


_DIRECT: list = []  # the direct run's curve, computed once for the module


@pytest.fixture
def direct(compose_cfg, tmp_path_factory):
    if not _DIRECT:
        _DIRECT.append(curve(compose_cfg, tmp_path_factory.mktemp("direct"), "service=direct"))
    return _DIRECT[0]


def test_direct_repeats_itself(direct, compose_cfg, tmp_path):
    assert curve(compose_cfg, tmp_path, "service=direct") == direct


@pytest.mark.parametrize("overrides", PLACEMENTS, ids=["-".join(o) for o in PLACEMENTS])
def test_every_local_placement_learns_what_direct_learns(overrides, direct, compose_cfg, tmp_path):
    assert curve(compose_cfg, tmp_path, *overrides) == direct


def test_two_collectors_learn_the_same_whatever_batches_their_requests(compose_cfg, tmp_path):
    # their requests meet in the server's batches in any order; the actions never depend on it, the log-probabilities
    # only in their last bits (a forward over 8 rows and one over 16 round differently), which a run this short
    # does not feel (a full run drifts: see the README)
    two = "components.collector.num_collectors=2"
    assert curve(compose_cfg, tmp_path, "service=thread", two) == curve(
        compose_cfg, tmp_path, "service=process", "transport=process_slot", two)


def test_dqn_learns_the_same_in_direct_and_in_processes(compose_cfg, tmp_path):
    # epsilon-greedy draws from the rows' seeds too; replay samples come from the buffer's seeded generator
    direct_curve = curve(compose_cfg, tmp_path, "service=direct", recipe="dqn")
    assert curve(compose_cfg, tmp_path, "service=process", "transport=shared_memory", recipe="dqn") == direct_curve
    assert curve(compose_cfg, tmp_path, "service=process", "components.collector.local_policy=true",
                 recipe="dqn") == direct_curve


def test_ppo_from_pixels_learns_the_same_in_direct_and_in_processes(compose_cfg, tmp_path):
    # MinAtar's grids through the CNN encoder: uint8 observations on every wire, the policy scales them; a batch of
    # the same rows gives the same actions whether the server is this thread or a process behind shared memory
    pixels = ("env=minatar", "launcher.torch_threads=1")
    direct_curve = curve(compose_cfg, tmp_path, "service=direct", *pixels)
    assert curve(compose_cfg, tmp_path, "service=process", "transport=shared_memory", *pixels) == direct_curve
    assert curve(compose_cfg, tmp_path, "service=process", "components.collector.local_policy=true",
                 *pixels) == direct_curve
