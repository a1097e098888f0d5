"""compose -> **plan** -> run. The plan is pure data, built without side effects.

``build_plan`` resolves every component's placement and transport (explicit value > ``service`` /
``transport`` default > component default; ``auto`` explained), validates each against the compatibility
table and each dependency edge for reachability, derives wire layouts from the env's specs and the policy,
and orders owners by their dependencies. A :class:`LaunchPlan` prints as a table (the dry run) and is saved
with every run.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import MISSING as MISSING_FIELD, asdict, dataclass, field
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from components import compat
from components.scope import choose_placement, choose_transport, service_backend, transport_backend
from recipes import RECIPES, Recipe, get_recipe
from transports.config import TransportConfig
from transports.errors import ConfigurationError, IncompatibleCombinationError
from transports.kinds import reaches
from transports.resolver import TransportContext

from .schema import ComponentConf, ComponentsConf, ResourcesConf

# Who calls whom: a dependant is started after, and stopped before, what it depends on. The logger comes
# first so it outlives everything and can record teardown metrics.
DEPENDENCIES: Mapping[str, tuple[str, ...]] = {
    "logger": (),
    "weight_sync": ("logger",),
    "replay": ("logger", "weight_sync"),
    "inference": ("logger", "weight_sync"),
    "collector": ("logger", "inference", "replay"),
}
# Components whose clients keep one request in flight per worker (collectors step synchronously), which
# lets `auto` give each worker its own slot.
ONE_REQUEST_AT_A_TIME: frozenset = frozenset({"inference"})

# Cross-owner traffic: (carrier, far end): the carrier's transport must reach the far end's placement.
# Collectors call the inference server from where they run; weight sync pushes into the inference owner.
EDGES: tuple[tuple[str, str], ...] = (("inference", "collector"), ("weight_sync", "inference"))
# Only when the recipe asks the replay buffer to filter by policy age does it read the live version.
VERSION_EDGE: tuple[str, str] = ("weight_sync", "replay")

# Resources left at their defaults are not worth a line in the printed plan.
def _defaults(conf_type) -> dict:
    return {f.name: (f.default_factory() if f.default_factory is not MISSING_FIELD else f.default)
            for f in dataclasses.fields(conf_type)}


_RESOURCE_DEFAULTS: dict = _defaults(ResourcesConf)
# Each component's own options (beside placement, transport and resources) and their defaults: the plan text
# names those a run sets otherwise, as it does for resources.
_BASE_FIELDS = {f.name for f in dataclasses.fields(ComponentConf)}
_OPTION_DEFAULTS: dict = {f.name: {k: v for k, v in _defaults(f.default_factory).items() if k not in _BASE_FIELDS}
                          for f in dataclasses.fields(ComponentsConf)}
_OPTION_NOTES = {("collector", "sync", False): "workers collect the next batch while the learner trains on this one: "
                                               "policy lag <= 1"}


@dataclass(frozen=True)
class ComponentPlan:
    """One owner of the plan."""

    name: str
    placement: str
    placement_from: str
    transport: str
    transport_reason: str
    status: str
    depends_on: tuple[str, ...]
    resources: Mapping[str, Any]
    options: Mapping[str, Any]
    layouts: Mapping[str, str] = field(default_factory=dict)

    @property
    def built(self) -> bool:
        return self.status == compat.SUPPORTED


@dataclass(frozen=True)
class LaunchPlan:
    """The whole topology of a run, in start order."""

    recipe: str
    env_id: str
    seed: int
    components: tuple[ComponentPlan, ...]

    def __getitem__(self, name: str) -> ComponentPlan:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def start_order(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.components)

    @property
    def not_built(self) -> tuple[ComponentPlan, ...]:
        return tuple(c for c in self.components if not c.built)

    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self), default=str))

    def render(self) -> str:
        """The plan as a text table (what the dry run prints)."""
        head = ("#", "component", "placement", "transport", "status", "depends on", "why")
        rows = [
            (
                str(i + 1),
                c.name,
                f"{c.placement} ({c.placement_from})",
                c.transport,
                "ok" if c.built else "NOT IMPLEMENTED YET",
                ", ".join(c.depends_on) or "-",
                c.transport_reason,
            )
            for i, c in enumerate(self.components)
        ]
        widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
        lines = [f"plan: recipe={self.recipe} env={self.env_id} seed={self.seed}", fmt.format(*head)]
        lines += [fmt.format(*r) for r in rows]
        details = []
        for c in self.components:
            for key, layout in c.layouts.items():
                details.append(f"  {c.name}.{key}: {layout.describe() if hasattr(layout, 'describe') else layout}")
            res = {k: v for k, v in c.resources.items() if v != _RESOURCE_DEFAULTS.get(k)}  # what was asked for
            if res:
                details.append(f"  {c.name}.resources: {res}")
            for key, default in _OPTION_DEFAULTS.get(c.name, {}).items():
                value = c.options.get(key, default)
                if value != default:
                    note = _OPTION_NOTES.get((c.name, key, value))
                    details.append(f"  {c.name}.{key}: {json.dumps(value)}" + (f" ({note})" if note else ""))
        if details:
            lines += ["layouts, resources and options:", *details]
        if self.not_built:
            lines.append(
                "cells marked NOT IMPLEMENTED YET are part of the target table but not built: this plan cannot run yet"
            )
        return "\n".join(lines)


def _container(node) -> dict:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})


def recipe_of(cfg: DictConfig) -> tuple[Recipe, Any]:
    """The selected :class:`Recipe` and its config object.

    Raises:
        ConfigurationError: no recipe was selected.
    """
    if cfg.get("recipe") is None:
        raise ConfigurationError("no recipe selected: add one on the command line, e.g. +recipe=ppo",
                                 path="recipe", alternatives=RECIPES)
    recipe_cfg = OmegaConf.to_object(cfg.recipe)
    name = type(recipe_cfg).__name__
    for candidate in RECIPES:
        recipe = get_recipe(candidate)
        if isinstance(recipe_cfg, recipe.config):
            return recipe, recipe_cfg
    raise ConfigurationError(f"no recipe takes a config of type {name}", path="recipe", alternatives=RECIPES)


def resolve_components(cfg: DictConfig, needs: tuple[str, ...], *, layouts_known: bool = True) -> dict[str, tuple]:
    """Resolve placement and transport of each needed component; validate against the table.

    Returns:
        ``{name: (placement Choice, placement path, Resolution)}``.

    Raises:
        IncompatibleCombinationError: a component, placement or transport outside the table.
    """
    service, transport = cfg.service.name, cfg.transport.name
    out = {}
    with service_backend(service, origin=f"service={service}"), transport_backend(transport, origin=f"transport={transport}"):
        for name in needs:
            node = cfg.components[name]
            p_path = f"components.{name}.placement" if node.placement is not None else "service"
            placement = choose_placement(node.placement, "direct", path=p_path)
            compat.get_cell(name, placement.value, path=p_path, origin=None if node.placement is not None else placement.origin)
            t_explicit = node.transport is not None
            t_path = f"components.{name}.transport" if t_explicit else "transport"
            choice = choose_transport(node.transport, path=t_path)
            options = {**(_container(cfg.transport.options) if not t_explicit else {}), **_container(node.transport_options)}
            resolution = compat.resolve(
                name,
                TransportConfig(choice.value, options),
                TransportContext(placement.value, layouts_known=layouts_known, path=t_path,
                                 origin=None if t_explicit else choice.origin,
                                 one_request_per_worker=name in ONE_REQUEST_AT_A_TIME),
                strict=t_explicit,
                lenient=node.placement is not None,
            )
            out[name] = (placement, p_path, resolution)
    return out


def _check_edges(resolved: dict[str, tuple], edges=EDGES) -> None:
    for carrier, far in edges:
        if carrier not in resolved or far not in resolved:
            continue
        kind, where = resolved[carrier][2].kind, resolved[far][0].value
        if not reaches(kind, where):
            here = resolved[carrier][0].value
            raise IncompatibleCombinationError(
                f"{carrier} ({here!r}) over transport {kind!r} cannot reach the {far} placed on {where!r}: "
                f"a {kind!r} client only works close to its owner",
                path=f"components.{carrier}.transport",
                alternatives=tuple(k for k in compat.TABLE[(carrier, here)].transports if reaches(k, where)),
            )


def _layouts(recipe: Recipe, recipe_cfg: Any, spec, num_envs: int) -> dict[str, dict[str, str]]:
    import torch
    from transports.layout import Layout

    request = spec.request_layout(num_envs)
    with torch.no_grad():
        policy = recipe.make_policy(recipe_cfg, spec)
        out = policy(request.zeros())
    out.set("policy_version", torch.zeros(out.batch_size, dtype=torch.long))
    response = Layout.from_tensordict(out.exclude(*request.keys))
    return {"inference": {"request": request, "response": response}}


def _topological(names: tuple[str, ...]) -> tuple[str, ...]:
    canonical = tuple(DEPENDENCIES)
    order: list[str] = []
    pending = [n for n in canonical if n in names]
    while pending:
        for n in pending:
            if all(d in order or d not in names for d in DEPENDENCIES[n]):
                order.append(n)
                pending.remove(n)
                break
        else:  # pragma: no cover - DEPENDENCIES is acyclic
            raise RuntimeError(f"dependency cycle among {pending}")
    return tuple(order)


def build_plan(cfg: DictConfig) -> LaunchPlan:
    """Build the :class:`LaunchPlan` for a composed config. Starts nothing.

    Raises:
        ConfigurationError: any configuration mistake, before anything starts.
    """
    recipe, recipe_cfg = recipe_of(cfg)
    resolved = resolve_components(cfg, recipe.needs)
    _check_edges(resolved)
    from components.envs import EnvMaker  # gymnasium and tensordict: only once the combination is valid
    from components.logger import logger_class

    spec = EnvMaker.from_config(cfg.env).spec()
    logger_class(cfg.logger)  # a logger _target_ that does not fit fails here, before anything starts
    try:
        services = recipe.services(recipe_cfg, spec)
    except ValueError as exc:
        raise ConfigurationError(str(exc), path="recipe") from exc
    if services.get("replay", {}).get("max_policy_lag") is not None:
        _check_edges(resolved, (VERSION_EDGE,))
    collector = services.get("collector", {})
    workers = int(cfg.components.collector.num_collectors)
    if collector and (workers < 1 or collector["num_envs"] % workers):
        raise ConfigurationError(
            f"num_collectors={workers} must divide the recipe's num_envs={collector['num_envs']} (envs are split over workers)",
            path="components.collector.num_collectors",
        )
    layouts = _layouts(recipe, recipe_cfg, spec, collector.get("num_envs", 1) // max(workers, 1))
    plans = []
    for name in _topological(recipe.needs):
        placement, p_path, resolution = resolved[name]
        node = cfg.components[name]
        plans.append(
            ComponentPlan(
                name=name,
                placement=placement.value,
                placement_from=p_path if p_path != "service" else placement.origin,
                transport=resolution.kind,
                transport_reason=resolution.reason,
                status=compat.status(name, placement.value, resolution.kind),
                depends_on=tuple(d for d in DEPENDENCIES[name] if d in recipe.needs),
                resources=_container(node.resources),
                options={**{k: v for k, v in _container(node).items() if k not in ("placement", "transport", "resources")},
                         **services.get(name, {}), "transport_options": dict(resolution.options)},
                layouts=layouts.get(name, {}),
            )
        )
    return LaunchPlan(recipe=recipe.name, env_id=spec.env_id, seed=int(cfg.seed), components=tuple(plans))
