"""The sweep summary (``launcher/sweep.py``): hand-made job directories summarized in-process, the callback's
registration and its two ways to end (``on_multirun_end``; at exit after a job ended the sweep), and real
``--multirun`` sweeps through the basic launcher and ``hydra/launcher=local``."""

from __future__ import annotations

import csv
import io
import json
import math
import os

import pytest
import yaml
from omegaconf import OmegaConf

from launcher.sweep import CSV_NAME, CURVES_NAME, MARKDOWN_NAME, SweepSummary, write_sweep_summary
from tests.helpers import run_cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SHARED = ["recipe=ppo", "recipe.total_frames=4096"]
TINY = ("+recipe=ppo", "recipe.total_frames=1024", "recipe.target_return=null", "launcher.progress=false")


def _job(sweep_dir, num: int, overrides: list[str], summary: dict | None = None, curve=(), raw_summary=None):
    """A job's run directory as a real job leaves it: ``.hydra/``, and (when given) summary.json and metrics.csv."""
    run_dir = os.path.join(str(sweep_dir), f"{num}_{','.join(overrides)}")
    os.makedirs(os.path.join(run_dir, ".hydra"))
    with open(os.path.join(run_dir, ".hydra", "overrides.yaml"), "w") as f:
        yaml.safe_dump(SHARED + overrides, f)
    with open(os.path.join(run_dir, ".hydra", "hydra.yaml"), "w") as f:
        yaml.safe_dump({"hydra": {"job": {"num": num, "override_dirname": ",".join(overrides)}}}, f)
    if summary is not None or raw_summary is not None:
        with open(os.path.join(run_dir, "summary.json"), "w") as f:
            f.write(raw_summary if raw_summary is not None else json.dumps(summary))
    if curve:
        with open(os.path.join(run_dir, "metrics.csv"), "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["tag", "step", "value", "wall_time"])
            for step, value in curve:
                writer.writerow(["loss/policy", step, 0.1, 1.0])
                writer.writerow(["train/mean_return", step, value, 1.0])
    return run_dir


def _finished(frames=4096, solved_at=None, ret=100.0, fps=2000.0):
    return {"frames": frames, "wall_seconds": frames / fps, "fps": fps, "episodes": 50, "final_mean_return": ret,
            "solved": solved_at is not None, "solved_at_frames": solved_at}


def _csv_rows(sweep_dir) -> list[dict]:
    with open(os.path.join(str(sweep_dir), CSV_NAME), newline="") as f:
        return list(csv.DictReader(f))


def _summarize(sweep_dir, **kwargs):
    out = io.StringIO()
    table = write_sweep_summary(str(sweep_dir), file=out, **kwargs)
    return table, out.getvalue()


# ---------------------------------------------------------------------------------------------- one row per job
def test_one_row_per_job_with_its_overrides_status_and_figures(tmp_path):
    _job(tmp_path, 0, ["seed=0"], _finished(solved_at=3072, ret=480.5), curve=[(1024, 20.0), (2048, 80.0)])
    _job(tmp_path, 1, ["seed=1"], _finished(ret=150.0), curve=[(1024, 22.0)])
    _job(tmp_path, 2, ["seed=2"], {"interrupted": False, "signal": None, "frames": 2048, "mean_return": 31.5,
                                   "failed": "replay (process, pid 4242) died: the replay process died (killed by "
                                             "SIGKILL)"})
    _job(tmp_path, 3, ["seed=3"], {"interrupted": True, "signal": "SIGTERM", "failed": None, "frames": 1024,
                                   "mean_return": float("nan")}, curve=[(1024, 18.0)])
    _job(tmp_path, 4, ["seed=4"])  # a job that ended before its run began
    _job(tmp_path, 5, ["seed=5"], raw_summary='{"frames": 10')  # cut short while written

    table, printed = _summarize(tmp_path)

    assert [r["overrides"] for r in table] == [f"seed={i}" for i in range(6)]
    assert [r["status"] for r in table] == ["finished", "finished", "failed", "interrupted", "no result", "no result"]
    assert [r["solved"] for r in table] == [True, False, None, None, None, None]
    assert [r["solved_at_frames"] for r in table] == [3072, None, None, None, None, None]
    assert [r["frames"] for r in table] == [4096, 4096, 2048, 1024, None, None]
    # the final return: the summary's, else the last progress figure, else the curve's last point
    assert [r["final_mean_return"] for r in table] == [480.5, 150.0, 31.5, 18.0, None, None]
    assert "killed by SIGKILL" in table[2]["detail"] and table[3]["detail"] == "SIGTERM"
    assert "not readable JSON" in table[5]["detail"]

    rows = _csv_rows(tmp_path)
    assert [(r["job"], r["overrides"], r["status"], r["frames"]) for r in rows][:2] == [
        ("0", "seed=0", "finished", "4096"), ("1", "seed=1", "finished", "4096")]
    assert rows[0]["run_dir"] == "0_seed=0" and rows[4]["frames"] == ""
    with open(os.path.join(str(tmp_path), MARKDOWN_NAME)) as f:
        text = f.read()
    assert text in printed
    assert "every job: recipe=ppo recipe.total_frames=4096" in text.splitlines()[0]
    assert "| 0 | seed=0 | finished | yes | 3,072 | 4,096 | 2.0 | 2,000 | 480.5 |" in text
    assert "| 3 | seed=3 | interrupted (SIGTERM) | - | - | 1,024 | - | - | 18.0 |" in text
    assert "| 4 | seed=4 | no result | - | - | - | - | - | - |" in text
    assert "- job 2 failed: replay (process, pid 4242) died" in text
    with open(os.path.join(str(tmp_path), CURVES_NAME), "rb") as f:
        assert f.read(8) == PNG_SIGNATURE


def test_jobs_come_in_job_order_from_any_depth_and_submitit_folders_are_skipped(tmp_path):
    _job(tmp_path / "b", 1, ["lr=0.1"], _finished())  # an override holding "/" nests the directory
    _job(tmp_path / "a", 10, ["lr=0.3"], _finished())
    _job(tmp_path, 2, ["lr=0.2"], _finished())
    _job(tmp_path / ".submitit" / "123", 0, ["lr=9"], _finished())
    table, _ = _summarize(tmp_path)
    assert [(r["job"], r["overrides"]) for r in table] == [(1, "lr=0.1"), (2, "lr=0.2"), (10, "lr=0.3")]


def test_the_curves_come_from_metrics_csv_or_else_the_summarys_curve(tmp_path):
    from launcher.sweep import read_job

    logged = read_job(_job(tmp_path, 0, ["seed=0"], _finished(), curve=[(512, 10.0), (512, 12.0), (1024, 15.0),
                                                                         (1536, float("nan"))]))
    assert logged.curve == [(512.0, 12.0), (1024.0, 15.0)]  # a step logged twice: its later value; no NaN
    saved = read_job(_job(tmp_path, 1, ["seed=1"], {**_finished(), "curve": [[512, 9.0], [1024, 11.0]]}))
    assert saved.curve == [(512.0, 9.0), (1024.0, 11.0)]


def test_medians_over_seeds_of_the_same_other_overrides(tmp_path):
    summaries = {"lr=0.1": [_finished(ret=100.0), _finished(ret=200.0, solved_at=2048),
                            _finished(ret=300.0, solved_at=4096)],
                 "lr=0.2": [_finished(ret=50.0), _finished(ret=70.0), {"interrupted": True, "frames": 10}]}
    for num, (lr, seed) in enumerate((lr, seed) for lr in summaries for seed in range(3)):
        _job(tmp_path, num, [lr, f"seed={seed}"], summaries[lr][seed])
    table, printed = _summarize(tmp_path)
    assert len(table) == len(_csv_rows(tmp_path)) == 6  # medians are in the Markdown only
    assert "Medians over seeds (finished jobs):" in printed
    assert "| lr=0.1 | 3 | 3 | 2 | 3,072 | 4,096 | 2.0 | 2,000 | 200.0 |" in printed
    assert "| lr=0.2 | 3 | 2 | 0 | - | 4,096 | 2.0 | 2,000 | 60.0 |" in printed


def test_no_medians_without_a_seed_sweep(tmp_path):
    _job(tmp_path, 0, ["lr=0.1"], _finished())
    _job(tmp_path, 1, ["lr=0.2"], _finished())
    assert "Medians" not in _summarize(tmp_path)[1]


def test_a_dry_run_sweep_says_so_in_one_line_and_writes_nothing(tmp_path):
    _job(tmp_path, 0, ["seed=0"])
    _job(tmp_path, 1, ["seed=1"])
    table, printed = _summarize(tmp_path)
    assert table is None
    assert printed == f"sweep summary: no job in {tmp_path} wrote a summary.json (a dry run writes none); " \
                      "nothing written\n"
    assert not {CSV_NAME, MARKDOWN_NAME, CURVES_NAME} & set(os.listdir(tmp_path))
    assert _summarize(tmp_path / "missing")[0] is None


def test_a_job_without_a_curve_still_has_its_row_and_no_curve_at_all_writes_no_png(tmp_path):
    _job(tmp_path, 0, ["seed=0"], _finished())
    table, printed = _summarize(tmp_path)
    assert table[0]["overrides"] == "recipe=ppo recipe.total_frames=4096 seed=0"  # one job: all its overrides
    assert CURVES_NAME not in os.listdir(tmp_path) and f"{MARKDOWN_NAME})" in printed
    assert math.isclose(table[0]["fps"], 2000.0)


# ---------------------------------------------------------------------------------------------- the callback
def test_the_callback_is_registered_in_the_primary_config(compose_cfg):
    from hydra import compose, initialize_config_module
    from hydra.utils import instantiate

    with initialize_config_module(config_module="conf", version_base=None):
        cfg = compose("config", overrides=["recipe=ppo"], return_hydra_config=True)
    assert isinstance(instantiate(cfg.hydra.callbacks.sweep_summary), SweepSummary)


def test_the_callback_summarizes_at_the_end_of_the_multirun_or_else_at_exit(tmp_path, monkeypatch, capsys):
    registered = []
    monkeypatch.setattr("launcher.sweep.atexit.register", registered.append)
    _job(tmp_path, 0, ["seed=0"], _finished())
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})

    ended = SweepSummary()
    ended.on_multirun_start(config)
    ended.on_multirun_end(config)
    assert "| 0 | recipe=ppo recipe.total_frames=4096 seed=0 | finished |" in capsys.readouterr().out
    registered.pop()()  # at exit: already written, nothing more
    assert capsys.readouterr().out == ""

    os.remove(os.path.join(str(tmp_path), CSV_NAME))
    stopped = SweepSummary()  # a job failed: Hydra's sweep raised, on_multirun_end never came
    stopped.on_multirun_start(config)
    registered.pop()()
    assert "(the sweep ended early)" in capsys.readouterr().out.strip().splitlines()[0]
    assert os.path.exists(os.path.join(str(tmp_path), CSV_NAME))


# ---------------------------------------------------------------------------------------------- real sweeps
@pytest.mark.slow
def test_a_real_sweep_writes_and_prints_its_summary(tmp_path):
    sweep_dir = os.path.join(str(tmp_path), "sweep")
    result = run_cli("--multirun", *TINY, "seed=0,1", f"hydra.sweep.dir={sweep_dir}", cwd=str(tmp_path), timeout=240)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    rows = _csv_rows(sweep_dir)
    assert [(r["job"], r["overrides"], r["status"], r["frames"]) for r in rows] == [
        ("0", "seed=0", "finished", "1024"), ("1", "seed=1", "finished", "1024")]
    with open(os.path.join(sweep_dir, MARKDOWN_NAME)) as f:
        text = f.read()
    assert text in result.stdout and "| 1 | seed=1 | finished | no | - | 1,024 |" in text
    with open(os.path.join(sweep_dir, CURVES_NAME), "rb") as f:
        assert f.read(8) == PNG_SIGNATURE


@pytest.mark.slow
def test_a_dry_run_sweep_ends_normally_with_one_line(tmp_path):
    sweep_dir = os.path.join(str(tmp_path), "sweep")
    result = run_cli("--multirun", "+recipe=ppo", "seed=0,1", "launcher.dry_run=true", f"hydra.sweep.dir={sweep_dir}",
                     cwd=str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout.rstrip().splitlines()[-1].startswith("sweep summary: no job in ")
    assert CSV_NAME not in os.listdir(sweep_dir)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "local"])
def test_a_sweep_a_job_ended_still_gets_its_summary(launcher, tmp_path):
    if launcher == "local":
        pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="pip install -e '.[slurm]'")
    sweep_dir = os.path.join(str(tmp_path), "sweep")
    chosen = ["hydra/launcher=local"] if launcher == "local" else []
    result = run_cli("--multirun", *chosen, *TINY, "launcher.resume=null,/nonexistent", f"hydra.sweep.dir={sweep_dir}",
                     cwd=str(tmp_path), timeout=240)
    assert result.returncode != 0 and "configuration error: launcher.resume='/nonexistent'" in result.stderr
    rows = [(r["overrides"].split()[-1], r["status"]) for r in _csv_rows(sweep_dir)]
    if launcher == "basic":  # the refused job leaves no directory (not even one nested by the "/" of its value)
        assert rows == [("launcher.resume=null", "finished")]
        assert not any("nonexistent" in name for name in os.listdir(sweep_dir))
    else:  # a job in a process of its own did not make the sweep's directory: it leaves its own as it is
        assert rows == [("launcher.resume=null", "finished"), ("launcher.resume=/nonexistent", "no result")]
    assert "(the sweep ended early)" in result.stdout
