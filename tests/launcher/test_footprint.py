"""What a plan holds on the node that runs it, checked against what the node offers before anything starts
(:mod:`launcher.footprint`): shared-memory segments against the room in the segment directory. And a segment that
still finds no room during the run is reported as shared memory running out.

The small shared memory is real: a tmpfs mounted for the test and made the segment directory (``RLSVC_SHM_DIR``;
root only, elsewhere the tests say why they skip).
"""

from __future__ import annotations

import os
import re

import pytest
import torch
from tensordict import TensorDict

from components.replay import ReplayBuffer, ReplayConfig
from launcher.checks import check_here
from launcher.conventions import EXIT_CONFIG
from launcher.failures import no_space
from launcher.footprint import parts
from launcher.plan import build_plan
from transports.kernel.errors import ConfigurationError, RemoteError
from tests.helpers import cli_in_process, segment_dir_of

APPO_ATARI = ("+recipe=appo", "env=atari", "service=process", "components.collector.local_policy=true")
"""APPO on Atari with every owner in a process of its own: about 70 MB of segments (replay's queue of unrolls, the
rows of one write, a worker's rollout slot, the policy's state)."""


def test_a_plan_whose_segments_do_not_fit_in_the_segment_directory_is_refused_while_planning(compose_cfg, tmp_path,
                                                                                             monkeypatch):
    plan = build_plan(compose_cfg(*APPO_ATARI))
    shared = sum(p.nbytes for p in parts(plan) if p.shared)
    with segment_dir_of(tmp_path / "shm", 64 * 1024, monkeypatch) as directory:  # Docker's default /dev/shm
        with pytest.raises(ConfigurationError) as refused:
            check_here(plan)
    error = refused.value
    assert error.path == "RLSVC_SHM_DIR" and len(str(error).splitlines()) == 2
    need = re.match(rf"the plan needs ([\d.]+) MiB of shared memory in {directory}, which has 64.0 MiB free of "
                    r"64.0 MiB \(replay ([\d.]+) MiB: storage of 16 rows of 1.7 MiB, a staged write of 8 rows; ",
                    error.message)
    assert need and float(need[1]) == round(shared / 2**20, 1) > 64, error.message
    assert "; collector 13.8 MiB: 1 rollout slot(s) of 13.8 MiB; weight_sync " in error.message
    assert error.message.endswith(f"give {directory} more room (a container: docker run --shm-size=1g; a tmpfs: "
                                  f"mount -o remount,size=1g {directory}) or set RLSVC_SHM_DIR to a directory on a "
                                  "tmpfs with more, before the run starts")
    with segment_dir_of(tmp_path / "larger", 128 * 1024, monkeypatch):
        check_here(plan)  # the same plan fits a larger one


def test_the_command_line_refuses_it_with_exit_2_and_leaves_no_run_directory(tmp_path, monkeypatch):
    with segment_dir_of(tmp_path / "shm", 16 * 1024, monkeypatch) as directory:
        proc = cli_in_process(*APPO_ATARI, cwd=str(tmp_path))
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("configuration error: the plan needs ") and \
        f" of shared memory in {directory}, which has 16.0 MiB free of 16.0 MiB (replay " in lines[0], proc.stderr
    assert lines[1:] == ["    full_key: RLSVC_SHM_DIR"]
    assert sorted(os.listdir(tmp_path)) == ["shm"]  # nothing started, no run directory


def test_a_segment_that_finds_no_room_during_the_run_says_shared_memory_ran_out(tmp_path, monkeypatch):
    with segment_dir_of(tmp_path / "shm", 1024, monkeypatch) as directory:
        with ReplayBuffer(ReplayConfig(capacity=1000, batch_size=4, placement="process"),
                          transport="shared_memory") as buffer:
            client = buffer.client()
            with pytest.raises(RemoteError) as failed:  # the storage is made by the first write: 16 MiB in 1 MiB
                client.extend(TensorDict({"observation": torch.zeros(10, 4096)}, [10]))
            assert failed.value.remote_type == "transports.kernel.errors.SharedMemoryFull"
        assert os.listdir(directory) == []
    said = no_space(failed.value)  # what the run's last line says (exit 4, as a full disk)
    assert said.startswith(f"ran out of shared memory in {directory} (") and "does not fit" in said, said


# ---------------------------------------------------------------------------------------------- replay memory
HUGE_DQN = ("+recipe=dqn", "env=atari", "recipe.buffer_size=10000000000")
"""Ten billion Atari transitions: about 72 TiB with frames stored one at a time, more than any machine has."""


@pytest.mark.parametrize("overrides, rows", [(HUGE_DQN, "10,000,000,000"),
                                             (("+recipe=dqn", "env=atari", "recipe.buffer_size=1000000000",
                                               "recipe.replay_frames=false"), "1,000,000,000")])
def test_a_replay_buffer_larger_than_the_memory_here_is_refused_while_planning(overrides, rows, compose_cfg):
    plan = build_plan(compose_cfg(*overrides))
    with pytest.raises(ConfigurationError) as refused:
        check_here(plan)
    error = refused.value
    assert error.path == "recipe.buffer_size" and len(str(error).splitlines()) == 2
    told = re.fullmatch(r"the replay buffer needs ([\d.]+) TiB of memory \((.*)\) but this machine has [\d.]+ [GMT]iB "
                        r"available \((MemAvailable of /proc/meminfo|the room under this cgroup's memory.max); [\d.]+ "
                        rf"[GMT]iB in all\): lower recipe.buffer_size \(components.replay.capacity={rows}: about "
                        r"[\d,]+ rows would fit\), or run on a machine with more memory", error.message)
    assert told, error.message
    assert f"storage of {rows} rows of " in told[2]
    check_here(build_plan(compose_cfg("+recipe=dqn", "env=atari")))  # the default buffer fits


def test_the_replay_estimate_is_what_the_storage_takes(compose_cfg):
    from components.replay.storage import ReplayStorage

    plan = build_plan(compose_cfg("+recipe=dqn", "env=atari", "recipe.buffer_size=1000"))
    estimate = sum(p.nbytes for p in parts(plan) if p.component == "replay" and "sampler" not in p.what
                   and "validity" not in p.what)
    options = plan["replay"].options
    storage = ReplayStorage(capacity=1000, sampler=options["sampler"], batch_size=32, frames=options["frames"])
    rows = plan.step.zeros(4).select("observation", "action", "policy_version", ("next", "observation"),
                                     ("next", "reward"), ("next", "terminated"))  # what the DQN recipe stores
    rows.set(("next", "discount"), torch.ones(4))
    storage.extend(rows)
    assert storage.nbytes <= estimate <= 1.01 * storage.nbytes  # rows and the ring of frames, to a few bytes a row


@pytest.mark.parametrize("service", ["direct", "process"])
def test_an_owner_that_fails_to_build_is_reported_with_its_own_error(service, compose_cfg, tmp_path):
    from launcher.failures import ServiceFailedToStart
    from launcher.run import execute

    # 10^13 rows: the prioritized sampler's index alone is 256 TiB, more than a process may map
    plan = build_plan(compose_cfg("+recipe=dqn", f"service={service}", "recipe.buffer_size=10000000000000"))
    with pytest.raises(ServiceFailedToStart) as failed:
        execute(plan, str(tmp_path / "run"))
    said = str(failed.value)
    assert said.startswith(f"replay ({service}) failed to start: ") and "\n" not in said, said
    assert "MemoryError: Unable to allocate 256. TiB for an array" in said, said


def test_the_command_line_refuses_a_buffer_too_large_with_exit_2(tmp_path):
    proc = cli_in_process(*HUGE_DQN, cwd=str(tmp_path))
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("configuration error: the replay buffer needs ") and \
        " of memory (a ring of 11,000,000,016 frames: " in lines[0], proc.stderr
    assert lines[1:] == ["    full_key: recipe.buffer_size"]
    assert os.listdir(tmp_path) == []  # nothing started, no run directory
