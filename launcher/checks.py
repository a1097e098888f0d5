"""The checks around the plan: the table from the torch-free declarations, before anything heavy is imported
(`check_placements`, run by the preflight), and what the machine that runs the plan cannot do
(`check_here`, run before anything starts). `launcher.plan.build_plan` makes the plan itself."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from components.config import check_device, device_options
from components.hosts import HOSTS, host_class
from transports.kernel.errors import ConfigurationError, IncompatibleCombinationError, NotImplementedYetError
from transports.kernel.placements import Reach, reach_of

from .footprint import check_memory, check_shared_memory
from .plan import LaunchPlan, needed_components, check_calls, resolve_components


def check_placements(cfg: DictConfig) -> None:
    """The plan's table checks from the torch-free declarations alone: every component's placement and transport
    against the compatibility table, and every call edge's reach. The preflight runs it before Hydra starts and
    before torch is imported, so a wrong combination is refused in about a second; `build_plan` checks the
    same again, with everything the recipe sets. A config with no recipe, or a mistake of another kind (one that
    may depend on what the recipe sets), is left to `build_plan`.

    Raises:
        IncompatibleCombinationError: a placement, transport or call edge outside the table.
        NotImplementedYetError: a combination the table plans but that is not built yet.
    """
    from recipes.base import needs_of

    if cfg.get("recipe") is None:
        return
    try:
        needs = needed_components(cfg, needs_of(OmegaConf.get_type(cfg.recipe)))
        check_calls(resolve_components(cfg, needs, services={}, layouts={}))
    except (IncompatibleCombinationError, NotImplementedYetError):
        raise
    except (ConfigurationError, OmegaConfBaseException):
        return  # the full plan says it, with what the recipe sets


def check_here(plan: LaunchPlan) -> None:
    """What the machine (or cluster) that runs the plan cannot do, refused before anything starts: the devices it uses
    itself (`check_devices_here`), then each placement's `check_session` (a Ray
    cluster without the GPUs asked for, a network interface that does not exist, Slurm that does not answer), then
    what the plan holds on this machine (`launcher.footprint`: its shared-memory segments against the room in
    the segment directory, its replay buffer against the memory available). Not part of `build_plan`: a plan
    made on a login node for a Slurm job is checked where the job runs.

    Raises:
        ConfigurationError: naming the setting or the resource and what to do.
    """
    check_devices_here(plan)
    placed: dict[str, dict] = {}
    for c in plan.components:
        placed.setdefault(c.placement, {})[c.name] = c.resources
    for where, resources in sorted(placed.items()):
        if where in HOSTS:
            host_class(where).check_session(plan.sessions.get(where) or {}, resources)
    check_shared_memory(plan)
    check_memory(plan)


def check_devices_here(plan: LaunchPlan) -> None:
    """Refuse a device the plan uses on this machine (`devices_here`) that this machine does not have.

    Raises:
        ConfigurationError: naming the device option (``recipe.device``...), the value and the devices there are.
    """
    for path, device in devices_here(plan):
        check_device(device, path)


def devices_here(plan: LaunchPlan) -> list[tuple[str, str]]:
    """The devices the plan uses on this machine, as ``(config path, device)``: the learner's (``recipe.device``, in
    the driver) and the device options of every owner placed on this machine (``direct``, ``thread``, ``process``),
    the inference config's too where ``local_policy`` runs its policy in collector workers placed here. An owner
    placed further (a Ray actor, a Slurm job, a worker rank) checks its devices where it builds them."""
    here = [*device_options(plan.recipe_config, "recipe")] if plan.recipe_config is not None else []
    for c in plan.components:
        if c.config is not None and reach_of(c.placement) <= Reach.MACHINE:
            here += device_options(c.config, c.config.path)
    collector = next((c for c in plan.components if c.name == "collector"), None)
    if (plan.replica is not None and collector is not None and collector.options.get("local_policy")
            and reach_of(collector.placement) <= Reach.MACHINE):
        here += device_options(plan.replica, plan.replica.path)
    return here
