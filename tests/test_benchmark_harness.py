"""What every benchmark repeats, written once (benchmarks/_harness.py): the checkout on sys.path, the statistics of
the tables, the measuring loops and the launcher runs."""

import ast
import glob
import math
import os
import sys

import pytest

from tests.helpers import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import _harness  # noqa: E402

PROJECT = ("components", "transports", "recipes", "launcher")
TAKES_THE_CHECKOUT = ("_harness", "_sample_factory")
"""Modules of benchmarks/ whose first import is the harness: importing one puts the checkout on sys.path."""
BY_PACKAGE_PATH = ("_load.py",)
"""Modules imported as ``benchmarks.<name>`` (the checkout already on sys.path): a Ray actor unpickles what they define
by that path, which every worker can import."""


def test_latency_gives_percentiles_and_the_rate_of_items():
    cell = _harness.latency([1.0, 2.0, 3.0, 4.0, 100.0], seconds=2.0, per_call=256)
    assert cell == {"p50": 3.0, "p95": pytest.approx(80.8), "rate": 5 * 256 / 2.0, "n": 5}
    assert _harness.percentiles([10.0, 20.0, 30.0, 40.0], (25, 50, 75)) == [17.5, 25.0, 32.5]


def test_a_spread_leaves_out_runs_that_measured_nothing():
    got = _harness.spread([3.0, None, 1.0, math.nan, 2000.0])
    assert got == (3.0, 1.0, 2000.0) and got.range() == "1-2,000" and got.text(".1f") == "3.0 (1.0-2000.0)"
    assert _harness.spread([None, math.nan]) is None


def test_clients_at_once_share_a_span_and_one_client_s_rounds_add_their_durations():
    parts = [([10.0, 20.0], 0.0, 1.0), ([30.0, 40.0], 0.5, 2.0)]
    assert _harness.summarize(parts) == {"p50": 25.0, "p95": pytest.approx(38.5), "rate": 4 / 2.0, "n": 4}
    assert _harness.summarize(parts, sequential=True)["rate"] == 4 / 2.5
    lat, start, end = _harness.round_trips(lambda: None, warmup=2, n=7)
    assert len(lat) == 7 and start <= end


def test_interleaved_rows_take_turns_and_numbered_calls_their_sequence():
    seen = {"a": [], "b": []}
    order = []
    calls = {name: (lambda i, name=name: (seen[name].append(i), order.append(name))) for name in seen}
    measured = _harness.interleaved(calls, warmup=2, n=6, rounds=3, budget=60.0, numbered=True)
    assert seen == {"a": [0, 1, 2, 3, 4, 5, 6, 7], "b": [0, 1, 2, 3, 4, 5, 6, 7]}
    assert order[4:] == ["a", "a", "b", "b"] * 3  # after the warm-ups, blocks of 2 in turn
    assert {name: len(lat) for name, (lat, _) in measured.items()} == {"a": 6, "b": 6}
    slow = _harness.interleaved({"x": lambda: sum(range(10_000))}, warmup=0, n=10, rounds=5, budget=0.0)
    assert len(slow["x"][0]) == 2  # over its budget after the first round: the row stops


def _imports(path: str) -> list[str]:
    """The modules ``path`` imports at its top level, in order."""
    tree = ast.parse(open(path).read())
    names = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return names


def test_every_script_takes_the_checkout_from_the_harness_and_no_other_bootstrap():
    scripts = sorted(glob.glob(os.path.join(ROOT, "benchmarks", "*.py")))
    assert len(scripts) > 10
    own_bootstrap = [os.path.basename(p) for p in scripts if "sys.path.insert(" in open(p).read()
                     and not p.endswith("_harness.py")]
    assert own_bootstrap == []
    late = []
    for path in scripts:
        if os.path.basename(path) in BY_PACKAGE_PATH:
            continue
        names = _imports(path)
        first_project = next((i for i, n in enumerate(names) if n.split(".")[0] in PROJECT), None)
        if first_project is not None and not any(n in TAKES_THE_CHECKOUT for n in names[:first_project]):
            late.append(os.path.basename(path))
    assert late == []


def test_a_run_directory_without_a_summary_reads_as_none(tmp_path):
    assert _harness.read_summary(str(tmp_path)) is None


@pytest.mark.slow
def test_a_launcher_run_gives_its_summary_and_its_seconds_or_says_why_it_failed(tmp_path):
    with pytest.raises(RuntimeError, match="(?s)exited with status 2.*no key .no_such_key"):
        _harness.launcher_run(["+recipe=ppo", "recipe.no_such_key=1"], timeout=120)
    overrides = ["+recipe=ppo", "recipe.num_envs=4", "recipe.num_steps=32", "recipe.total_frames=256",
                 "recipe.target_return=null", "launcher.progress=false", "launcher.plot=false"]
    summary, seconds = _harness.launcher_run(overrides, timeout=240)
    assert summary["frames"] == 256 and 0 < summary["wall_seconds"] < seconds
    kept = str(tmp_path / "run")
    names, _ = _harness.launcher_run(overrides, timeout=240, run_dir=kept, read=os.listdir)
    assert "summary.json" in names and os.path.isdir(kept)
