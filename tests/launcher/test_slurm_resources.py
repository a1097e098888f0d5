"""A Slurm job's resources from its plan (:mod:`launcher.slurm`): the counting rules on composed configs, the dry
run's line, ``sinfo``'s node sizes and the refusal of a job no node holds; then, on the one-node Slurm of
``.ci/local_slurm.sh`` (the ``local_slurm`` fixture of ``tests/slurm.py``), a submitted job's ``scontrol`` record and
a refusal before submission."""

from __future__ import annotations

import importlib.util
import os
import pickle
import re
import subprocess
from types import SimpleNamespace

import pytest

from launcher.cli import launch
from launcher.plan import build_plan
from launcher.slurm import (JobResources, Node, SlurmUnavailable, _row_bytes, check_fits, job_resources,
                            partition_nodes, submission_parameters)
from transports.kernel.errors import ConfigurationError
from tests.helpers import run_cli, wait_until
from tests.slurm import JOB_NAME


def needs(compose_cfg, *overrides: str) -> JobResources:
    cfg = compose_cfg(*overrides)
    return job_resources(build_plan(cfg))


def numbers(job: JobResources) -> tuple[int, int, int, int]:
    return job.cpus_per_task, job.mem_gb, job.gpus_per_node, job.tasks_per_node


# ---------------------------------------------------------------------------------------------- the counting rules
@pytest.mark.parametrize("overrides, expected", [
    # every owner in the driver's process: the driver's one CPU; 0.6 GB rounded up
    (("+recipe=ppo",), (1, 1, 0, 1)),
    (("+recipe=ppo", "service=thread"), (1, 1, 0, 1)),
    (("+recipe=ppo", "service=thread", "launcher.torch_threads=3"), (3, 1, 0, 1)),
    # a replay process: + 1 CPU; 0.6 + 0.35 + the forkserver 0.35 = 1.3 GB
    (("+recipe=ppo", "components.replay.placement=process"), (2, 2, 0, 1)),
    (("+recipe=ppo", "components.replay.placement=process", "components.replay.resources.num_cpus=2.5"), (4, 2, 0, 1)),
    # five owners in processes, the collector's 8 workers one each: 1 + 4 + 8 CPUs; 0.6 + 12 x 0.35 + 0.35 GB
    (("+recipe=ppo", "service=process", "components.collector.num_collectors=8"), (13, 6, 0, 1)),
    # a local Ray cluster: an actor each (0.45 GB) and its daemons (0.6 GB); a joined one's actors count nothing
    (("+recipe=ppo", "service=ray"), (6, 4, 0, 1)),
    (("+recipe=ppo", "service=ray", "ray.address=auto"), (1, 1, 0, 1)),
    (("+recipe=ppo", "service=ray", "components.inference.resources.num_gpus=0.5",
      "components.collector.num_collectors=2", "components.collector.resources.num_gpus=0.25"), (7, 4, 1, 1)),
    # DQN's replay: 10 M rows x 64 bytes = 0.64 GB beside the driver's 0.6
    (("+recipe=dqn", "recipe.buffer_size=10000000"), (1, 2, 0, 1)),
])
def test_what_a_job_needs_follows_the_plan(compose_cfg, overrides, expected):
    assert numbers(needs(compose_cfg, *overrides)) == expected


def test_each_number_says_how_it_was_counted(compose_cfg):
    why = needs(compose_cfg, "+recipe=ppo", "service=process", "components.collector.num_collectors=8").why
    assert why["cpus_per_task"] == ("the driver 1 + logger 1 + weight_sync 1 + replay 1 + inference 1 + "
                                    "collector 8 x 1")
    assert why["mem_gb"] == ("the driver 0.6 GB + logger 0.35 GB + weight_sync 0.35 GB + replay 0.35 GB + inference "
                             "0.35 GB + collector 8 x 0.35 GB + the process placement's own processes 0.35 GB + "
                             "replay 512 rows x 68 bytes")
    assert why["gpus_per_node"] == "no owner asks for one"


def test_a_replay_row_is_estimated_from_the_plans_layouts(compose_cfg):
    # per environment: observation 16 bytes (twice), the policy's outputs, 16 bytes more
    assert _row_bytes(build_plan(compose_cfg("+recipe=ppo"))) == 2 * 16 + (8 + 8 + 4) + 16  # stored: 36
    assert _row_bytes(build_plan(compose_cfg("+recipe=dqn"))) == 2 * 16 + (8 + 8) + 16  # stored: 57


@pytest.mark.parametrize("overrides, gpus", [
    (("components.inference.policy_device=cuda",), 1), (("components.inference.policy_device=cuda:1",), 2),
    (("components.inference.policy_device=cpu",), 0), (("recipe.device=cuda",), 1),  # the learner, in the driver
    (("components.collector.local_policy=true", "components.inference.policy_device=cuda:2"), 3),  # in the workers
])
def test_a_cuda_device_option_asks_for_a_gpu(compose_cfg, overrides, gpus):
    # planned on a node without CUDA too (a login node): the node that runs the job checks its devices
    assert job_resources(build_plan(compose_cfg("+recipe=ppo", *overrides))).gpus_per_node == gpus


def test_a_sweep_asks_for_the_largest_of_its_jobs():
    largest = JobResources.largest([JobResources(2, 5, 0, why={"mem_gb": "five"}), JobResources(3, 1, 1)])
    assert numbers(largest) == (3, 5, 1, 1) and largest.why["mem_gb"] == "five"


def test_the_dry_run_prints_the_jobs_line_under_the_plan(compose_cfg, tmp_path, capsys):
    launch(compose_cfg("+recipe=ppo", "components.replay.placement=process", "launcher.dry_run=true"), str(tmp_path))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("plan: recipe=ppo")
    assert lines[-1] == "slurm job: cpus_per_task=2 mem_gb=2 gpus_per_node=0 tasks_per_node=1 (from the plan)"
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------------------------- the partition
def sinfo(stdout: str = "", returncode: int = 0, error: BaseException | None = None):
    """A stand-in for ``subprocess.run`` answering ``sinfo`` with ``stdout``."""

    def run(argv, **kwargs):
        assert argv[0] == "sinfo"
        if error is not None:
            raise error
        return SimpleNamespace(returncode=returncode, stdout=stdout, stderr="sinfo: error: no controller\n")

    return run


def test_sinfo_gives_the_partitions_nodes():
    out = "cpu*|2|20489|(null)\ngpu|64|512000|gpu:a100:4(S:0-1)\ngpu|32|256000+|gpu:2\n"
    assert partition_nodes(None, sinfo(out)) == ("cpu", [Node(2, 20489, 0)])
    assert partition_nodes("gpu", sinfo(out)) == ("gpu", [Node(64, 512000, 4), Node(32, 256000, 2)])
    with pytest.raises(ConfigurationError, match="sinfo lists no partition 'big'") as info:
        partition_nodes("big", sinfo(out))
    assert info.value.path == "hydra.launcher.partition" and "supported: cpu, gpu" in str(info.value)
    with pytest.raises(ConfigurationError, match="no default partition"):
        partition_nodes(None, sinfo("gpu|64|512000|gpu:4\n"))
    with pytest.raises(SlurmUnavailable, match="sinfo cannot run"):
        partition_nodes(None, sinfo(error=FileNotFoundError(2, "No such file or directory", "sinfo")))
    with pytest.raises(SlurmUnavailable, match="no controller"):
        partition_nodes(None, sinfo(returncode=1))


def test_a_job_no_node_holds_is_refused_with_the_numbers():
    plan_needs = JobResources(13, 6, 0, why={"cpus_per_task": "the driver 1 + collector 8 x 1 + ..."})
    asked = {"cpus_per_task": 13, "mem_gb": 6, "gpus_per_node": 0}
    with pytest.raises(ConfigurationError) as info:
        check_fits(asked, plan_needs, "local", [Node(2, 20489)])
    assert str(info.value).startswith(
        "the plan needs cpus_per_task=13 (the driver 1 + collector 8 x 1 + ...), but a node of partition 'local' "
        "has 2 CPUs: run fewer owners in processes of their own (service=thread, fewer "
        "components.collector.num_collectors, smaller resources.num_cpus or launcher.torch_threads), or choose a "
        "partition with larger nodes (hydra.launcher.partition)")
    assert info.value.path == "hydra.launcher.cpus_per_task"
    with pytest.raises(ConfigurationError) as info:
        check_fits({**asked, "cpus_per_task": 1, "mem_gb": 64}, plan_needs, "local", [Node(2, 20489)], ["mem_gb"])
    assert str(info.value).startswith("hydra.launcher.mem_gb=64 is more than a node of partition 'local' has "
                                      "(20.0 GB of memory): lower it")
    with pytest.raises(ConfigurationError, match=r"needs gpus_per_node=1 \(inference 1\), but a node of partition "
                                                 r"'mixed' has 0 GPUs \(its nodes: 1 CPUs, 1,024 MB of memory and 0 "
                                                 r"GPUs or 2 CPUs, 20,489 MB of memory and 0 GPUs\): ask for fewer"):
        check_fits({**asked, "cpus_per_task": 2, "gpus_per_node": 1}, JobResources(2, 6, 1, why={
            "gpus_per_node": "inference 1"}), "mixed", [Node(2, 20489, 0), Node(1, 1024, 0)])
    check_fits({**asked, "cpus_per_task": 2}, plan_needs, "local", [Node(1, 1024), Node(2, 20489)])  # one holds it


def test_the_submission_fills_what_is_unset_and_keeps_what_is_set(compose_cfg):
    configs = [compose_cfg("+recipe=ppo", "components.replay.placement=process"), compose_cfg("+recipe=ppo")]
    said = []
    params = {"partition": None, "cpus_per_task": None, "mem_gb": 8, "gpus_per_node": None, "tasks_per_node": 1}
    out = submission_parameters(params, configs, say=said.append, run=sinfo("local*|4|20489|(null)\n"))
    assert (out["cpus_per_task"], out["mem_gb"], out["gpus_per_node"]) == (2, 8, 0)
    assert said == ["slurm job: cpus_per_task=2 mem_gb=8 gpus_per_node=0 tasks_per_node=1 (from the plan, the "
                    "largest of 2 jobs; mem_gb from hydra.launcher.mem_gb)"]
    said.clear()
    with pytest.raises(ConfigurationError, match="no Slurm controller answers here \\(sinfo cannot run") as refused:
        submission_parameters(params, configs[1:], say=said.append, run=sinfo(error=FileNotFoundError("sinfo")))
    assert refused.value.path == "hydra/launcher"
    with pytest.raises(ConfigurationError, match="hydra.launcher.mem_gb=8 is more than"):
        submission_parameters(params, configs[1:], say=said.append, run=sinfo("local*|4|4000|(null)\n"))


def test_hydra_launcher_slurm_is_our_launcher_and_it_pickles():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="needs hydra-submitit-launcher: pip install "
                        "-e '.[slurm]'")
    from hydra import compose, initialize_config_module
    from hydra.core.plugins import Plugins
    from hydra.plugins.launcher import Launcher

    from hydra_plugins.rl_services_launcher.planned_launcher import SlurmLauncher

    with initialize_config_module(config_module="conf", version_base=None):
        node = compose("config", overrides=["hydra/launcher=slurm"], return_hydra_config=True).hydra.launcher
    assert node._target_ == f"{SlurmLauncher.__module__}.SlurmLauncher"
    assert (node.cpus_per_task, node.mem_gb, node.gpus_per_node) == (None, None, None)
    assert SlurmLauncher in Plugins.instance().discover(Launcher)  # Hydra instantiates only plugins it found
    launcher = SlurmLauncher(partition="local", cpus_per_task=None)
    assert pickle.loads(pickle.dumps(launcher)).params == launcher.params  # submitit pickles it into the job


# ---------------------------------------------------------------------------------------------- real jobs
PLUGIN = pytest.mark.skipif(importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is None,
                            reason="needs hydra-submitit-launcher: pip install -e '.[slurm]'")


def _slurm(env: dict, *argv: str) -> str:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return out.stdout


def _ours(env: dict, states: str = "all") -> list[str]:
    return _slurm(env, "squeue", "--noheader", "--array", f"--states={states}", f"--name={JOB_NAME}",
                  "--format=%i").split()


@pytest.mark.slurm
@pytest.mark.slow
@PLUGIN
def test_a_submitted_job_asks_slurm_for_what_its_plan_needs(local_slurm, tmp_path):
    before = set(_ours(local_slurm))
    result = run_cli("--multirun", "hydra/launcher=slurm", f"hydra.launcher.name={JOB_NAME}", "+recipe=ppo",
                     "recipe.total_frames=1024", "recipe.target_return=null", "launcher.progress=false",
                     "components.replay.placement=process", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                     cwd=str(tmp_path), timeout=240, env=local_slurm)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "slurm job: cpus_per_task=2 mem_gb=2 gpus_per_node=0 tasks_per_node=1 (from the plan)" in result.stdout
    (job,) = set(_ours(local_slurm)) - before
    record = _slurm(local_slurm, "scontrol", "show", "job", job)
    assert re.search(r"\bCPUs/Task=2\b", record) and re.search(r"\bMinMemoryNode=2G\b", record), record
    wait_until(lambda: _ours(local_slurm, "PENDING,RUNNING,COMPLETING") == [], timeout=60, what="our job to end")


@pytest.mark.slurm
@pytest.mark.slow
@PLUGIN
def test_a_plan_no_node_holds_is_refused_before_submission(local_slurm, tmp_path):
    node_cpus = int(_slurm(local_slurm, "sinfo", "--noheader", "--partition=local", "--format=%c").split()[0])
    each = -(-node_cpus // 8)  # CPUs per collector worker: 8 workers alone ask for at least the node's CPUs
    before = _ours(local_slurm)
    result = run_cli("--multirun", "hydra/launcher=slurm", f"hydra.launcher.name={JOB_NAME}", "+recipe=ppo",
                     "service=process", "components.collector.num_collectors=8",
                     f"components.collector.resources.num_cpus={each}", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                     cwd=str(tmp_path), env=local_slurm)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.startswith(f"configuration error: the plan needs cpus_per_task={5 + 8 * each} (the driver 1 + "
                                    f"logger 1 + weight_sync 1 + replay 1 + inference 1 + collector 8 x {each}), but a "
                                    f"node of partition 'local' has {node_cpus} CPUs: ")
    assert result.stderr.rstrip().endswith("full_key: hydra.launcher.cpus_per_task") and "Traceback" not in result.stderr
    assert _ours(local_slurm) == before  # nothing submitted
