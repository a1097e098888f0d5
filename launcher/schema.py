"""Every YAML option's schema, registered with Hydra's ConfigStore in this one module.

Each group option in ``conf/`` starts with ``defaults: [base_<name>, _self_]`` so the dataclass here types
it: unknown keys and wrong types fail at compose time with the config path. A field's accepted range is declared
with ``bounded`` and checked by `launcher.values.check_values`. Dataclasses only; nothing heavy
is imported. ``tests/launcher/test_config_parity.py`` keeps each schema in step with the constructor it configures.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from components.envs.family import configurable
from components.collectors.config import CollectorConfig
from components.config import bounded
from components.hosts.settings import settings_classes
from components.evaluator.config import EvaluatorConfig
from components.inference.config import InferenceServerConfig
from components.logger.config import LoggerConfig
from components.logger.csv import CSVLogger
from components.logger.mlflow import MlflowLogger
from components.logger.tensorboard import TensorBoardLogger
from components.logger.wandb import WandbLogger
from components.weight_sync.config import WeightSyncConfig
from components.replay.config import ReplayConfig
from recipes.registry import RECIPES


# ---------------------------------------------------------------------------------------------- components
@dataclass
class ComponentsConf:
    """``components.<name>``: each component's own config dataclass, the one its owner is built from."""

    inference: InferenceServerConfig = field(default_factory=InferenceServerConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    weight_sync: WeightSyncConfig = field(default_factory=WeightSyncConfig)
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)


# ---------------------------------------------------------------------------------------------- groups
@dataclass
class ServiceConf:
    """`service=<name>`: the default placement of every component."""

    name: str = "direct"


@dataclass
class RayServiceConf(ServiceConf):
    name: str = "ray"  # the cluster itself is configured under `ray:` (used by any component placed on ray)


@dataclass
class TransportConf:
    """`transport=<name>`: the default transport of components that take that kind."""

    name: str = "auto"
    options: Dict[str, Any] = field(default_factory=dict)  # options passed to the transport


@dataclass
class EnvConf:
    """The environment (EnvMaker): a gymnasium id, or your own callable that returns one env; set one of them.

    Attributes:
        backend: how collectors vectorize envs: gymnasium | vector | ale_vector | envpool
            (components.envs.backends)
    """

    id: Optional[str] = None  # gymnasium id, e.g. CartPole-v1
    _target_: Optional[str] = None  # instead of id: dotted name of a callable (**kwargs) -> gymnasium.Env
    kwargs: Dict[str, Any] = field(default_factory=dict)  # keyword arguments of gymnasium.make, or of _target_
    backend: str = "gymnasium"


def env_schema() -> type:
    """`EnvConf` with one optional node per env family that has a preprocessing, typed by its config dataclass
    and named after the family (``env.atari``: the DeepMind preprocessing of an ALE id, ``env=atari`` sets it; null:
    none), so a family registered in its own module needs no field here."""
    families = [(name, Optional[config], field(default=None)) for name, config in configurable().items()]
    return make_dataclass("EnvConf", families, bases=(EnvConf,), namespace={"__doc__": EnvConf.__doc__,
                                                                           "__module__": __name__})


@dataclass
class LauncherConf:
    """How the launcher runs a plan (``launcher.*``).

    Attributes:
        torch_threads: torch intra-op threads in the driver; null: 1 for flat observations (small MLPs are fastest on
            one), every core for images, less one per collector worker collecting beside a one-pass learner (IMPALA)
            on this machine (launcher.plan.learner_threads)
        telemetry_every: between per-edge metrics (batch fill, queue wait, policy lag)
        shutdown_timeout: each owner gets to stop (asked, then terminated, then killed)
        checkpoint_every: between checkpoints (also at the end, on an early end); 0: none
    """

    dry_run: bool = False  # print the plan and exit without starting anything
    torch_threads: Optional[int] = bounded(None, ge=1)
    progress: bool = True  # live progress line
    plot: bool = True  # write learning_curve.png at the end
    telemetry_every: float = bounded(5.0, gt=0, unit="seconds")
    shutdown_timeout: float = bounded(10.0, gt=0, unit="seconds")
    probe: bool = False  # time round trips on every edge once the owners run, before training (printed, plan.json)
    checkpoint_every: int = bounded(0, ge=0, unit="frames")
    checkpoint_replay: bool = False  # checkpoints also hold the replay buffer's contents
    resume: Optional[str] = None  # continue the run in this run directory from its checkpoint.pt; auto: this job's own


@dataclass
class Config:
    """The top-level config; `config_schema` adds each placement's session settings (``ray:``, ``submitit:``...),
    whose dataclasses their host modules declare (`components.hosts.settings`)."""

    service: Any = MISSING
    transport: Any = MISSING
    env: Any = MISSING
    logger: Any = MISSING
    recipe: Any = None
    components: ComponentsConf = field(default_factory=ComponentsConf)
    launcher: LauncherConf = field(default_factory=LauncherConf)
    seed: int = bounded(0, ge=0, le=2**32 - 1)  # seeds torch and the environments


def config_schema() -> type:
    """`Config` with one node per placement's session settings (each typed by its host's settings dataclass),
    placed before ``launcher``."""
    head = [(f.name, f.type, f) for f in fields(Config) if f.name not in ("launcher", "seed")]
    sessions = [(name, cls, field(default_factory=cls)) for name, cls in settings_classes().items()]
    tail = [(f.name, f.type, f) for f in fields(Config) if f.name in ("launcher", "seed")]
    return make_dataclass("Config", head + sessions + tail, namespace={"__doc__": Config.__doc__,
                                                                       "__module__": __name__})


# ---------------------------------------------------------------------------------------------- registry
def backend_schema(backend: type) -> type:
    """The schema of a ``logger`` group option: the backend dataclass's fields after ``_target_``, which names it."""
    target = f"components.logger.{backend.__name__}"
    copied = [(f.name, f.type, field(default=f.default, default_factory=f.default_factory, metadata=f.metadata))
              for f in fields(backend)]
    return make_dataclass(backend.__name__, [("_target_", str, field(default=target))] + copied,
                          namespace={"__doc__": backend.__doc__, "__module__": backend.__module__,
                                     "backend": backend})


SCHEMAS: Dict[str, Dict[str, type]] = {
    "service": {
        "base_direct": ServiceConf,
        "base_thread": ServiceConf,
        "base_process": ServiceConf,
        "base_ray": RayServiceConf,
        "base_monarch": ServiceConf,
    },
    "transport": {"base_transport": TransportConf},
    "env": {"base_env": env_schema()},
    "logger": {"base_csv": backend_schema(CSVLogger), "base_tensorboard": backend_schema(TensorBoardLogger),
               "base_wandb": backend_schema(WandbLogger), "base_mlflow": backend_schema(MlflowLogger)},
    "recipe": {f"base_{name}": config for name, config in RECIPES.items()},
}

# Which constructor each schema configures (checked by the parity test): schema -> (callables, ignored fields). The
# components' own configs need no entry: their owners take the config object itself.
PARITY: List[tuple] = [
    (EnvConf, ("components.envs.EnvMaker",), ()),  # _target_ is an argument here: the env's own callable
]


def register() -> None:
    """Register every schema with Hydra's ConfigStore (idempotent)."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=config_schema())
    SCHEMAS["env"]["base_env"] = env_schema()  # with the env families registered since this module was imported
    for group, nodes in SCHEMAS.items():
        for name, node in nodes.items():
            cs.store(group=group, name=name, node=node)

