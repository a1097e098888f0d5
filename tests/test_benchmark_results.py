"""What a benchmark records (benchmarks/_results.py): plain JSON that names no directory of the machine it ran on."""

import json
import math
import os
import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import _results  # noqa: E402


def test_a_recorded_run_is_plain_json_with_paths_relative_to_the_checkout(tmp_path):
    run = _results.Results("probe", argv=["--quick"])
    where = os.path.join(_results.ROOT, "transports", "queue.py") + ":206(_receive)"
    run.table("profile", ["calls", "where"], [[3, where], [math.nan, "{built-in method posix.sched_yield}"]])
    path = run.save(str(tmp_path))
    text = open(path).read()
    assert _results.ROOT not in text
    (saved,) = json.loads(text)["runs"]
    assert saved["tables"][0]["rows"] == [[3, "transports/queue.py:206(_receive)"],
                                          [None, "{built-in method posix.sched_yield}"]]
    assert saved["command"] == "python benchmarks/probe.py --quick"


def test_a_script_keeps_several_results_files_and_a_line_plot_its_spread(tmp_path):
    run = _results.Results("learning", argv=["minatar"], record="learning_minatar")
    run.plot("curves", "return", x=[1, 2, 3], series={"direct": [1.0, 2.0, None]},
             bands={"direct": ([0.5, 1.5, None], [1.5, 2.5, None])})
    path = run.save(str(tmp_path))
    assert os.path.basename(path) == "learning_minatar.json"
    (saved,) = json.loads(open(path).read())["runs"]
    assert saved["command"] == "python benchmarks/learning.py minatar"
    assert saved["plots"][0]["bands"] == {"direct": [[0.5, 1.5, None], [1.5, 2.5, None]]}
    assert _results.plot_png(saved["plots"][0]).startswith(b"\x89PNG")
    assert "python benchmarks/learning.py" in _results.page("learning_pong", [])  # the script, not the file's name
    with pytest.raises(ValueError, match="bands"):
        run.plot("bad", "t", x=[1], series={"a": [1.0]}, bands={"b": ([0.0], [2.0])})


def test_seeds_curves_are_read_at_common_frame_counts():
    import learning

    curves = [[(100, 1.0), (200, 3.0)], [(150, 2.0), (250, 4.0)], [(50, 0.0), (200, 5.0)]]
    med, low, high = learning.summarise(curves, [60, 150, 260])
    assert med == [None, 1.0, 4.0]  # at 60 two seeds have no point yet; at 260 each seed's last point
    assert low == [None, 0.0, 3.0] and high == [None, 2.0, 5.0]


def test_sample_factory_s_games_become_a_curve_of_the_mean_of_its_recent_games():
    import learning

    result = {"returns": [1.0, 3.0, 5.0, 7.0], "returns_at": [0, 256, 256, 512]}
    assert learning.sample_factory_curve(result, window=2) == [(0, 1.0), (256, 2.0), (256, 4.0), (512, 6.0)]
    assert learning.sample_factory_curve({"returns": [], "returns_at": []}) == []


def test_ppo_s_rows_are_read_from_a_recorded_run_of_the_same_budget_and_seeds_only(tmp_path):
    import learning

    run = _results.Results("learning", record="learning_breakout",
                           argv=["breakout", "--recipes", "ppo", "impala", "--services", "process/local_policy",
                                 "--frames", "300", "--seeds", "0", "1", "--jobs", "2"])
    label = "ppo process/local_policy"
    run.table("summary", ["run", "r", "frames/s"], [[label, "2.0 [1.0-3.0]", 100.0], ["impala x", "1.0", 200.0]])
    run.table("each seed", ["run", "seed", "r", "frames/s"], [[label, 0, 1.0, 99.0], [label, 1, 3.0, 101.0]])
    run.plot("curves", "return", x=[150, 300], series={label: [1.5, 2.0]}, bands={label: ([1.0, 1.0], [2.0, 3.0])})
    run.save(str(tmp_path))

    found = learning.recorded_ppo("breakout", 1, 300, [0, 1], ["process/local_policy"], str(tmp_path))
    got = found["process/local_policy"]
    assert got["median"] == [1.5, 2.0] and got["band"] == ([1.0, 1.0], [2.0, 3.0])
    assert got["row"][0].startswith(f"{label} (recorded in learning_breakout.json on ") and got["row"][1:] == [
        "2.0 [1.0-3.0]", 100.0]
    assert [r[1:] for r in got["per_seed"]] == [[0, 1.0, 99.0], [1, 3.0, 101.0]]
    for frames, seeds, placements, why in ((600, [0, 1], ["process/local_policy"], "300 frames on seeds"),
                                           (300, [0, 1, 2], ["process/local_policy"], "seeds \\[0, 1\\]"),
                                           (300, [0, 1], ["direct"], "no 'ppo direct'")):
        with pytest.raises(SystemExit, match=why):
            learning.recorded_ppo("breakout", 1, frames, seeds, placements, str(tmp_path))
    with pytest.raises(SystemExit, match="holds runs 1-1"):
        learning.recorded_ppo("breakout", 2, 300, [0, 1], ["process/local_policy"], str(tmp_path))


def test_an_override_of_the_appo_update_reaches_sample_factory_s_update_and_nothing_else_does():
    import _sample_factory

    base = _sample_factory.sample_factory_update()
    assert "--num_epochs=3" in base  # conf/recipe_env/appo_atari.yaml's passes
    changed = _sample_factory.sample_factory_update(["recipe.update_epochs=4", "++recipe.num_minibatches=4", "seed=3",
                                             "components.collector.local_policy=true"])
    assert "--num_epochs=4" in changed
    assert changed[changed.index("--minibatches") + 1] == "4"
    assert changed[changed.index("--batch-size") + 1] == base[base.index("--batch-size") + 1]


def test_the_impala_atari_override_leaves_ppo_s_reference_rows_alone():
    import impala_atari

    more = ["recipe.update_epochs=4"]
    assert impala_atari.row_overrides("ppo", ["service=direct"], more) == ["service=direct"]
    assert impala_atari.row_overrides("appo", ["service=process"], more) == ["service=process", *more]


@pytest.mark.slow
def test_the_impala_atari_override_reaches_the_overlap_bound_s_phases():
    from _harness import in_child

    # composed with the override, as the rows are: a smaller update times fewer frames
    phases = in_child("impala_atari", "recipe_phases('appo', 2, 0, 'gymnasium', ('recipe.num_envs=2', "
                      "'recipe.unroll_length=8', 'recipe.batch_size=2'))", timeout=300)
    assert phases["frames"] == 16 and phases["collect_s"] > 0 and phases["learn_s"] > 0
