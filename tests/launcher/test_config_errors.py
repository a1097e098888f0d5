"""Every configuration mistake exits 2 with one short message naming its config path, before anything starts.

In this process: the preflight (``launcher.preflight.check_argv``) and the plan, for the mistakes users make, for
mistakes of a kind (every device option, encoders against the frames they get, ``env.kwargs`` against what each
backend's env takes) and for overrides drawn from the schema and from those kinds (hypothesis): the outcome is a plan
or one short :class:`ConfigurationError`, never anything else. As a user runs it (real subprocesses, marked slow): the
exit status and stderr, and Hydra's own flags still working.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import os
import subprocess
import sys
import time
import typing

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components.errors import ConfigurationError
from components.logger import CSVLogger, TensorBoardLogger
from launcher import schema
from launcher.conventions import EXIT_CONFIG
from launcher.checks import check_here
from launcher.plan import build_plan
from launcher.preflight import check_argv
from recipes.configs import DQNConfig, IMPALAConfig, PPOConfig
from tests.helpers import cli_in_process, run_cli


def outcome(*argv: str):
    """What ``python -m launcher ...`` ends with before anything starts: the plans, checked against this machine
    (:func:`launcher.plan.check_here`), or the configuration error."""
    try:
        plans = [build_plan(cfg) for cfg in check_argv(list(argv))]
        for plan in plans:
            check_here(plan)
        return plans
    except ConfigurationError as exc:
        return exc


def assert_short(error: ConfigurationError) -> None:
    lines = str(error).splitlines()
    assert 1 <= len(lines) <= 3 and "Traceback" not in str(error), str(error)


# ---------------------------------------------------------------------------------------------- mistakes users make
MISTAKES = [
    (("components.inference.max_batch_size=abc",), "components.inference.max_batch_size",
     "must be an integer, got 'abc'"),
    (("components.replay.colour=blue",), "components.replay.colour", "components.replay has no key 'colour'"),
    (("+components.replay.colour=blue",), "components.replay.colour", "supported: placement, transport"),
    (("foo=1",), "foo", "the config has no key 'foo'"),
    (("service=submitit",), "service", "supported: direct, monarch, process, ray, thread"),
    (("env=nonexistent",), "env", "supported: atari, cartpole, minatar, mujoco, pendulum"),
    (("recipe.num_envs=0",), "recipe.num_envs", "must be >= 1, got 0"),
    (("seed=-1",), "seed", "must be in [0, 4294967295], got -1"),
    (("recipe.lr=-1",), "recipe.lr", "must be > 0, got -1.0"),
    (("recipe.total_frames=-100",), "recipe.total_frames", "must be >= 1, got -100"),
    (("recipe.window=0",), "recipe.window", "must be >= 1, got 0"),
    (("recipe.gamma=1.5",), "recipe.gamma", "must be in [0, 1], got 1.5"),
    (("recipe.num_minibatches=5",), "recipe.num_minibatches",
     "num_envs * num_steps = 512 must be divisible by num_minibatches=5"),
    (("launcher.telemetry_every=-1",), "launcher.telemetry_every", "must be > 0 seconds, got -1.0"),
    (("launcher.shutdown_timeout=0",), "launcher.shutdown_timeout", "must be > 0 seconds, got 0.0"),
    (("components.collector.num_collectors=0",), "components.collector.num_collectors", "must be >= 1, got 0"),
    (("components.replay.resources.num_cpus=-1",), "components.replay.resources.num_cpus", ">= 0 or null, got -1.0"),
    (("components.collector.sync=maybe",), "components.collector.sync", "must be true or false, got 'maybe'"),
    (("components.collector.prefetch=2",), "components.collector.prefetch",
     "components.collector.prefetch=2 needs sync: false"),
    (("seed=0,1",), "seed", "add --multirun"),
    (("seed",), "seed", "cannot read the override 'seed'"),
    (("~seed",), "seed", "seed has no value"),
    (("components.inference.max_batch_size=-5",), "components.inference.max_batch_size", ">= 1, got -5"),
    (("components.inference.timeout=-1",), "components.inference.timeout", ">= 0 seconds, got -1"),
    (("env.backend=fast",), "env.backend", "supported: gymnasium, vector, ale_vector, envpool"),
    (("components.collector.local_policy=true", "components.inference.placement=process"),
     "components.inference.placement", "runs the policy in each collector worker and starts none"),
    (("components.collector.local_policy=true", "components.collector.placement=process"),
     "components.weight_sync.transport", "weight_sync ('direct') over transport 'direct' cannot reach the collector"),
    (("env=pendulum", "env.backend=vector"), "env.backend", "'Pendulum-v1' has no array-vectorized implementation"),
    (("env.id=NoSuchEnv-v0", "env.backend=envpool"), "env.id", "EnvPool does not implement 'NoSuchEnv-v0'"),
    (("service=rpc",), "service", "'rpc' places only collector (components.collector.placement=rpc)"),
    (("service=distributed",), "service", "'distributed' places only weight_sync and collector "
     "(components.weight_sync.placement=distributed, components.collector.placement=distributed)"),
    (("components.replay.placement=rpc",), "components.replay.placement",
     "supported: direct, thread, process, ray, monarch"),
    (("components.collector.placement=rpc", "components.collector.resources.max_restarts=1"),
     "components.collector.resources.max_restarts", "must be 0 on the rpc placement"),
    (("components.collector.placement=rpc", "rpc.threads=1"), "rpc.threads", "must be >= 2, got 1"),
    (("components.collector.resources.nice=20",), "components.collector.resources.nice", "must be in [0, 19], got 20"),
    (("service=direct", "components.collector.resources.nice=19"), "components.collector.resources.nice",
     "nice=19 would lower the caller's own thread: the direct placement runs the owner there"),
    (("+env.kwargs.foo=1",), "env.kwargs.foo", "CartPole-v1 takes no keyword argument 'foo'"),
    (("env=atari", "env.atari.screen_size=32", "recipe.encoder=nature_cnn"), "env.atari.screen_size",
     "env.atari.screen_size=32 makes images of (4, 32, 32), smaller than recipe.encoder=nature_cnn takes (at least "
     "36x36): set env.atari.screen_size to 36 or more"),
    (("env=minatar", "recipe.encoder=nature_cnn"), "recipe.encoder",
     "recipe.encoder=nature_cnn needs images of at least 36x36 (channels first); this env's are (10, 10, 4)"),
    (("env=atari", "+env.kwargs.frameskip=4"), "env.kwargs.frameskip", "env.kwargs.frameskip=4 clashes with "
     "env.atari, whose preprocessing sets frameskip itself on env.backend=gymnasium: set env.atari.frame_skip instead"),
    (("env=atari", "env.backend=ale_vector", "+env.kwargs.colour=1"), "env.kwargs.colour",
     "ale-py's AtariVectorEnv (env.backend=ale_vector) takes no keyword argument 'colour'"),
    (("env=atari", "+env.kwargs.mode=99"), "env.kwargs.mode",
     "ALE/Breakout-v5 cannot be made with env.kwargs.mode=99: RuntimeError: Invalid game mode requested"),
    (("service=ray", "ray.temp_dir=/tmp/" + "x" * 60), "ray.temp_dir", "use a directory of at most 43 characters"),
    (("service=ray", "components.inference.resources.num_gpus=64"), "components.inference.resources.num_gpus",
     "components.inference.resources.num_gpus=64, but the local Ray cluster has"),
    (("service=ray", "components.replay.resources.num_cpus=4096"), "components.replay.resources.num_cpus",
     "components.replay.resources.num_cpus=4096, but the local Ray cluster has"),
    (("service=ray", "ray.num_cpus=1", "components.replay.resources.num_cpus=2"),
     "components.replay.resources.num_cpus", "the local Ray cluster has 1 CPUs (ray.num_cpus)"),
    (("service=ray", "+components.replay.resources.custom.node_b=1"), "components.replay.resources.custom.node_b",
     "offers 0 of it: declare it under ray.resources"),
    (("components.collector.placement=rpc", "rpc.interface=nope0"), "rpc.interface",
     "rpc.interface='nope0' is no network interface of this machine"),
    (("components.collector.placement=distributed", "distributed.host=127.0.0.1", "distributed.port=29555",
      "distributed.ranks=env"), "distributed.ranks",
     "takes its ranks from torchrun or srun, but WORLD_SIZE is not set"),
]


@pytest.mark.parametrize("overrides, path, needle", MISTAKES, ids=[m[0][-1] for m in MISTAKES])
def test_a_mistake_is_one_short_message_naming_its_path(overrides, path, needle):
    error = outcome("+recipe=ppo", *overrides)
    assert isinstance(error, ConfigurationError), error
    assert_short(error)
    assert needle in str(error) and str(error).endswith(f"full_key: {path}")


def test_a_ray_address_where_nothing_listens_is_refused_at_once():
    import socket

    with socket.socket() as s:  # a port on loopback that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    error = outcome("+recipe=ppo", "service=ray", f"ray.address=127.0.0.1:{port}", "ray.connect_timeout=600")
    assert isinstance(error, ConfigurationError) and error.path == "ray.address", error
    assert f"no Ray cluster listens at ray.address='127.0.0.1:{port}' (connection refused)" in str(error)


def test_collectors_on_slurm_with_no_controller_are_refused(monkeypatch, tmp_path):
    (tmp_path / "slurm.conf").write_text("SlurmctldHost=localhost\n")  # no cluster sinfo can ask: it fails at once
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    if __import__("shutil").which("sbatch") is None:
        monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
        (tmp_path / "sbatch").write_text("#!/bin/sh\nexit 1\n")
        (tmp_path / "sbatch").chmod(0o755)
    error = outcome("+recipe=ppo", "components.collector.placement=submitit")
    assert isinstance(error, ConfigurationError) and error.path == "submitit.cluster", error
    assert str(error).startswith("no Slurm controller answers here (sinfo") and "submitit.cluster=local" in str(error)


def test_collectors_on_slurm_with_no_sbatch_plan_but_do_not_run(monkeypatch):
    from launcher.slurm import own_jobs

    monkeypatch.setenv("PATH", os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                                                if d and not os.path.exists(os.path.join(d, "sbatch"))))
    argv = ("+recipe=ppo", "components.collector.placement=submitit")
    (plan,) = [build_plan(cfg) for cfg in check_argv([*argv, "launcher.dry_run=true"])]  # a dry run plans for Slurm
    assert "1 Slurm job (one array" in own_jobs(plan)[0]  # what the dry run prints of them
    error = outcome(*argv)  # a run does not start: check_here finds no sbatch on this machine
    assert isinstance(error, ConfigurationError) and error.path == "submitit.cluster", error
    assert_short(error)
    assert str(error).startswith("collectors on 'submitit' submit Slurm jobs, but no sbatch is on the PATH")
    assert "submitit.cluster=local" in str(error)


def test_a_run_directory_below_a_file_is_refused(tmp_path):
    (tmp_path / "afile").write_text("")
    error = outcome("+recipe=ppo", f"hydra.run.dir={tmp_path / 'afile' / 'run'}")
    assert isinstance(error, ConfigurationError) and error.path == "hydra.run.dir", error
    assert f"{tmp_path / 'afile'} is a file, not a directory" in str(error)


def test_a_config_dir_whose_yaml_does_not_parse_is_one_message(tmp_path):
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "mine.yaml").write_text("defaults:\n  - base_env\n  - _self_\nid: CartPole-v1\nkwargs: {a: 1\n")
    error = outcome("--config-dir", str(tmp_path), "+recipe=ppo", "env=mine")
    assert isinstance(error, ConfigurationError) and error.path == "env", error
    assert_short(error)
    assert str(error).startswith(f"{tmp_path / 'env' / 'mine.yaml'} is not valid YAML: expected ',' or '}}'")
    (tmp_path / "env" / "mine.yaml").write_text("defaults:\n  - base_env\n  - _self_\nid: CartPole-v1\nkwargs: {}\n")
    (plan,) = outcome("--config-dir", str(tmp_path), "+recipe=ppo", "env=mine")  # the same directory, mended: a plan
    assert plan.env_id == "CartPole-v1"
    assert str(outcome("--config-dir", str(tmp_path / "nowhere"), "+recipe=ppo")).startswith("--config-dir ")


def test_a_wrong_type_in_a_config_dir_file_names_the_key_the_value_and_the_type(tmp_path):
    (tmp_path / "conf" / "recipe_env").mkdir(parents=True)
    (tmp_path / "conf" / "recipe_env" / "ppo_cartpole.yaml").write_text("# @package recipe\nnum_envs: abc\n")
    error = outcome("--config-dir", str(tmp_path / "conf"), "+recipe=ppo")
    assert isinstance(error, ConfigurationError) and error.path == "recipe.num_envs", error
    assert str(error).splitlines()[0] == ("recipe.num_envs must be an integer, got 'abc' "
                                          "(in recipe_env/ppo_cartpole.yaml)")
    proc = cli_in_process("--config-dir", str(tmp_path / "conf"), "+recipe=ppo", cwd=str(tmp_path))
    _one_short_message(proc, "recipe.num_envs")
    assert "recipe.num_envs must be an integer, got 'abc'" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf"]


def test_a_config_dir_file_named_like_a_shipped_one_is_refused_not_ignored(tmp_path):
    # Hydra searches the launcher's conf before --config-dir: a file of the same name would never be read
    (tmp_path / "conf" / "recipe_env").mkdir(parents=True)
    mine = "# @package recipe\nnum_envs: 3\n"
    (tmp_path / "conf" / "recipe_env" / "appo_minatar.yaml").write_text(mine)
    argv = ("--config-dir", str(tmp_path / "conf"), "+recipe=appo", "env=minatar", "recipe.total_frames=64")
    proc = cli_in_process(*argv, cwd=str(tmp_path))  # a real run, not a dry run: it must not train on the shipped one
    _one_short_message(proc, "--config-dir")
    assert "holds recipe_env/appo_minatar.yaml, a name the launcher's own configs take" in proc.stderr
    assert "recipe_env=appo_minatar_mine" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conf"]  # nothing ran
    (tmp_path / "conf" / "hydra" / "job_logging").mkdir(parents=True)  # one of Hydra's own names: the same
    (tmp_path / "conf" / "hydra" / "job_logging" / "default.yaml").write_text("version: 1\n")
    error = outcome("--config-dir", str(tmp_path / "conf"), "+recipe=ppo")
    assert error.path == "--config-dir" and "Hydra's own configs" in str(error), error
    (tmp_path / "conf" / "hydra" / "job_logging" / "default.yaml").unlink()
    # renamed and chosen, the user's file is the one read
    presets = tmp_path / "conf" / "recipe_env"
    (presets / "appo_minatar.yaml").rename(presets / "appo_minatar_mine.yaml")
    (cfg,) = check_argv([*argv[:-1], "recipe_env=appo_minatar_mine"])
    assert cfg.recipe.num_envs == 3


@pytest.mark.slow
def test_a_conf_folder_in_the_working_directory_is_the_users_not_the_launchers(tmp_path):
    # Hydra's usual name for a project's configs: under python -m launcher the working directory comes first on
    # sys.path, and an editable install's conf package came after a namespace package made of the user's folder
    (tmp_path / "conf" / "env").mkdir(parents=True)
    (tmp_path / "conf" / "env" / "mine.yaml").write_text("defaults:\n  - cartpole\n  - _self_\n")
    done = run_cli("--config-dir", "conf", "+recipe=ppo", "env=mine", "launcher.dry_run=true", cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "plan: recipe=ppo env=CartPole-v1" in done.stdout, done.stdout


def test_a_group_option_that_does_not_exist_lists_the_real_ones():
    error = outcome("+recipe=nonexistent")
    assert str(error) == ("recipe has no option 'nonexistent'\n    supported: appo, dqn, impala, ppo, ppo_custom_mlp\n"
                          "    full_key: recipe")
    assert "base_" not in str(outcome("+recipe=ppo", "service=submitit"))


def test_a_recipe_key_without_a_recipe_says_to_select_one():
    error = outcome("recipe.num_envs=0")
    assert "no recipe is selected" in str(error) and "+recipe=ppo" in str(error)


def test_a_config_built_in_python_is_checked_by_the_plan(compose_cfg):
    with pytest.raises(ConfigurationError, match="recipe.window must be >= 1, got 0"):
        build_plan(compose_cfg("+recipe=dqn", "recipe.window=0"))
    with pytest.raises(ConfigurationError, match="seed cannot be resolved"):
        build_plan(compose_cfg("+recipe=dqn", "seed=${oops}"))


def test_every_job_of_a_sweep_is_checked():
    assert len(check_argv(["-m", "+recipe=ppo", "service=direct,process", "seed=0,1,2"])) == 6
    error = outcome("--multirun", "+recipe=ppo", "service=direct,process", "seed=0,-1")
    assert isinstance(error, ConfigurationError) and str(error).endswith("full_key: seed")


@pytest.mark.parametrize("argv", [["--help"], ["--hydra-help"], ["--info"], ["--cfg", "job", "recipe.num_envs=0"],
                                  ["-cn", "other"], ["+recipe=ppo", "hydra.searchpath=[pkg://elsewhere]"],
                                  ["-m", "+recipe=ppo", "seed=interval(0,1)"]])
def test_hydra_s_own_features_are_left_to_hydra(argv):
    assert check_argv(argv) == []


def test_hydra_overrides_are_left_out_of_the_check():
    (cfg,) = check_argv(["+recipe=ppo", "hydra.run.dir=/tmp/x", "hydra/launcher=basic", "hydra.job.chdir=true"])
    assert cfg.recipe.num_envs == 16 and "hydra" not in cfg


# ---------------------------------------------------------------------------------------------- mistakes of a kind
def _device_options() -> list[str]:
    """Every device option a command line sets: the fields of each recipe's and each component's config declared with
    ``device_option`` (``recipe.device``, ``components.inference.policy_device``...)."""
    from components import compat
    from transports.kernel.options import is_device

    paths = {f"recipe.{f.name}" for kind in (PPOConfig, DQNConfig, IMPALAConfig) for f in dataclasses.fields(kind)
             if is_device(f)}
    paths |= {f"components.{name}.{f.name}" for name in compat.COMPONENTS
              for f in dataclasses.fields(compat.declaration(name).config) if is_device(f)}
    return sorted(paths)


DEVICE_OPTIONS = _device_options()
NOT_DEVICES = ["mps", "gpu", "cuda:x", "cuda:-1", "CUDA", "meta", ""]
"""Names a device option refuses wherever it runs: torch devices the project does not run on (``mps``, ``meta``),
names torch does not know, and spellings of a CUDA device torch would refuse only once it is used."""


def test_every_device_option_is_one_kind():
    assert {"recipe.device", "components.inference.policy_device",
            "components.inference.output_device"} <= set(DEVICE_OPTIONS)


@pytest.mark.parametrize("path", DEVICE_OPTIONS)
def test_a_device_option_that_names_no_device_is_refused_with_the_command_line(path):
    # refused by the preflight with the command line's other mistakes: a dry run too (the name is wrong on any node)
    for wrong in NOT_DEVICES[:3]:
        error = outcome("+recipe=ppo", f"{path}={wrong}", "launcher.dry_run=true")
        assert isinstance(error, ConfigurationError) and error.path == path, error
        first = str(error).splitlines()[0]
        assert first.startswith(f"{path} must be a device (cpu, cuda or cuda:<index>)") and first.endswith(
            f"got {wrong!r}"), first


@pytest.mark.parametrize("path", DEVICE_OPTIONS)
def test_a_device_this_machine_lacks_is_planned_and_refused_where_the_plan_runs(compose_cfg, path):
    import torch

    absent = f"cuda:{torch.cuda.device_count()}"
    plan = build_plan(compose_cfg("+recipe=ppo", f"{path}={absent}"))  # a dry run may plan for a GPU node
    with pytest.raises(ConfigurationError) as info:
        check_here(plan)
    assert info.value.path == path
    assert str(info.value).startswith(f"{path} must be a device this machine has, got {absent!r}: it has ")


# ---------------------------------------------------------------------------------------------- drawn from the schema
def _options(group: str) -> list[str]:
    folder = importlib.resources.files("conf") / group
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


RECIPES = {"ppo": PPOConfig, "ppo_custom_mlp": PPOConfig, "dqn": DQNConfig, "impala": IMPALAConfig,
           "appo": IMPALAConfig}
LOGGERS = {"csv": CSVLogger, "tensorboard": TensorBoardLogger}
PLACES = ("direct", "thread", "process", "ray", "distributed", "nowhere")
SKIPPED = {"dry_run", "name", "id", "log_dir", "address", "namespace", "temp_dir", "policy_device", "output_device"}


def _leaves(kind: type, path: str):
    """``(path, field, type)`` of every scalar field under ``kind`` that a command line would set."""
    hints = typing.get_type_hints(kind)
    for f in dataclasses.fields(kind):
        hint, full = hints[f.name], f"{path}.{f.name}" if path else f.name
        if dataclasses.is_dataclass(hint):
            yield from _leaves(hint, full)
        elif f.name not in SKIPPED and (_scalar(hint) in (bool, int, float) or _scalar(hint) is str and f.name in
                                        ("placement", "transport")):
            yield full, f, hint


def _scalar(hint):
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if typing.get_origin(hint) is typing.Union and len(args) == 1 else hint


def _value(f: dataclasses.Field, hint) -> st.SearchStrategy:
    """``(text, valid)``: a value for the field, and whether the schema accepts it (``None``: it cannot tell)."""
    kind, bounds = _scalar(hint), f.metadata.get("bounds", {})
    wrong = st.just(("abc", False))
    if f.name in ("placement", "transport"):
        return st.sampled_from(PLACES).map(lambda v: (v, None))
    if kind is bool:
        return st.sampled_from([("true", True), ("false", True), ("maybe", False)])
    low = bounds.get("ge", bounds.get("gt"))
    high = bounds.get("le", bounds.get("lt"))
    known = True if bounds else None
    if kind is int:
        lo = -5 if low is None else low + ("gt" in bounds)
        good = st.integers(lo, lo + 40 if high is None else min(high, lo + 40)).map(lambda v: (str(v), known))
        bad = [st.integers(lo - 1000, lo - 1)] if low is not None else []
        bad += [st.integers(high + 1, high + 1000)] if high is not None else []
    else:
        lo = -5.0 if low is None else float(low)
        good = st.floats(lo, lo + 10 if high is None else high, exclude_min="gt" in bounds,
                         exclude_max="lt" in bounds).map(lambda v: (repr(v), known))
        bad = [st.floats(lo - 100, lo, exclude_max="ge" in bounds)] if low is not None else []
        bad += [st.floats(high, high + 100, exclude_min="le" in bounds)] if high is not None else []
        bad += [st.just(float("nan"))] if bounds else []
    nulls = [st.just(("null", True))] if kind is not hint else []
    return st.one_of(good, *nulls, *(b.map(lambda v: (repr(v), False)) for b in bad), wrong)


UNKNOWN_KEYS = ["components.replay.colour=blue", "+components.replay.colour=blue", "recipe.colour=1", "foo=1",
                "+launcher.verbose=true"]
UNKNOWN_OPTIONS = ["service=submitit", "env=nonexistent", "transport=carrier_pigeon", "logger=nope"]


def _cuda_here(name: str) -> bool:
    import torch

    return name == "cpu" or int(name.partition(":")[2] or 0) < torch.cuda.device_count()


@st.composite
def device_mistakes(draw, recipe: str, chosen: dict):
    """``{path: (override, valid)}``: a device option set to a name that is no device (refused with the command line),
    or to a device (a CUDA one this machine lacks is refused where the plan runs, for what runs on this machine)."""
    path = draw(st.sampled_from(DEVICE_OPTIONS))
    if draw(st.booleans()):
        name, valid = draw(st.sampled_from(NOT_DEVICES)), False
    else:
        name = draw(st.sampled_from(["cpu", "cuda", "cuda:0", "cuda:3"]))
        valid = _cuda_here(name) or (None if path.startswith("components.") else False)  # an owner placed elsewhere
    return {path: (f"{path}={name}", valid)}


@st.composite
def encoder_mistakes(draw, recipe: str, chosen: dict):
    """``{path: (override, valid)}``: an encoder against Atari frames of a drawn size (the Nature CNN takes 36x36 and
    up; ``auto`` fits any)."""
    chosen["env"] = "atari"
    side, encoder = draw(st.integers(8, 48)), draw(st.sampled_from(["auto", "nature_cnn", "impala_cnn", "minatar_cnn",
                                                                     "mlp"]))
    fits = encoder != "nature_cnn" or side >= 36 or recipe == "ppo_custom_mlp"  # its own network: no encoder
    return {"env.atari.screen_size": (f"env.atari.screen_size={side}", fits or False),
            "env.atari.stack": (f"env.atari.stack={draw(st.integers(1, 4))}", True),
            "recipe.encoder": (f"recipe.encoder={encoder}", True)}


ENV_KWARGS = {  # (env, backend) -> keywords its env takes, with a value it takes
    ("cartpole", "gymnasium"): {"sutton_barto_reward": "true", "max_episode_steps": "50"},
    ("cartpole", "vector"): {"sutton_barto_reward": "true", "max_episode_steps": "50"},
    ("cartpole", "envpool"): {"num_threads": "1", "max_episode_steps": "50"},
    ("atari", "gymnasium"): {"full_action_space": "true", "mode": "0"},
    ("atari", "ale_vector"): {"num_threads": "1", "full_action_space": "true"},
    ("atari", "envpool"): {"num_threads": "1"},
    ("minatar", "gymnasium"): {"sticky_action_prob": "0.0"},
}


@st.composite
def env_kwargs_mistakes(draw, recipe: str, chosen: dict):
    """``{path: (override, valid)}``: an ``env.kwargs`` key the env takes, one it does not, one the collector or the
    Atari preprocessing sets itself, or a value the env refuses (Breakout has no mode 99)."""
    from components.envs.families.atari import PREPROCESSING
    from components.envs.backends import SET_HERE

    env, backend = draw(st.sampled_from(sorted(ENV_KWARGS)))
    chosen["env"] = env
    extra = {} if backend == "gymnasium" else {"env.backend": (f"env.backend={backend}", True)}
    kind = draw(st.sampled_from(["takes", "unknown", "collector", "preprocessing", "value"]))
    if kind == "takes":
        key, value = draw(st.sampled_from(sorted(ENV_KWARGS[(env, backend)].items())))
    elif kind == "unknown":
        key, value = "colour", "1"
    elif kind == "preprocessing" and env == "atari":
        key, value = draw(st.sampled_from(sorted(PREPROCESSING[backend]))), "4"
    elif kind == "value" and (env, backend) == ("atari", "gymnasium"):
        key, value = "mode", "99"
    else:
        key, value = draw(st.sampled_from(sorted(SET_HERE[backend]))), "2"
    return {**extra, f"env.kwargs.{key}": (f"+env.kwargs.{key}={value}", kind == "takes")}


KINDS = [device_mistakes, encoder_mistakes, env_kwargs_mistakes]
"""Mistakes of a kind the plan refuses: each draws overrides of its kind, with whether each is valid."""


@st.composite
def command_lines(draw):
    """``(argv, invalid, unsure)``: a command line, the config paths it sets to something the schema or the plan
    refuses, and those it sets to something the test cannot tell (a placement the table may refuse)."""
    recipe = draw(st.sampled_from(sorted(RECIPES)))
    logger = draw(st.sampled_from(sorted(LOGGERS)))
    chosen = {"recipe": recipe, "logger": logger}
    for group in ("service", "transport", "env"):
        if draw(st.booleans()):
            chosen[group] = draw(st.sampled_from(_options(group)))
    kind = draw(st.sampled_from([None, *KINDS]))
    of_kind = draw(kind(recipe, chosen)) if kind is not None else {}
    # a service, transport or env the table or the recipe may refuse (transport=distributed, DQN on pendulum): unsure
    overrides = {group: (f"{group}={option}", True if group in ("recipe", "logger") else None)
                 for group, option in chosen.items()}
    leaves = [*_leaves(schema.config_schema(), ""), *_leaves(RECIPES[recipe], "recipe"),
              *_leaves(LOGGERS[logger], "logger")]
    for path, f, hint in draw(st.lists(st.sampled_from(leaves), max_size=4, unique_by=lambda leaf: leaf[0])):
        text, valid = draw(_value(f, hint))
        overrides[path] = (f"{path}={text}", valid)
    if draw(st.integers(0, 4)) == 0:
        line = draw(st.sampled_from(UNKNOWN_KEYS))
        overrides[line.lstrip("+").split("=")[0]] = (line, False)
    if draw(st.integers(0, 4)) == 0:
        line = draw(st.sampled_from(UNKNOWN_OPTIONS))
        overrides[line.split("=")[0]] = (line, False)
    overrides.update(of_kind)
    argv = [line for line, _ in overrides.values()]
    return (draw(st.permutations(argv)), {path for path, (_, valid) in overrides.items() if valid is False},
            {path for path, (_, valid) in overrides.items() if valid is None})


@pytest.mark.slow  # 48 composed command lines, a third of them planning Atari: seconds
@settings(max_examples=48, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(command_lines())
def test_any_command_line_is_a_plan_or_one_short_message(case):
    # drawn from the schema, and from the mistakes of a kind the plan refuses (device names and devices, encoders
    # against the frames they get, env.kwargs against what the env takes): never another exception
    argv, invalid, unsure = case
    result = outcome(*argv)
    if isinstance(result, ConfigurationError):
        assert_short(result)
        if invalid:  # what the schema or the plan refuses is what the message names
            # recipe: what it asks of the env
            assert result.path in invalid | unsure | {"recipe"}, (str(result), invalid)
    else:
        assert not invalid, f"{argv} was accepted though {sorted(invalid)} is outside the schema"
        assert len(result) == 1 and result[0].render().startswith("plan: recipe=")


BROKEN_YAML = ["kwargs: {a: 1\n", "id: [CartPole-v1\n", "kwargs:\n  a: 1\n b: 2\n", "id: 'CartPole-v1\n",
               "kwargs: {a: *nowhere}\n", "\tid: CartPole-v1\n"]
"""Ways a YAML file of one's own does not parse: unclosed brackets and quotes, bad indentation, an unknown alias, a
tab."""


@st.composite
def machine_mistakes(draw):
    """``(argv, path, files)``: a command line that asks for what this machine does not have, or reads a config file
    that does not parse (``files``: the config directory's files), and the config path its message must name."""
    kind = draw(st.sampled_from(["yaml", "cpus", "gpus", "custom", "temp_dir"]))
    name = draw(st.sampled_from(["inference", "replay", "logger", "weight_sync"]))
    if kind == "yaml":
        group, text = draw(st.sampled_from(["env", "logger"])), draw(st.sampled_from(BROKEN_YAML))
        return ["+recipe=ppo", f"{group}=mine"], group, {f"{group}/mine.yaml": f"defaults:\n  - _self_\n{text}"}
    if kind == "temp_dir":
        length = draw(st.integers(44, 200))
        return ["+recipe=ppo", "service=ray", "ray.temp_dir=/" + "t" * (length - 1)], "ray.temp_dir", {}
    field_name, value = {"cpus": ("num_cpus", draw(st.integers(os.cpu_count() + 1, 10**6))),
                         "gpus": ("num_gpus", draw(st.integers(64, 10**6))),
                         "custom": (f"custom.{draw(st.from_regex(r'[a-z][a-z_]{0,11}', fullmatch=True))}",
                                    draw(st.integers(1, 8)))}[kind]
    key = f"components.{name}.resources.{field_name}"
    return ["+recipe=ppo", "service=ray", f"+{key}={value}" if kind == "custom" else f"{key}={value}"], key, {}


@pytest.mark.slow  # 12 command lines through the entry point: seconds each
@settings(max_examples=12, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(machine_mistakes())
def test_a_file_or_a_machine_mistake_exits_2_and_leaves_no_run_directory(tmp_path_factory, case):
    argv, path, files = case
    cwd = tmp_path_factory.mktemp("run")
    if files:
        for name, text in files.items():
            (cwd / "mine" / name).parent.mkdir(parents=True, exist_ok=True)
            (cwd / "mine" / name).write_text(text)
        argv = ["--config-dir", str(cwd / "mine"), *argv]
    started = time.monotonic()
    proc = cli_in_process(*argv, cwd=str(cwd))
    _one_short_message(proc, path)
    assert sorted(p.name for p in cwd.iterdir()) == (["mine"] if files else [])  # no run directory left behind
    assert time.monotonic() - started < 30  # a bound on waiting (Ray's resource wait was 120 s), not a speed figure


# ---------------------------------------------------------------------------------------------- real processes
CLI_MISTAKES = [
    ("+recipe=ppo", "components.inference.max_batch_size=abc"), ("+recipe=ppo", "components.replay.colour=blue"),
    ("+recipe=ppo", "foo=1"), ("+recipe=ppo", "service=submitit"), ("+recipe=nonexistent",),
    ("+recipe=ppo", "env=nonexistent"), ("+recipe=ppo", "recipe.num_envs=0"), ("+recipe=ppo", "seed=-1"),
    ("+recipe=ppo", "recipe.lr=-1"), ("+recipe=ppo", "recipe.total_frames=-100"), ("+recipe=ppo", "recipe.window=0"),
    ("+recipe=ppo", "launcher.telemetry_every=-1"), ("+recipe=ppo", "components.inference.max_batch_size=-5"),
    ("+recipe=ppo", "components.inference.timeout=-1"), ("+recipe=ppo", "components.inference.policy_device=mps"),
    ("+recipe=ppo", "+env.kwargs.foo=1"),
]


def _one_short_message(proc, path: str) -> None:
    assert proc.returncode == EXIT_CONFIG == 2, proc.stderr
    assert proc.stderr.startswith("configuration error: ") and proc.stderr.rstrip().endswith(f"full_key: {path}")
    assert len(proc.stderr.splitlines()) <= 3 and "Traceback" not in proc.stderr and proc.stdout == ""


QUICK_CLI = {"components.inference.max_batch_size=abc", "service=submitit", "+recipe=nonexistent", "seed=-1",
             "+env.kwargs.foo=1"}
"""One of each way a mistake is refused (a wrong type, a group option, a range, the plan's own check): the quick
loop's share; the full suite runs every one."""


@pytest.mark.parametrize("args", [a if a[-1] in QUICK_CLI else pytest.param(a, marks=pytest.mark.slow)
                                  for a in CLI_MISTAKES], ids=[a[-1] for a in CLI_MISTAKES])
def test_the_cli_exits_2_with_one_short_message(args, tmp_path):
    # the command line's entry point in this process: the same phases a process runs (below, once, as a process)
    proc = cli_in_process(*args, "launcher.dry_run=true", cwd=str(tmp_path))
    _one_short_message(proc, args[-1].split("=")[0].lstrip("+"))
    assert list(tmp_path.iterdir()) == []  # nothing started, and no run directory left behind


@pytest.mark.slow
def test_a_real_process_exits_2_with_one_short_message(tmp_path):
    import torch

    cases = [(("+recipe=ppo", "seed=-1", "launcher.dry_run=true"), "seed"),  # by the preflight, before Hydra starts
             (("+recipe=ppo", "+env.kwargs.foo=1", "launcher.dry_run=true"), "env.kwargs.foo")]  # the plan, in the job
    if torch.cuda.device_count() <= 7:  # by what this machine offers, in the job (a dry run would plan it)
        cases.append((("+recipe=ppo", "components.inference.policy_device=cuda:7", "recipe.total_frames=64"),
                      "components.inference.policy_device"))
    for args, path in cases:
        _one_short_message(run_cli(*args, cwd=str(tmp_path)), path)
        assert list(tmp_path.iterdir()) == []  # and no run directory left behind


@pytest.mark.slow  # two runs of Hydra's job: seconds
def test_a_refusal_inside_hydra_s_job_leaves_no_run_directory(tmp_path):
    # refused by the plan (what the recipe asks of the env), after Hydra made the job's directory: it goes again
    proc = cli_in_process("+recipe=dqn", "env=pendulum", cwd=str(tmp_path))
    _one_short_message(proc, "recipe")
    assert "dqn needs discrete actions" in proc.stderr and list(tmp_path.iterdir()) == []
    kept = tmp_path / "mine"  # a directory the user chose that holds a file of theirs is left as it was
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    proc = cli_in_process("+recipe=dqn", "env=pendulum", f"hydra.run.dir={kept}", cwd=str(tmp_path))
    assert proc.returncode == 2 and (kept / "notes.txt").read_text() == "mine"
    empty = tmp_path / "empty"  # so is one that was there before the run, even empty
    empty.mkdir()
    assert cli_in_process("+recipe=dqn", "env=pendulum", f"hydra.run.dir={empty}", cwd=str(tmp_path)).returncode == 2
    assert empty.is_dir()
    made = tmp_path / "new" / "run"  # and one the run would have made is gone again, with its parent
    assert cli_in_process("+recipe=dqn", "env=pendulum", f"hydra.run.dir={made}", cwd=str(tmp_path)).returncode == 2
    assert not (tmp_path / "new").exists()


@pytest.mark.slow  # a sweep through Hydra's job: seconds
def test_a_sweep_refused_inside_its_first_job_leaves_no_directory(tmp_path):
    # what the machine lacks is only known where the job runs: the preflight passes it, the job refuses it
    proc = cli_in_process("--multirun", "+recipe=ppo", "service=ray", "seed=0,1",
                          "components.inference.resources.num_gpus=64", cwd=str(tmp_path))
    assert proc.returncode == 2 and "components.inference.resources.num_gpus=64" in proc.stderr, proc.stderr
    assert list(tmp_path.iterdir()) == []


WRONG_COMBINATIONS = [
    (("service=ray", "transport=shared_memory"), "transport", "weight_sync placed on 'ray' does not support"),
    (("components.replay.placement=rpc",), "components.replay.placement", "planned, not built yet: distributed"),
    (("service=process", "components.collector.placement=ray", "components.inference.transport=shared_memory"),
     "components.inference.transport", "cannot reach the collector placed on 'ray'"),
]


@pytest.mark.parametrize("overrides, path, needle", WRONG_COMBINATIONS, ids=[w[1] for w in WRONG_COMBINATIONS])
def test_a_wrong_combination_is_refused_from_the_declarations_alone(overrides, path, needle):
    # the preflight's table check (no recipe module, no env, no torch) and the full plan refuse it alike
    from launcher.checks import check_placements
    from launcher.preflight import compose

    with pytest.raises(ConfigurationError) as early:
        check_placements(compose(["recipe=ppo", *overrides]))
    assert needle in str(early.value) and early.value.path == path
    assert str(outcome("+recipe=ppo", *overrides)) == str(early.value)


@pytest.mark.slow  # a Python process: a second
def test_a_wrong_combination_is_refused_before_torch_loads(tmp_path):
    code = ("import sys\nsys.argv = ['launcher', '+recipe=ppo', 'service=ray', 'transport=shared_memory']\n"
            "from launcher.cli import main\ntry:\n    main()\nexcept SystemExit as exc:\n"
            "    print(exc.code, 'torch' in sys.modules, 'ray' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["2", "False", "False"], (proc.stdout, proc.stderr)
    assert "weight_sync placed on 'ray' does not support transport 'shared_memory'" in proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # a full plan for each refused pair: seconds
def test_every_plan_the_table_check_passes_it_also_passes_in_full():
    # the early check never refuses what the plan accepts: every service x transport pair of the dry-run matrix
    from launcher.checks import check_placements
    from launcher.preflight import compose

    for service in _options("service"):
        for transport in _options("transport"):
            if service.startswith("base_") or transport.startswith("base_"):
                continue
            cfg = compose(["recipe=ppo", f"service={service}", f"transport={transport}"])
            try:
                check_placements(cfg)
            except ConfigurationError as exc:
                assert str(outcome("+recipe=ppo", f"service={service}", f"transport={transport}")) == str(exc)


def test_a_sweep_with_one_bad_job_starts_none(tmp_path):
    proc = cli_in_process("-m", "+recipe=ppo", "service=direct,thread", "seed=0,-1", "launcher.dry_run=true",
                          cwd=str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.rstrip().endswith("full_key: seed"), proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_whose_third_env_does_not_exist_trains_no_job(tmp_path):
    # each job's env is made while its plan is: the preflight plans every job of a sweep run here before the first
    tiny = ("recipe.num_envs=2", "recipe.num_steps=16", "recipe.total_frames=64", "launcher.plot=false")
    proc = cli_in_process("--multirun", "+recipe=ppo", "env.id=CartPole-v1,Acrobot-v1,NoSuch/Env-v0", *tiny,
                          cwd=str(tmp_path))
    _one_short_message(proc, "env.id")  # nothing printed on stdout: no job launched, no plan
    assert "cannot make gymnasium env 'NoSuch/Env-v0'" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no sweep directory, no job's run directory or summary
    # a sweep submitted elsewhere is planned where each job runs (its devices are that machine's)
    argv = ["--multirun", "+recipe=ppo", "env.id=CartPole-v1,NoSuch/Env-v0", "hydra/launcher=slurm"]
    assert len(check_argv(argv)) == 2


@pytest.mark.slow  # four runs of Hydra's own main, two of them sweeps: seconds
def test_hydra_s_own_flags_and_overrides_still_work(tmp_path):
    proc = cli_in_process("+recipe=ppo", "recipe.num_envs=0", "--cfg", "job", cwd=str(tmp_path))
    assert proc.returncode == 0 and "num_envs: 0" in proc.stdout, proc.stderr
    proc = cli_in_process("--help", cwd=str(tmp_path))
    assert proc.returncode == 0 and "== Configuration groups ==" in proc.stdout, proc.stderr
    proc = cli_in_process("+recipe=ppo", "launcher.dry_run=true", f"hydra.run.dir={tmp_path / 'run'}",
                          "hydra/launcher=basic", cwd=str(tmp_path))
    assert proc.returncode == 0 and proc.stdout.startswith("plan: recipe=ppo"), proc.stderr
    proc = cli_in_process("-m", "+recipe=ppo", "service=direct,thread", "launcher.dry_run=true",
                          f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=str(tmp_path))
    assert proc.returncode == 0 and proc.stdout.count("plan: recipe=ppo") == 2, proc.stderr
