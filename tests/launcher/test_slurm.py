"""Sweeps through hydra-submitit-launcher: each job a real Slurm job (``hydra/launcher=slurm``, on the one-node
Slurm of ``.ci/local_slurm.sh``) or a local subprocess (``hydra/launcher=local``). A job's run directory holds
what a local run's holds, and no job of ours is left in the queue.

The Slurm, and where its tests skip: ``tests/slurm.py``.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import subprocess

import pytest
from omegaconf import OmegaConf

from tests.helpers import popen_cli, run_cli, wait_until
from tests.slurm import ACTIVE, JOB_NAME, squeue as _squeue

TINY = ("+recipe=ppo", "recipe.total_frames=1024", "recipe.target_return=null", "launcher.progress=false")

pytest.importorskip("hydra_plugins.hydra_submitit_launcher",
                    reason="needs hydra-submitit-launcher: pip install -e '.[slurm]'")

def _run_files(run_dir: str) -> set[str]:
    """Paths under a run directory, relative to it (TensorBoard event files by pattern: their names vary)."""
    files = set()
    for parent, _, names in os.walk(run_dir):
        for name in names:
            rel = os.path.relpath(os.path.join(parent, name), run_dir)
            files.add(re.sub(r"events\.out\.tfevents\..*$", "events.out.tfevents.*", rel))
    return files


def _sweep(cwd, *args: str, env: dict | None = None) -> list[str]:
    """``python -m launcher --multirun ...`` into ``<cwd>/sweep``; each job's run directory, in job order."""
    sweep_dir = os.path.join(str(cwd), "sweep")
    result = run_cli("--multirun", *TINY, *args, f"hydra.sweep.dir={sweep_dir}", cwd=str(cwd), timeout=240, env=env)
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    return sorted(glob.glob(os.path.join(sweep_dir, "[0-9]*_*")))


def _job_id(run_dir: str) -> str:
    """The submitit job id Hydra recorded for this run (Slurm: ``<job>`` or ``<array job>_<task>``)."""
    return str(OmegaConf.load(os.path.join(run_dir, ".hydra", "hydra.yaml")).hydra.job.id)


@pytest.fixture(scope="module")
def local_run_files(tmp_path_factory) -> set[str]:
    """What a run directory holds when Hydra runs the job in this process (its basic launcher)."""
    (run_dir,) = _sweep(tmp_path_factory.mktemp("basic"))
    files = _run_files(run_dir)
    assert {"plan.json", "summary.json", "metrics.csv", "resolved_config.yaml", "launcher.log"} <= files
    return files


def _assert_like_a_local_run(run_dir: str, local_run_files: set[str]) -> None:
    assert _run_files(run_dir) == local_run_files
    with open(os.path.join(run_dir, "summary.json")) as f:
        assert json.load(f)["frames"] == 1024


# ---------------------------------------------------------------------------------------------- the options
def test_slurm_and_local_options_extend_the_plugins_options():
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="conf", version_base=None):
        slurm = compose("config", overrides=["hydra/launcher=slurm", "hydra.launcher.cpus_per_task=3"],
                        return_hydra_config=True).hydra.launcher
        local = compose("config", overrides=["hydra/launcher=local"], return_hydra_config=True).hydra.launcher
    assert slurm._target_.endswith("SlurmLauncher") and local._target_.endswith("LocalLauncher")
    assert (slurm.partition, slurm.timeout_min, slurm.cpus_per_task, slurm.mem_gb) == (None, 60, 3, None)
    assert local.timeout_min == 60


def test_the_preflight_checks_every_job_and_leaves_hydra_launcher_overrides_to_hydra():
    from launcher.preflight import check_argv

    configs = check_argv(["--multirun", "hydra/launcher=slurm", "hydra.launcher.timeout_min=5", "+recipe=ppo",
                          "seed=0,1"])
    assert [cfg.seed for cfg in configs] == [0, 1]


@pytest.mark.parametrize("override, message", [
    ("hydra.launcher.timeout_min=abc", "hydra.launcher.timeout_min must be an integer, got 'abc'"),
    ("hydra/launcher=slurmm", "hydra/launcher has no option 'slurmm'"),
    ("hydra.launcher.partion=gpu", "hydra.launcher has no key 'partion'"),
])
def test_a_mistake_in_the_launchers_options_is_a_configuration_error(override, message):
    from launcher.preflight import check_argv
    from transports.kernel.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=re.escape(message)):
        check_argv(["--multirun", "hydra/launcher=slurm", override, "+recipe=ppo", "seed=0,1"])


# ---------------------------------------------------------------------------------------------- real jobs
@pytest.mark.slurm
@pytest.mark.slow
def test_a_sweep_runs_as_slurm_jobs(local_slurm, local_run_files, tmp_path):
    run_dirs = _sweep(tmp_path, "hydra/launcher=slurm", f"hydra.launcher.name={JOB_NAME}", "seed=0,1",
                      env=local_slurm)
    assert len(run_dirs) == 2
    ids = [_job_id(run_dir) for run_dir in run_dirs]
    assert all(re.fullmatch(r"\d+_[01]", job_id) for job_id in ids), ids  # one array job, a task per run
    for run_dir, job_id in zip(run_dirs, ids):
        _assert_like_a_local_run(run_dir, local_run_files)
        with open(os.path.join(str(tmp_path), "sweep", ".submitit", job_id, f"{job_id}_0_log.out")) as f:
            assert "ppo CartPole-v1 finished: 1,024 frames" in f.read()
    # The job ends a moment after its result is written: then it is COMPLETED, in the local partition.
    wait_until(lambda: _squeue(local_slurm, ACTIVE) == [], timeout=60, what="our jobs to end")
    assert {f"{job_id}|COMPLETED|local" for job_id in ids} <= set(_squeue(local_slurm))


@pytest.mark.slurm
@pytest.mark.slow
def test_the_plugins_own_submitit_slurm_option_runs_too(local_slurm, local_run_files, tmp_path):
    (run_dir,) = _sweep(tmp_path, "hydra/launcher=submitit_slurm", f"hydra.launcher.name={JOB_NAME}",
                        env=local_slurm)
    _assert_like_a_local_run(run_dir, local_run_files)
    wait_until(lambda: _squeue(local_slurm, ACTIVE) == [], timeout=60, what="our jobs to end")
    assert f"{_job_id(run_dir)}|COMPLETED|local" in _squeue(local_slurm)


@pytest.mark.slow
def test_local_runs_each_job_as_a_subprocess(local_run_files, tmp_path):
    (run_dir,) = _sweep(tmp_path, "hydra/launcher=local")
    _assert_like_a_local_run(run_dir, local_run_files)
    job_id = _job_id(run_dir)
    assert job_id.isdigit() and int(job_id) != os.getpid()  # submitit's local job id: the subprocess's pid


# ---------------------------------------------------------------------------------------------- preemption, requeue
PREEMPTIBLE = ("+recipe=ppo", "recipe.target_return=null", "launcher.progress=false", "launcher.checkpoint_every=4096")


def test_a_requeued_job_resumes_its_own_checkpoint_and_no_other(compose_cfg, tmp_path, monkeypatch):
    from launcher.checkpointing import resolve
    from launcher.plan import build_plan
    from launcher.checkpointing import Checkpoint

    def written_by(job: str) -> str:
        run_dir = tmp_path / job
        run_dir.mkdir()
        checkpoint = Checkpoint(str(run_dir / "checkpoint.pt"), extras={"run": lambda: {"recipe": "ppo", "job": job}})
        checkpoint.step(512, dict)
        assert checkpoint.save()
        return str(run_dir)

    plan = build_plan(compose_cfg("+recipe=ppo"))
    ours, other = written_by("12_3"), written_by("11_3")
    assert resolve(plan, ours).state is None  # outside a submitit job: launcher.resume decides
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")  # task 3 of array job 12, as Slurm and submitit say it
    monkeypatch.setenv("SLURM_JOB_ID", "15")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "12")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    resumed = resolve(plan, ours)
    assert (resumed.run_dir, resumed.frames) == (ours, 512)
    assert resolve(plan, other).state is None  # another job's checkpoint: a fresh start
    assert resolve(plan, str(tmp_path / "first_attempt")).state is None


def test_the_preemption_signal_stops_the_run_before_submitit_requeues_the_job(monkeypatch):
    from launcher.requeue import Preempted, handle_preemption

    requeued = []
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGUSR2, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGUSR2, lambda signum, frame: requeued.append(signum))  # stands for submitit's handler
        monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
        handle_preemption()
        with pytest.raises(Preempted) as info:  # in the main thread, so the run checkpoints and stops its services
            signal.raise_signal(signal.SIGUSR2)
        assert info.value.signal_name == "SIGUSR2" and requeued == []
        signal.raise_signal(signal.SIGUSR2)  # a second one must not cut the checkpoint short: only logged
        info.value.requeue()  # once every service is down
        assert requeued == [signal.SIGUSR2]
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN  # Slurm's SIGTERM for the requeue ends nothing
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def _submit(tmp_path, env: dict, *args: str) -> subprocess.Popen:
    """Start a one-job Slurm sweep of PREEMPTIBLE into ``<tmp_path>/sweep``, in the background."""
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        return popen_cli("--multirun", "hydra/launcher=slurm", f"hydra.launcher.name={JOB_NAME}", *PREEMPTIBLE, *args,
                         f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=str(tmp_path), stdout=out, stderr=err,
                         env={**os.environ, **env})


@contextlib.contextmanager
def _cancelled_at_exit(proc: subprocess.Popen, env: dict):
    """However the test ends, our job leaves the queue and the sweep command is gone (killed: submitit would notice
    the cancelled job only at its next accounting poll, up to a minute later)."""
    try:
        yield
    finally:
        if proc.poll() == 0:  # the sweep has its result and its job ends by itself: a scancel now cancels its last step
            with contextlib.suppress(AssertionError):
                wait_until(lambda: _squeue(env, ACTIVE) == [], timeout=30, interval=0.1, what="our job to end")
        subprocess.run(["scancel", f"--name={JOB_NAME}"], env={**os.environ, **env}, timeout=30)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        wait_until(lambda: _squeue(env, ACTIVE) == [], timeout=60, what="our job to leave the queue")


def _while_submitted(proc: subprocess.Popen, tmp_path, condition):
    """``condition``, for :func:`wait_until`, failing at once (with its stderr) once the sweep command has ended."""

    def check():
        if proc.poll() is not None:
            raise AssertionError(f"the sweep ended (exit {proc.returncode}):\n{(tmp_path / 'err').read_text()[-3000:]}")
        return condition()

    return check


def _job_log(tmp_path, job_id: str) -> str:
    path = tmp_path / "sweep" / ".submitit" / job_id / f"{job_id}_0_log.out"
    return path.read_text() if path.exists() else ""


def _resumed_at(log: str, run_dir: str) -> int | None:
    """The frame count the log says the job resumed its run directory at (``None``: it did not resume)."""
    match = re.search(rf"resuming the run in {re.escape(run_dir)} at ([\d,]+) frames", log)
    return int(match[1].replace(",", "")) if match else None


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.parametrize("service", ["process"])  # the signal reaches every process of the job, the driver's own too
def test_a_preempted_job_is_requeued_and_resumes_from_its_checkpoint(local_slurm, tmp_path, service):
    from launcher.checkpointing import load

    total = 40_960  # 80 batches of 512 frames
    # one CPU whatever the plan asks: this Slurm binds no process to its CPUs, and its node may have only two
    proc = _submit(tmp_path, local_slurm, f"recipe.total_frames={total}", f"service={service}",
                   "hydra.launcher.cpus_per_task=1")
    with _cancelled_at_exit(proc, local_slurm):
        (checkpoint,) = wait_until(_while_submitted(proc, tmp_path, lambda: glob.glob(
            str(tmp_path / "sweep" / "[0-9]*_*" / "checkpoint.pt"))), timeout=120, interval=0.05,
            what="the job's first checkpoint")
        (job,) = _squeue(local_slurm, "RUNNING")
        job_id = job.split("|")[0]
        subprocess.run(["scancel", "--signal=USR2", job_id], env={**os.environ, **local_slurm}, check=True, timeout=30)
        assert proc.wait(timeout=180) == 0, (tmp_path / "err").read_text()[-4000:]
    run_dir = os.path.dirname(checkpoint)
    assert glob.glob(str(tmp_path / "sweep" / "[0-9]*_*")) == [run_dir]  # the requeued job ran in the same one
    log = _job_log(tmp_path, job_id)
    assert "this job is preempted" in log and f"Requeued job {job_id} (3 remaining timeouts)" in log
    resumed_at = _resumed_at(log, run_dir)
    assert resumed_at is not None and 4096 <= resumed_at < total, log[-3000:]  # not from zero
    with open(os.path.join(run_dir, "launcher.log")) as f:  # both attempts': written at the signal, services alive
        text = f.read()
    signalled = text.index("SIGUSR2: the job is preempted")
    assert text.index(f"checkpoint at {resumed_at} frames written", signalled) < text.index("resuming the run")
    assert "no checkpoint written" not in text and "died" not in text
    saved = load(checkpoint)
    assert saved["finished"] == {"solved": False, "frames": total} and saved["run"]["job"] == job_id
    with open(os.path.join(run_dir, "summary.json")) as f:
        assert json.load(f)["frames"] == total
    with open(os.path.join(run_dir, "metrics.csv")) as f:  # every batch once: those after the checkpoint logged again
        steps = [int(row.split(",")[1]) for row in f if row.startswith("loss/policy,")]
    assert steps == list(range(512, total + 1, 512))
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30,
                           env={**os.environ, **local_slurm}).stdout
    assert "JobState=COMPLETED" in shown and "Restarts=1" in shown  # one Slurm job, requeued once


@pytest.mark.slurm
@pytest.mark.slow
def test_a_job_at_its_time_limit_is_requeued_and_resumes_from_its_checkpoint(local_slurm, tmp_path):
    from launcher.checkpointing import load

    # Slurm signals signal_delay_s before the 1-minute limit, at a tick of its 30-second timer: 20-50 s in (a
    # checkpoint at 4,096 frames takes a few seconds of training)
    proc = _submit(tmp_path, local_slurm, "recipe.total_frames=100000000", "hydra.launcher.timeout_min=1",
                   "hydra.launcher.signal_delay_s=40", "hydra.launcher.max_num_timeout=1")
    with _cancelled_at_exit(proc, local_slurm):  # the requeued job would time out again: it is cancelled at the end
        (log_path,) = wait_until(_while_submitted(proc, tmp_path, lambda: glob.glob(
            str(tmp_path / "sweep" / ".submitit" / "*" / "*_0_log.out"))), timeout=60, what="the job to start")
        job_id = os.path.basename(os.path.dirname(log_path))
        (run_dir,) = wait_until(lambda: glob.glob(str(tmp_path / "sweep" / "[0-9]*_*")), timeout=60)
        resumed_at = wait_until(_while_submitted(proc, tmp_path, lambda: _resumed_at(_job_log(tmp_path, job_id),
                                                                                     run_dir)),
                                timeout=150, interval=0.5, what="the requeued job to resume")
    log = _job_log(tmp_path, job_id)
    assert "this job is timed-out" in log and f"Requeued job {job_id} (0 remaining timeouts)" in log
    assert resumed_at >= 4096  # the checkpoint written at the signal, not a fresh start
    assert load(os.path.join(run_dir, "checkpoint.pt"))["run"]["job"] == job_id
