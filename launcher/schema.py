"""Every YAML option's schema, registered with Hydra's ConfigStore in this one module.

Each group option in ``conf/`` starts with ``defaults: [base_<name>, _self_]`` so the dataclass here types
it: unknown keys and wrong types fail at compose time with the config path. A field's accepted range is declared
with ``bounded`` and checked by :func:`launcher.values.check_values`. Dataclasses only; nothing heavy
is imported. ``tests/launcher/test_config_parity.py`` keeps each schema in step with the constructor it configures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from components.atari import AtariConfig
from components.collectors.config import CollectorConfig
from components.config import LoggerConfig, WeightSyncConfig, bounded
from components.inference.config import InferenceServerConfig
from components.logger.config import CSVLoggerConfig, TensorBoardLoggerConfig
from components.replay.config import ReplayConfig
from recipes.configs import DQNConfig, IMPALAConfig, PPOConfig


# ---------------------------------------------------------------------------------------------- components
@dataclass
class ComponentsConf:
    """``components.<name>``: each component's own config dataclass, the one its owner is built from."""

    inference: InferenceServerConfig = field(default_factory=InferenceServerConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)


# ---------------------------------------------------------------------------------------------- groups
@dataclass
class ServiceConf:
    """`service=<name>`: the default placement of every component."""

    name: str = "direct"


@dataclass
class RayServiceConf(ServiceConf):
    name: str = "ray"  # the cluster itself is configured under `ray:` (used by any component placed on ray)


@dataclass
class RayConf:
    """`ray.*`: the cluster that components placed on `ray` use (whatever `service` is)."""

    address: Optional[str] = None  # join this cluster ("host:port" or "auto"); None starts a local one on 127.0.0.1
    namespace: str = "rl_services"  # Ray namespace of named actors
    num_cpus: Optional[float] = bounded(None, ge=0)  # CPUs a locally started cluster advertises (None: the machine's)
    resources: Dict[str, float] = field(default_factory=dict)  # custom resources of a locally started head node
    temp_dir: Optional[str] = None  # Ray's session dir for a locally started cluster (short path; None: a fresh one)
    connect_timeout: float = bounded(5.0, gt=0, unit="seconds")  # seconds to wait for the cluster at `address` to answer

    def rules(self):
        from components.hosts.ray_cluster import SOCKET_ROOM

        return (("temp_dir", self.temp_dir is None or len(self.temp_dir) <= SOCKET_ROOM,
                 f"ray.temp_dir is {len(self.temp_dir or '')} characters long; Ray makes Unix sockets under it, whose "
                 f"paths may not exceed 107 bytes: use a directory of at most {SOCKET_ROOM} characters "
                 "(e.g. /tmp/ray_mine), or leave it unset"),)


@dataclass
class SubmititConf:
    """`submitit.*`: how targets placed on `submitit` (collector workers) are submitted, as one job array."""

    cluster: str = "slurm"  # slurm (sbatch) | local (submitit's local subprocesses, on this machine)
    folder: Optional[str] = None  # submitit's job folder (scripts, logs); None: <run dir>/submitit
    host: str = "127.0.0.1"  # the address jobs connect back to; on a cluster: one of the driver node's
    connect_timeout: float = bounded(300.0, gt=0, unit="seconds")  # for every job to connect, queueing included
    partition: Optional[str] = None  # None: the cluster's default partition
    timeout_min: int = bounded(60, ge=1, unit="minutes")  # each collector job's time limit
    mem_gb: float = bounded(2.0, gt=0, unit="GB")  # each collector job's memory
    job_name: str = "rl_collector"
    setup: List[str] = field(default_factory=list)  # shell lines before the job's Python (module load ...)
    slurm_additional_parameters: Dict[str, Any] = field(default_factory=dict)  # any other sbatch option


@dataclass
class DistributedConf:
    """`distributed.*`: who starts the ranks of the `distributed` placement (collector workers)."""

    ranks: str = "local"  # local: the launcher spawns them | env: torchrun/srun did; rank 0 drives, rank r is worker r-1
    host: Optional[str] = None  # env: the address ranks dial the driver at (None: MASTER_ADDR)
    port: Optional[int] = bounded(None, ge=1, le=65535)  # env: rank r dials port + r - 1 (None: MASTER_PORT + 1)
    connect_timeout: float = bounded(120.0, gt=0, unit="seconds")  # env: for each rank to connect


@dataclass
class RpcConf:
    """`rpc.*`: the `rpc` placement's world (collector workers driven through torch.distributed.rpc)."""

    interface: str = "lo"  # the network interface rpc agents listen on (lo: this machine only)
    threads: int = bounded(4, ge=2)  # rpc threads per process


@dataclass
class TransportConf:
    """`transport=<name>`: the default transport of components that take that kind."""

    name: str = "auto"
    options: Dict[str, Any] = field(default_factory=dict)  # options passed to the transport


@dataclass
class EnvConf:
    """The environment (EnvMaker): a gymnasium id, or your own callable that returns one env; set one of them."""

    id: Optional[str] = None  # gymnasium id, e.g. CartPole-v1
    _target_: Optional[str] = None  # instead of id: dotted name of a callable (**kwargs) -> gymnasium.Env
    kwargs: Dict[str, Any] = field(default_factory=dict)  # keyword arguments of gymnasium.make, or of _target_
    backend: str = "gymnasium"  # how collectors vectorize envs: gymnasium | vector | ale_vector | envpool (components.env_backends)
    atari: Optional[AtariConfig] = None  # the DeepMind preprocessing of an ALE id (env=atari sets it); null: none


@dataclass
class LauncherConf:
    dry_run: bool = False  # print the plan and exit without starting anything
    torch_threads: Optional[int] = bounded(None, ge=1)  # torch intra-op threads in the driver; null: 1 for flat observations (small MLPs are fastest on one), every core for images, less one per collector worker collecting beside a one-pass learner (IMPALA) on this machine (launcher.plan.learner_threads)
    progress: bool = True  # live progress line
    plot: bool = True  # write learning_curve.png at the end
    telemetry_every: float = bounded(5.0, gt=0, unit="seconds")  # between per-edge metrics (batch fill, queue wait, policy lag)
    shutdown_timeout: float = bounded(10.0, gt=0, unit="seconds")  # each owner gets to stop (asked, then terminated, then killed)
    probe: bool = False  # time round trips on every edge once the owners run, before training (printed, plan.json)
    checkpoint_every: int = bounded(0, ge=0, unit="frames")  # between checkpoints (also at the end, on an early end); 0: none
    checkpoint_replay: bool = False  # checkpoints also hold the replay buffer's contents
    resume: Optional[str] = None  # continue the run in this run directory from its checkpoint.pt; auto: this job's own


@dataclass
class Config:
    service: Any = MISSING
    transport: Any = MISSING
    env: Any = MISSING
    logger: Any = MISSING
    recipe: Any = None
    components: ComponentsConf = field(default_factory=ComponentsConf)
    ray: RayConf = field(default_factory=RayConf)
    submitit: SubmititConf = field(default_factory=SubmititConf)
    distributed: DistributedConf = field(default_factory=DistributedConf)
    rpc: RpcConf = field(default_factory=RpcConf)
    launcher: LauncherConf = field(default_factory=LauncherConf)
    seed: int = bounded(0, ge=0, le=2**32 - 1)  # seeds torch and the environments


# ---------------------------------------------------------------------------------------------- registry
SCHEMAS: Dict[str, Dict[str, type]] = {
    "service": {
        "base_direct": ServiceConf,
        "base_thread": ServiceConf,
        "base_process": ServiceConf,
        "base_ray": RayServiceConf,
        "base_monarch": ServiceConf,
    },
    "transport": {"base_transport": TransportConf},
    "env": {"base_env": EnvConf},
    "logger": {"base_csv": CSVLoggerConfig, "base_tensorboard": TensorBoardLoggerConfig},
    "recipe": {"base_ppo": PPOConfig, "base_dqn": DQNConfig, "base_impala": IMPALAConfig},
}

# Which constructor each schema configures (checked by the parity test): schema -> (callables, ignored fields). The
# components' own configs need no entry: their owners take the config object itself.
PARITY: List[tuple] = [
    (CSVLoggerConfig, ("components.logger.CSVLogger",), ("_target_",)),
    (TensorBoardLoggerConfig, ("components.logger.TensorBoardLogger",), ("_target_",)),
    (EnvConf, ("components.envs.EnvMaker",), ()),  # _target_ is an argument here: the env's own callable
    (SubmititConf, ("components.hosts.submitit.SubmititSettings",), ()),
    (DistributedConf, ("components.hosts.distributed.DistributedSettings",), ()),
    (RpcConf, ("components.hosts._rpc_worker.RpcSettings",), ()),
]


def register() -> None:
    """Register every schema with Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    for group, nodes in SCHEMAS.items():
        for name, node in nodes.items():
            cs.store(group=group, name=name, node=node)

