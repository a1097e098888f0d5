"""compose -> plan -> **run**: start owners in plan order on an ExitStack, hand clients to the recipe,
tear everything down in reverse (on success, on error and on Ctrl-C)."""

from __future__ import annotations

import logging
import os
from contextlib import ExitStack
from functools import partial
from typing import Any, Callable, Mapping

import hydra
from omegaconf import DictConfig, OmegaConf

from components import compat
from components.collector import Collector
from components.envs import EnvMaker
from components.inference import InferenceDeviceConfig, InferenceServer, InferenceServerConfig
from components.ray_support import RayClusterConfig, ray_cluster
from components.replay import PolicyAgeFilter, ReplayBuffer
from components.weight_sync import WeightSync
from recipes import Clients
from transports.config import TransportConfig

from .plan import ComponentPlan, LaunchPlan, recipe_of
from .report import ProgressLine
from .telemetry import EdgeReporter

log = logging.getLogger(__name__)


def ensure_runnable(plan: LaunchPlan) -> None:
    """Raise :class:`NotImplementedYetError` for the first cell that is not built, before anything starts."""
    for c in plan.components:
        compat.ensure_built(c.name, c.placement, c.transport)


def _transport(c: ComponentPlan) -> TransportConfig:
    return TransportConfig(c.transport, dict(c.options.get("transport_options", {})))


# One builder per component: (component plan, composed config, recipe, recipe config, env spec, clients (or, per
# OWNER_DEPENDENCIES, owners) of its dependencies, run dir) -> an owner that is not started yet.
def _logger(c, cfg, recipe, rcfg, spec, deps, run_dir):
    log_dir = os.path.join(run_dir, cfg.logger.log_dir)
    factory = hydra.utils.instantiate(cfg.logger, log_dir=log_dir, _partial_=True)
    return factory(placement=c.placement, transport=_transport(c))


def _weight_sync(c, cfg, recipe, rcfg, spec, deps, run_dir):
    template = recipe.make_policy(rcfg, spec) if c.placement == "process" else None
    return WeightSync(template, placement=c.placement, transport=_transport(c))


def _replay(c, cfg, recipe, rcfg, spec, deps, run_dir):
    o = c.options
    filters = ()
    if o.get("max_policy_lag") is not None:  # the live version comes from the weight-sync channel
        filters = (PolicyAgeFilter(int(o["max_policy_lag"]), deps["weight_sync"], when="sample"),)
    return ReplayBuffer(o["capacity"], o["sampler"], o["batch_size"], alpha=o.get("alpha", 0.6), beta=o.get("beta", 0.4),
                        filters=filters, placement=c.placement, transport=_transport(c), seed=int(cfg.seed))


def _inference(c, cfg, recipe, rcfg, spec, deps, run_dir):
    o = c.options
    server_cfg = InferenceServerConfig(
        placement=c.placement, max_batch_size=o["max_batch_size"], min_batch_size=o["min_batch_size"],
        timeout=o["timeout"], collect_stats=o["collect_stats"], stats_window=o["stats_window"],
    )
    devices = InferenceDeviceConfig(policy_device=o["policy_device"], output_device=o["output_device"])
    return InferenceServer(
        policy_factory=partial(recipe.make_policy, rcfg, spec), config=server_cfg, device_config=devices,
        transport=_transport(c), weight_sync=deps.get("weight_sync"),
        request_layout=c.layouts.get("request"), response_layout=c.layouts.get("response"),
    )


def _collector(c, cfg, recipe, rcfg, spec, deps, run_dir):
    o = c.options
    # the recipe's envs are split over the workers, so a batch keeps the size the recipe asked for
    envs_per_worker = o["num_envs"] // o["num_collectors"]
    return Collector(
        partial(EnvMaker.from_config(cfg.env).vector, envs_per_worker), deps["inference"],
        o["frames_per_batch"], o["total_frames"], o["num_collectors"], placement=c.placement, seed=int(cfg.seed),
        sync=bool(o["sync"]),
    )


# Dependencies handed over as owners rather than clients: the collector makes one inference client per worker.
OWNER_DEPENDENCIES: Mapping[str, tuple[str, ...]] = {"collector": ("inference",)}

BUILDERS: Mapping[str, Callable[..., Any]] = {
    "logger": _logger,
    "weight_sync": _weight_sync,
    "replay": _replay,
    "inference": _inference,
    "collector": _collector,
}


def execute(plan: LaunchPlan, cfg: DictConfig, run_dir: str, *, on_started: Callable[[dict], None] | None = None) -> dict:
    """Run the plan: start owners in order, run the recipe with their clients, tear down in reverse.

    Raises:
        NotImplementedYetError: the plan holds a cell that is not built (raised before anything starts).
    """
    ensure_runnable(plan)
    recipe, rcfg = recipe_of(cfg)
    spec = EnvMaker.from_config(cfg.env).spec()
    owners: dict[str, Any] = {}
    clients: dict[str, Any] = {}
    progress = ProgressLine(getattr(rcfg, "total_frames", 0), enabled=bool(cfg.launcher.progress))
    with ExitStack() as stack:
        stack.callback(progress.close)
        if any(c.placement == "ray" for c in plan.components):  # joined or started before any owner, left last
            started = stack.enter_context(ray_cluster(ray_config(cfg)))
            log.info("ray cluster: %s", "started on 127.0.0.1" if started else f"joined {cfg.ray.address or 'the connected one'}")
        for c in plan.components:
            deps = {d: owners[d] if d in OWNER_DEPENDENCIES.get(c.name, ()) else clients[d] for d in c.depends_on}
            owner = BUILDERS[c.name](c, cfg, recipe, rcfg, spec, deps, run_dir)
            owner.with_resources(c.resources)
            stack.callback(_shutdown, c.name, owner)  # registered first: a failed start is torn down too
            log.info("starting %s (%s, %s)", c.name, c.placement, c.transport)
            owner.start()
            owners[c.name] = owner
            clients[c.name] = owner.client()
        if on_started is not None:
            on_started(owners)
        reporter = EdgeReporter(owners, clients["logger"], every=float(cfg.launcher.telemetry_every)).start()
        stack.callback(reporter.report)  # a last reading before the services stop
        stack.callback(reporter.stop)
        result = recipe.run(
            rcfg,
            Clients(
                policy=clients["inference"], collector=clients["collector"], replay=clients["replay"],
                logger=clients["logger"], weight_sync=clients["weight_sync"], env_spec=spec, progress=progress,
                seed=int(cfg.seed),
            ),
        )
    return dict(result)


def ray_config(cfg: DictConfig) -> RayClusterConfig:
    """The cluster of the components placed on ``ray`` (``ray.*`` in the config)."""
    r = cfg.ray
    return RayClusterConfig(address=r.address, namespace=r.namespace, num_cpus=r.num_cpus,
                            resources=OmegaConf.to_container(r.resources, resolve=True), temp_dir=r.temp_dir)


def _shutdown(name: str, owner: Any) -> None:
    log.info("stopping %s", name)
    owner.shutdown()
