"""compose -> plan -> **run**: start owners in plan order on an ExitStack (those that do not depend on each other at
the same time), hand clients to the recipe, tear everything down in reverse (on success, on error and on Ctrl-C).
With checkpoints on, the last batch boundary's state is written before the services stop, however the run ends
(see :mod:`launcher.checkpointing`); a resumed run's services start where the checkpoint left off.

Each owner is built from its :class:`~components.resolution.Resolved` by one builder per component; each
placement's host may open a session first (a Ray cluster joined or started, a forkserver warmed up), entered
before the first owner starts and left after the last one stopped.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
from contextlib import ExitStack
from functools import partial
from typing import Any, Callable, Mapping

import hydra
from omegaconf import DictConfig, OmegaConf

from components.collectors import Collector
from components.envs import EnvMaker
from components.inference import InferenceDeviceConfig, InferenceServer, InferenceServerConfig, PolicyReplica
from components.replay import PolicyAgeFilter, ReplayBuffer
from components.resolution import Resolved
from components.weight_sync import WeightSync
from transports.errors import PeerFailureError, RemoteError, ServiceTimeoutError
from recipes import Checkpoint, Clients

from . import checkpointing
from .checkpointing import Resumed
from .failures import ServiceDied, ServiceFailedToStart, Terminated, dead_service
from .plan import LaunchPlan, recipe_of
from .report import ProgressLine
from .telemetry import EdgeReporter

log = logging.getLogger(__name__)


def ensure_runnable(plan: LaunchPlan) -> None:
    """Raise :class:`NotImplementedYetError` for the first cell that is not built, before anything starts."""
    for c in plan.components:
        c.ensure_built()


# One builder per component: (its resolution, composed config, recipe, recipe config, env spec, clients (or, per
# OWNER_DEPENDENCIES, owners) of its dependencies, run dir, what the run resumes) -> an owner not started yet.
def _logger(r: Resolved, cfg, recipe, rcfg, spec, deps, run_dir, resumed: Resumed):
    log_dir = os.path.join(run_dir, cfg.logger.log_dir)
    factory = hydra.utils.instantiate(cfg.logger, log_dir=log_dir, _partial_=True)
    extra = {}
    if resumed.state is not None:  # what was logged after the checkpoint goes
        if _takes(factory.func, "resume_step"):
            extra["resume_step"] = resumed.frames
        else:
            log.warning("%s takes no resume_step: values it logged after frame %d stay", cfg.logger._target_,
                        resumed.frames)
    if _takes(factory.func, "resolved"):
        return factory(resolved=r, **extra)
    # a user's logger that takes only placement and transport: it resolves the same values again
    return factory(placement=r.placement, transport=r.transport_config, **extra).with_resources(r.resources)


def _takes(cls: type, name: str) -> bool:
    params = inspect.signature(cls).parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _weight_sync(r: Resolved, cfg, recipe, rcfg, spec, deps, run_dir, resumed: Resumed):
    # versions kept outside this process are laid out from a template of the policy
    template = recipe.make_policy(rcfg, spec) if r.transport == "shared_memory" else None
    return WeightSync(template, first_version=resumed.policy_version, resolved=r)


def _replay(r: Resolved, cfg, recipe, rcfg, spec, deps, run_dir, resumed: Resumed):
    o = r.options
    filters = ()
    if o.get("max_policy_lag") is not None:  # the live version comes from the weight-sync channel
        filters = (PolicyAgeFilter(int(o["max_policy_lag"]), deps["weight_sync"], when="sample"),)
    return ReplayBuffer(o["capacity"], o["sampler"], o["batch_size"], alpha=o.get("alpha", 0.6), beta=o.get("beta", 0.4),
                        filters=filters, seed=int(cfg.seed), resolved=r)


def _inference(r: Resolved, cfg, recipe, rcfg, spec, deps, run_dir, resumed: Resumed):
    o = r.options
    server_cfg = InferenceServerConfig(
        placement=r.placement, max_batch_size=o["max_batch_size"], min_batch_size=o["min_batch_size"],
        timeout=o["timeout"], collect_stats=o["collect_stats"], stats_window=o["stats_window"],
    )
    devices = InferenceDeviceConfig(policy_device=o["policy_device"], output_device=o["output_device"])
    return InferenceServer(policy_factory=partial(recipe.make_policy, rcfg, spec), config=server_cfg,
                           device_config=devices, weight_sync=deps.get("weight_sync"), resolved=r)


def _replica(cfg, recipe, rcfg, spec, weight_sync) -> PolicyReplica:
    """The policy each collector worker runs itself (``components.collector.local_policy``)."""
    node = cfg.components.inference
    return PolicyReplica(partial(recipe.make_policy, rcfg, spec), weight_sync,
                         InferenceDeviceConfig(policy_device=node.policy_device, output_device=node.output_device))


def _collector(r: Resolved, cfg, recipe, rcfg, spec, deps, run_dir, resumed: Resumed):
    o = r.options
    # the recipe's envs are split over the workers, so a batch keeps the size the recipe asked for
    envs_per_group = o["num_envs"] // (o["num_collectors"] * o["env_groups"])
    policy = deps["inference"] if "inference" in deps else _replica(cfg, recipe, rcfg, spec, deps["weight_sync"])
    return Collector(
        partial(EnvMaker.from_config(cfg.env).vector, envs_per_group), policy,
        o["frames_per_batch"], o["total_frames"], o["num_collectors"], seed=int(cfg.seed), sync=bool(o["sync"]),
        start_frames=resumed.frames, env_groups=o["env_groups"], resolved=r,
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


def execute(plan: LaunchPlan, cfg: DictConfig, run_dir: str, *, on_started: Callable[[dict], None] | None = None,
            progress: ProgressLine | None = None, resumed: Resumed | None = None) -> dict:
    """Run the plan: start owners in order, run the recipe with their clients, tear down in reverse.

    Args:
        resumed: the checkpoint the run continues from (:func:`launcher.checkpointing.resolve`); its ``run_dir``
            is where the run writes. ``None``: a fresh start in ``run_dir``.

    Raises:
        NotImplementedYetError: the plan holds a cell that is not built (raised before anything starts).
        ServiceDied: a service's owner died during the run (the others were shut down); the error that
            revealed it is its cause.
    """
    ensure_runnable(plan)
    recipe, rcfg = recipe_of(cfg)
    spec = EnvMaker.from_config(cfg.env).spec()
    owners: dict[str, Any] = {}  # every owner built so far, started or starting
    progress = progress or ProgressLine(getattr(rcfg, "total_frames", 0), enabled=bool(cfg.launcher.progress))
    resumed = resumed or Resumed(run_dir)
    run_dir = resumed.run_dir
    checkpoint = Checkpoint()  # writes nothing until the services run
    with ExitStack() as stack:
        stack.callback(progress.close)
        try:
            clients = _start(plan, cfg, recipe, rcfg, spec, run_dir, stack, owners, resumed)
            checkpoint = checkpointing.checkpoint_for(cfg, resumed, clients, plan.recipe, plan.env_id)
            checkpointing.restore_services(resumed, clients)
            if on_started is not None:
                on_started(owners)
            if cfg.launcher.probe:
                _probe(plan, clients, recipe.make_policy(rcfg, spec), run_dir)
            reporter = EdgeReporter(owners, clients["logger"], every=float(cfg.launcher.telemetry_every)).start()
            stack.callback(reporter.report)  # a last reading before the services stop
            stack.callback(reporter.stop)
            result = recipe.run(
                rcfg,
                Clients(
                    policy=clients["inference"] if "inference" in clients else
                    _replica(cfg, recipe, rcfg, spec, clients["weight_sync"]),
                    collector=clients["collector"], replay=clients["replay"],
                    logger=clients["logger"], weight_sync=clients["weight_sync"], env_spec=spec, progress=progress,
                    seed=int(cfg.seed), checkpoint=checkpoint,
                ),
            )
            checkpointing.save(checkpoint, "at the end", finished={"solved": bool(result.get("solved")),
                                                                   "frames": int(result.get("frames", 0))})
        except ServiceDied:
            raise
        except Exception as exc:
            died = dead_service(owners, exc)  # checked before the teardown stops the others
            if died is not None:
                checkpointing.save(checkpoint, f"after {died.component} died")  # with the services still alive
                raise died from exc
            raise
        except (KeyboardInterrupt, Terminated, SystemExit) as exc:  # written while the services run (replay contents)
            why = "on Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "on exit"  # SystemExit: a signal handler's
            checkpointing.save(checkpoint, f"on {exc.signal_name}" if isinstance(exc, Terminated) else why)
            raise
    return dict(result)


def _start(plan: LaunchPlan, cfg, recipe, rcfg, spec, run_dir: str, stack: ExitStack, owners: dict,
           resumed: Resumed) -> dict:
    """Enter each placement's session, then start the owners level by level; returns their clients."""
    clients: dict[str, Any] = {}
    hosts = {c.placement: c.host for c in plan.components}
    for placement, host in hosts.items():  # each placement's session: entered before any owner, left last
        stack.enter_context(host.session(_container(cfg.get(placement)), run_dir=run_dir))
    for level in plan.levels:  # the owners of one level start at the same time, after those they depend on
        launched = []
        for c in level:
            deps = {d: owners[d] if d in OWNER_DEPENDENCIES.get(c.name, ()) else clients[d] for d in c.depends_on}
            owner = owners[c.name] = BUILDERS[c.name](c, cfg, recipe, rcfg, spec, deps, run_dir, resumed)
            # registered before the launch: a failed start is torn down too
            stack.callback(_shutdown, c.name, owner, float(cfg.launcher.shutdown_timeout))
            log.info("starting %s (%s, %s)", c.name, c.placement, c.transport)
            launched.append((c.name, owner.launch()))
        for name, owner in launched:
            try:
                owner.wait_ready()
            except (PeerFailureError, RemoteError, ServiceTimeoutError) as exc:
                raise ServiceFailedToStart(name, owner.placement, str(exc)) from exc
            clients[name] = owner.client()
            log.info("%s ready (%s, pids %s)", name, owner.placement, _pids(owner) or "-")
    _write_services(run_dir, owners)
    return clients


def _pids(owner: Any) -> list[int]:
    return [h.pid for h in owner.all_hosts() if h.pid is not None]


def _write_services(run_dir: str, owners: Mapping[str, Any]) -> None:
    """``services.json``: where each started service runs (placement, transport, pids), for ``ps`` and ``kill``."""
    services = {name: {"placement": o.placement, "transport": o.transport_kind, "pids": _pids(o)}
                for name, o in owners.items()}
    for name, o in owners.items():
        jobs = [h.job_id for h in o.all_hosts() if h.job_id is not None]
        if jobs:
            services[name]["jobs"] = jobs  # batch-system jobs (submitit): scancel them, not kill
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "services.json"), "w") as f:
        json.dump(services, f, indent=2)


def _probe(plan: LaunchPlan, clients: dict, policy: Any, run_dir: str) -> None:
    from .probe import probe, render

    records = probe(plan, clients, policy)
    print(render(records), flush=True)
    log.info("%s", render(records))
    path = os.path.join(run_dir, "plan.json")
    with open(path) as f:
        written = json.load(f)
    written["probe"] = records
    with open(path, "w") as f:
        json.dump(written, f, indent=2)


def _container(node) -> dict:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})


def _shutdown(name: str, owner: Any, timeout: float) -> None:
    log.info("stopping %s", name)
    owner.shutdown(timeout)
