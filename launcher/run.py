"""compose -> plan -> **run**: start owners in plan order on an ExitStack (those that do not depend on each other at
the same time), hand clients to the recipe, tear everything down in reverse (on success, on error and on Ctrl-C).
With checkpoints on, the last batch boundary's state is written before the services stop, however the run ends
(see `launcher.checkpointing`); a resumed run's services start where the checkpoint left off.

Each owner is built from its `Resolved` by one builder per component; each
placement's host may open a session first (a Ray cluster joined or started, a forkserver warmed up), entered
before the first owner starts and left after the last one stopped.
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping

from components.collectors import Collector
from components.envs import EnvMaker
from components.evaluator import Evaluator
from components.inference import InferenceServer, PolicyReplica
from components.logger import Logger
from components.logger.backend import backend_class, takes
from components.replay import ReplayBuffer
from components.resolution import Resolved
from components.service import Owner
from components.targets import instantiate_target
from components.weight_sync import WeightSync
from recipes import Clients, get_recipe
from transports.kernel.errors import (ConfigurationError, PeerFailureError, RemoteError, ServiceError,
                                     ServiceTimeoutError)
from transports.segments import remove_orphans

from . import checkpointing
from .checkpointing import Resumed
from .failures import (ServiceDied, ServiceFailedToStart, ShutdownShield, Terminated, cause_of, dead_service,
                       in_chain)
from .plan import LaunchPlan
from .report import ProgressLine
from .telemetry import EdgeReporter

log = logging.getLogger(__name__)


def ensure_runnable(plan: LaunchPlan) -> None:
    """Raise `NotImplementedYetError` for the first cell that is not built, before anything starts."""
    for c in plan.components:
        c.ensure_built()


@dataclass(frozen=True)
class _Run:
    """What every builder gets: the plan, its recipe, the env's spec, where the run writes and what it resumes."""

    plan: LaunchPlan
    recipe: Any
    spec: Any
    run_dir: str
    resumed: Resumed

    def make_policy(self) -> Any:
        return self.recipe.make_policy(self.plan.recipe_config, self.spec)

    def policy_factory(self) -> partial:
        return partial(self.recipe.make_policy, self.plan.recipe_config, self.spec)


# One builder per component: (its resolution, the run, clients (or, per OWNER_DEPENDENCIES, owners) of its
# dependencies) -> an owner not started yet, called as every owner is: its config, its dependencies by keyword, its
# resolution.
def _logger(r: Resolved, run: _Run, deps: dict):
    node = dict(run.plan.logger)
    extra = {"log_dir": os.path.join(run.run_dir, node["log_dir"])}
    if run.resumed.state is not None:  # what was logged after the checkpoint goes
        if takes(backend_class(node), "resume_step"):
            extra["resume_step"] = run.resumed.frames
        else:
            log.warning("%s takes no resume_step: values it logged after frame %d stay", node["_target_"],
                        run.resumed.frames)
    backend = instantiate_target(node, "logger", **extra)
    resolved_yaml = os.path.join(run.run_dir, "resolved_config.yaml")  # written as the run was prepared
    if takes(backend_class(node), "run_config") and os.path.exists(resolved_yaml):
        from omegaconf import OmegaConf

        # set on the backend, not passed through instantiate: Hydra would build every _target_ node inside it
        backend.run_config = OmegaConf.to_container(OmegaConf.load(resolved_yaml), resolve=True)
    return Logger(r.config, backend=backend, resolved=r)


def _weight_sync(r: Resolved, run: _Run, deps: dict):
    template = run.make_policy() if WeightSync.needs_template(r) else None  # shared state is laid out from it
    # Every recipe publishes its restored weights once before training (the checkpointed version's own weights): that
    # push is the checkpoint's version again, so a resumed run's versions go on with no gap.
    return WeightSync(r.config, template=template, first_version=max(0, run.resumed.policy_version - 1), resolved=r)


def _replay(r: Resolved, run: _Run, deps: dict):
    return ReplayBuffer(r.config, weight_sync=deps.get("weight_sync"), seed=run.plan.seed, resolved=r)


def _inference(r: Resolved, run: _Run, deps: dict):
    return InferenceServer(r.config, policy_factory=run.policy_factory(), weight_sync=deps.get("weight_sync"),
                           resolved=r)


def _replica(run: _Run, weight_sync) -> PolicyReplica:
    """The policy each collector worker runs itself (``components.collector.local_policy``)."""
    return PolicyReplica(run.policy_factory(), weight_sync, run.plan.replica)


def _collector(r: Resolved, run: _Run, deps: dict):
    c = r.config
    # the recipe's envs are split over the workers, so a batch keeps the size the recipe asked for
    envs_per_group = c.num_envs // (c.num_collectors * c.env_groups)
    policy = deps["inference"] if "inference" in deps else _replica(run, deps["weight_sync"])
    return Collector(r.config, create_env_fn=partial(EnvMaker.from_config(run.plan.env).vector, envs_per_group),
                     policy=policy, seed=run.plan.seed, start_frames=run.resumed.frames, resolved=r)


def _evaluator(r: Resolved, run: _Run, deps: dict):
    return Evaluator(r.config, env=run.plan.env, policy_factory=run.policy_factory(),
                     weight_sync=deps.get("weight_sync"), logger=deps.get("logger"), inference=run.plan.replica,
                     resolved=r)


# Dependencies handed over as owners rather than clients: the collector makes one inference client per worker.
OWNER_DEPENDENCIES: Mapping[str, tuple[str, ...]] = {"collector": ("inference",)}

# The owner class each builder makes, for the hosts it will launch (Owner.hosts_of).
OWNER_TYPES: Mapping[str, type] = {"logger": Logger, "weight_sync": WeightSync, "replay": ReplayBuffer,
                                   "inference": InferenceServer, "collector": Collector, "evaluator": Evaluator}

BUILDERS: Mapping[str, Callable[..., Any]] = {
    "logger": _logger,
    "weight_sync": _weight_sync,
    "replay": _replay,
    "inference": _inference,
    "collector": _collector,
    "evaluator": _evaluator,
}


def _winding_down(plan: LaunchPlan) -> None:
    """Tell the host of every placement of the plan that the run ends on a signal (`Host.winding_down`)."""
    for c in plan.components:
        c.host.winding_down()


def _signal_within(error: BaseException) -> BaseException | None:
    """The `Terminated` or ``KeyboardInterrupt`` an error came from, where a library's call ran the signal's
    handler and raised its own error instead (Ray's ``get``): the signal ended the run, not the services it took
    down with it (a SIGTERM to the process group reaches Ray's daemons too)."""
    return in_chain(error, lambda e: isinstance(e, (Terminated, KeyboardInterrupt)))


def execute(plan: LaunchPlan, run_dir: str, *, on_started: Callable[[dict], None] | None = None,
            progress: ProgressLine | None = None, resumed: Resumed | None = None,
            shield: ShutdownShield | None = None) -> dict:
    """Run the plan: start owners in order, run the recipe with their clients, tear down in reverse. Everything it
    reads is the plan's (it reads no config of its own).

    Args:
        plan: what to run (`launcher.plan.build_plan`).
        run_dir: where the run writes (unless it resumes another run directory).
        on_started: called with the owners once every one is ready.
        progress: the live progress line (default: one from the plan's launcher settings).
        resumed: the checkpoint the run continues from (`launcher.checkpointing.resolve`); its ``run_dir``
            is where the run writes. ``None``: a fresh start in ``run_dir``.
        shield: keeps a second Ctrl-C or SIGTERM from cutting the shutdown short, raised as the shutdown begins; the
            caller lowers one it passes (the command line keeps it up until the process exits). ``None``: one of
            this call's own, lowered as it returns.

    Raises:
        NotImplementedYetError: the plan holds a cell that is not built (raised before anything starts).
        ServiceDied: a service's owner died during the run (the others were shut down); the error that
            revealed it is its cause.
    """
    ensure_runnable(plan)
    if removed := remove_orphans():  # left by a run that was killed outright (kill -9 takes no cleanup with it)
        log.info("removed %d shared-memory segments of processes that no longer exist: %s", len(removed),
                 ", ".join(removed))
    settings = plan.launcher
    resumed = resumed or Resumed(run_dir)
    run = _Run(plan, get_recipe(plan.recipe), EnvMaker.from_config(plan.env).spec(), resumed.run_dir, resumed)
    progress = progress or ProgressLine(getattr(plan.recipe_config, "total_frames", 0), enabled=bool(settings.progress))
    own = shield is None
    shield = shield or ShutdownShield(float(settings.shutdown_timeout))
    try:
        return _execute(run, progress, shield, on_started)
    finally:
        if own:
            shield.lower_shield()


def _execute(run: _Run, progress: ProgressLine, shield: ShutdownShield,
             on_started: Callable[[dict], None] | None) -> dict:
    """`execute`'s body: once the shutdown begins (the recipe returned, raised, or a signal arrived), ``shield``
    lets it run to its end."""
    plan, settings, resumed = run.plan, run.plan.launcher, run.resumed
    owners: dict[str, Any] = {}  # every owner built so far, started or starting
    checkpoint = checkpointing.Checkpoint()  # writes nothing until the services run
    with ExitStack() as stack:
        stack.callback(progress.close)
        try:
            clients = _start(run, stack, owners)
            checkpoint = checkpointing.checkpoint_for(plan, resumed, clients)
            checkpointing.restore_services(resumed, clients)
            if on_started is not None:
                on_started(owners)
            if settings.probe:
                _probe(plan, clients, run.make_policy(), run.run_dir)
            reporter = EdgeReporter(owners, clients["logger"], every=float(settings.telemetry_every),
                                    step=lambda: max(progress.frames, resumed.frames)).start()
            stack.callback(reporter.report)  # a last reading before the services stop
            stack.callback(reporter.stop)
            stack.callback(shield.raise_shield)  # unwound first: the whole shutdown is shielded
            evaluator = clients.get("evaluator")
            result = run.recipe.run(
                plan.recipe_config,
                Clients(
                    policy=clients["inference"] if "inference" in clients else _replica(run, clients["weight_sync"]),
                    collector=clients["collector"], replay=clients["replay"],
                    logger=clients["logger"], weight_sync=clients["weight_sync"], env_spec=run.spec,
                    progress=progress if evaluator is None else EvaluatedProgress(progress, evaluator),
                    seed=plan.seed, checkpoint=checkpoint,
                ),
            )
            if evaluator is not None:
                result = {**result, **_evaluated(evaluator, int(result.get("frames", progress.frames)))}
            checkpointing.save(checkpoint, "at the end", finished={"solved": bool(result.get("solved")),
                                                                   "frames": int(result.get("frames", 0))})
        except ServiceDied:
            raise
        except Exception as exc:
            shield.raise_shield()
            if (signalled := _signal_within(exc)) is not None:  # a library wrapped our signal's exception in its own
                _winding_down(plan)
                checkpointing.save(checkpoint, f"on {getattr(signalled, 'signal_name', 'Ctrl-C')}")
                raise signalled from None
            # checked before the teardown stops the others; a host that ended because its own configuration was
            # wrong there (a node without the run's key) is reported as that mistake, not as a death
            died = None if isinstance(exc, ConfigurationError) else dead_service(owners, exc)
            if died is not None:
                checkpointing.save(checkpoint, f"after {died.component} died")  # with the services still alive
                raise died from exc
            raise
        except (KeyboardInterrupt, Terminated, SystemExit) as exc:  # written while the services run (replay contents)
            shield.raise_shield()
            _winding_down(plan)
            why = "on Ctrl-C" if isinstance(exc, KeyboardInterrupt) else "on exit"  # SystemExit: a signal handler's
            checkpointing.save(checkpoint, f"on {exc.signal_name}" if isinstance(exc, Terminated) else why)
            raise
    return dict(result)


class EvaluatedProgress:
    """The progress line the recipe updates, which also tells the evaluator the frame count (it answers at once and
    evaluates on its own when ``eval_every`` more frames have passed): the recipe never starts, stops or waits for it.

    Args:
        progress: the run's progress line.
        evaluator: the evaluator's client.
    """

    def __init__(self, progress: ProgressLine, evaluator: Any):
        self.progress, self.evaluator = progress, evaluator

    def update(self, frames: int, **metrics: float) -> None:
        """Show ``frames`` and ``metrics``, and tell the evaluator the frame count."""
        self.progress.update(frames, **metrics)
        self.evaluator.notify(frames)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.progress, name)


def _evaluated(evaluator: Any, frames: int) -> dict:
    """Once training ends: an evaluation of the final weights (unless the last one was at this frame count), and
    every evaluation of the run, for ``summary.json`` (``eval_mean_return``: the last one's mean return)."""
    evaluator.wait_idle(None)
    results = evaluator.results()
    if not results or results[-1]["frames"] != frames:
        results.append(evaluator.evaluate(frames))
    last = results[-1]
    return {"eval_mean_return": last["mean_return"], "eval_return_std": last["return_std"], "evaluations": results}


def _start(run: _Run, stack: ExitStack, owners: dict) -> dict:
    """Enter each placement's session, then start the owners level by level; returns their clients."""
    plan = run.plan
    clients: dict[str, Any] = {}
    hosts = {c.placement: c.host for c in plan.components}
    for placement, host in hosts.items():  # each placement's session: entered before any owner, left last
        stack.enter_context(host.session(plan.sessions.get(placement, {}), run_dir=run.run_dir))
    expected: dict[str, list] = {p: [] for p in hosts}  # every host's process starts now, before any owner waits
    for c in plan.components:
        expected[c.placement] += [(c.resources, n) for n in OWNER_TYPES.get(c.name, Owner).hosts_of(c)]
    for placement, host in hosts.items():
        host.warm(expected[placement])
    for level in plan.levels:  # the owners of one level start at the same time, after those they depend on
        launched = []
        for c in level:
            deps = {d: owners[d] if d in OWNER_DEPENDENCIES.get(c.name, ()) else clients[d] for d in c.depends_on}
            owner = owners[c.name] = BUILDERS[c.name](c, run, deps)
            # registered before the launch: a failed start is torn down too
            stack.callback(_shutdown, c.name, owner, float(plan.launcher.shutdown_timeout))
            log.info("starting %s (%s, %s)", c.name, c.placement, c.transport)
            try:
                launched.append((c.name, owner.launch()))
            except ServiceError:
                raise
            except Exception as exc:  # built in this process (direct) and raised: the cause, not the host's absence
                raise ServiceFailedToStart(c.name, owner.placement, cause_of(exc)) from exc
        for name, owner in launched:
            try:
                owner.wait_ready()
            except (PeerFailureError, RemoteError, ServiceTimeoutError) as exc:
                raise ServiceFailedToStart(name, owner.placement, cause_of(exc)) from exc
            clients[name] = owner.client()
            log.info("%s ready (%s, pids %s)", name, owner.placement, _pids(owner) or "-")
    _write_services(run.run_dir, owners)
    return clients


def _pids(owner: Any) -> list[int]:
    return [h.pid for h in owner.all_hosts() if h.pid is not None]


def _write_services(run_dir: str, owners: Mapping[str, Any]) -> None:
    """``services.json``: where each started service runs (placement, transport, pids, and the node of each host
    that may run on another machine), for ``ps`` and ``kill``."""
    services = {name: {"placement": o.placement, "transport": o.transport_kind, "pids": _pids(o)}
                for name, o in owners.items()}
    for name, o in owners.items():
        jobs = [h.job_id for h in o.all_hosts() if h.job_id is not None]
        if jobs:
            services[name]["jobs"] = jobs  # batch-system jobs (submitit): scancel them, not kill
        addresses = [h.node_address for h in o.all_hosts()]
        if any(addresses):
            services[name]["nodes"] = addresses  # where each host runs (a Ray node, a rank's or job's machine)
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


def _shutdown(name: str, owner: Any, timeout: float) -> None:
    log.info("stopping %s", name)
    owner.shutdown(timeout)
