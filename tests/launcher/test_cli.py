"""``python -m launcher`` as a user runs it: real subprocesses, real run directories."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import run_cli

pytestmark = pytest.mark.slow


def test_incompatible_plan_exits_nonzero_naming_everything(tmp_path):
    proc = run_cli("+recipe=ppo", "service=ray", "transport=shared_memory", "launcher.dry_run=true",
                   f"hydra.run.dir={tmp_path}", cwd=str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.startswith("configuration error: ")
    for needle in ("placed on 'ray'", "transport 'shared_memory'", "full_key: transport", "supported: auto, ray, distributed"):
        assert needle in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path):
    proc = run_cli("+recipe=ppo", "service=process", "transport=shared_memory", "launcher.dry_run=true",
                   f"hydra.run.dir={tmp_path}", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "NOT IMPLEMENTED YET" not in proc.stdout and "shared_memory" in proc.stdout
    assert "inference.request: observation [16, 4] float32" in proc.stdout
    assert "collector.sync" not in proc.stdout  # the default is not worth a line
    assert not (tmp_path / "metrics.csv").exists()


def test_dry_run_says_when_collection_overlaps_learning(tmp_path):
    proc = run_cli("+recipe=ppo", "service=process", "components.collector.sync=false", "launcher.dry_run=true",
                   f"hydra.run.dir={tmp_path}", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "collector.sync: false" in proc.stdout and "policy lag <= 1" in proc.stdout
    proc = run_cli("+recipe=ppo", "components.collector.sync=maybe", "launcher.dry_run=true",
                   f"hydra.run.dir={tmp_path}", cwd=str(tmp_path))
    assert proc.returncode != 0 and "components.collector.sync" in proc.stderr and "maybe" in proc.stderr


def test_dry_run_marks_cells_not_built_yet(tmp_path):
    proc = run_cli("+recipe=ppo", "service=distributed", "launcher.dry_run=true", f"hydra.run.dir={tmp_path}",
                   cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("NOT IMPLEMENTED YET") == 5 + 1  # five components and the footnote
    assert "this plan cannot run yet" in proc.stdout


def test_running_a_plan_not_built_yet_fails_before_anything_starts(tmp_path):
    proc = run_cli("+recipe=ppo", "service=distributed", f"hydra.run.dir={tmp_path}", cwd=str(tmp_path))
    assert proc.returncode == 2
    assert "is not implemented yet" in proc.stderr
    assert not (tmp_path / "metrics.csv").exists() and not (tmp_path / "plan.json").exists()


def test_plain_recipe_form_works_too(tmp_path):
    proc = run_cli("recipe=ppo", "launcher.dry_run=true", f"hydra.run.dir={tmp_path}", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "plan: recipe=ppo env=CartPole-v1 seed=0" in proc.stdout


def test_schema_errors_name_the_config_path(tmp_path):
    proc = run_cli("+recipe=ppo", "recipe.lr=fast", f"hydra.run.dir={tmp_path}", cwd=str(tmp_path))
    assert proc.returncode != 0
    assert "recipe.lr" in proc.stderr and "fast" in proc.stderr
    proc = run_cli("+recipe=ppo", "service=cloud", f"hydra.run.dir={tmp_path}", cwd=str(tmp_path))
    assert proc.returncode != 0 and "service" in proc.stderr and "process" in proc.stderr


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


def _pgroup_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid:
                members.append(int(entry))
    return members


def test_ctrl_c_tears_everything_down(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "+recipe=ppo", "recipe.total_frames=10000000", "recipe.target_return=null",
         "logger.flush_every=1000000", f"hydra.run.dir={run_dir}"],
        cwd=str(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        log = run_dir / "launcher.log"
        while time.monotonic() < deadline and not (log.exists() and "starting collector" in log.read_text()):
            time.sleep(0.2)
        time.sleep(1.5)  # let it train a few batches
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted: every service was shut down" in err
    text = log.read_text()
    for name in ("collector", "inference", "replay", "weight_sync", "logger"):
        assert f"stopping {name}" in text
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert len(rows) > 1, "the logger did not flush on Ctrl-C"
    assert _pgroup_members(proc.pid) == []
