"""The GPU check (benchmarks/gpu_check.sh) and its benchmark (benchmarks/gpu.py) on a machine without CUDA: what they
say, what they record, and how the benchmark reads its rows into verdicts; the APPO rows' overrides plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
import torch

from tests.helpers import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import gpu  # noqa: E402
from _results import Results  # noqa: E402


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the check measures instead")
def test_the_gpu_check_without_cuda_says_so_runs_what_it_can_and_exits_0(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_SECONDS": "300"}
    done = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_check.sh"), str(tmp_path), "abc1234"],
                          capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(os.listdir(tmp_path)) == ["gpu.json", "gpu_bench.log", "gpu_check.log", "machine.txt", "pytest.log"]
    log = (tmp_path / "gpu_check.log").read_text()
    assert "no CUDA on this machine" in log and "gpu tests: exit status 0" in log and "status 0" in log
    tests = (tmp_path / "pytest.log").read_text()
    assert "needs 2 CUDA devices (this machine has none)" in tests and " passed" not in tests  # skipped, with reasons
    run = json.loads((tmp_path / "gpu.json").read_text())["runs"][-1]
    assert [t["note"].split(" (")[0] for t in run["tables"]] == ["skipped: no CUDA"] * 3
    assert run["verdicts"] == [] and all(t["rows"] == [] for t in run["tables"])
    assert run["commit"]  # git's, or the one given where the checkout has no git directory


def test_without_cuda_the_benchmark_records_nothing_unless_given_a_folder(tmp_path, capsys, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the benchmark measures instead")
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--rows", "learner"])
    gpu.main()
    out = capsys.readouterr()
    assert "skipped: no CUDA" in out.out and "nothing measured: nothing recorded" in out.out
    assert "every GPU row is skipped" in out.err
    monkeypatch.setattr(sys, "argv", ["gpu.py", "--rows", "appo", "--results-dir", str(tmp_path), "--commit", "x"])
    gpu.main()
    assert (tmp_path / "gpu.json").exists()


def _args(**values):
    return types.SimpleNamespace(**{"rounds": 3, "requests": 60, "workers": 8, **values})


def test_inference_verdicts_take_the_median_of_the_per_round_ratios():
    rec = Results("gpu", argv=[])
    rates = {"eager, pinned": [100.0, 110.0, 90.0], "static graphs, pinned": [160.0, 150.0, 170.0],
             "eager, unpinned": [80.0, 70.0, 90.0], "static graphs, unpinned": [None, None, None]}
    gpu.report_inference(rec, {"rates": rates, "errors": {"static graphs, unpinned": "RuntimeError: no graph"}}, None,
                         _args())
    static, pinned = rec.verdicts
    assert static.startswith("PASS inference static graphs vs eager (pinned): 1.60x") and "target >= 1.5x" in static
    assert pinned.startswith("MISS inference pinned vs unpinned (eager): 1.25x") and "target >= 1.3x" in pinned
    rows = {row[0]: row for row in rec.tables[0]["rows"]}
    assert rows["static graphs, unpinned"][1:3] == [None, "RuntimeError: no graph"]  # a failed row says why
    assert rows["static graphs, pinned"][3] == pytest.approx(160 / 100)


def test_learner_and_appo_verdicts_read_their_rows():
    rec = Results("gpu", argv=[])
    gpu.report_learner(rec, {"cpu": {"device": "cpu", "threads": 16, "seconds": [2.0, 2.2, 1.8]},
                             "gpu": {"device": "cuda", "threads": 1, "seconds": [0.2, 0.25, 0.3]}}, None)
    assert rec.verdicts[-1].startswith("PASS learner updates/s on cuda: 8.0x the CPU learner's 0.50 on 16 threads")
    gpu.report_appo(rec, {"workers": 14, "envs": 56, "simulation": [10_000.0, 12_000.0],
                          "runs": {"replicas": [7_000.0], "server": [None]}, "errors": {"server": "exited 1"}}, None,
                    30_000)
    assert rec.verdicts[-1] == ("MISS APPO, replicas: 7,000 frames/s = 0.64 of pure simulation's 11,000 "
                                "(target >= 0.75)")
    assert "server: failed: exited 1" in rec.notes


@pytest.mark.parametrize("cores", [16, 2])
def test_the_appo_rows_plan_on_a_machine_of_that_many_cores(cores):
    from launcher import cli
    from launcher.preflight import check_argv

    workers, envs = gpu.appo_plan(cores)
    assert (workers, envs) == ((14, 56) if cores == 16 else (1, 4))
    for _, overrides in gpu.appo_rows("cuda", workers, envs):  # a dry run plans a CUDA device anywhere
        (cfg,) = check_argv(["+recipe=appo", "env=atari", "recipe.total_frames=30000", *overrides,
                             "launcher.dry_run=true"])
        plan = cli.plan(cfg)
        assert plan.recipe_config.device == "cuda" and plan.recipe_config.num_envs == envs
