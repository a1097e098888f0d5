"""compose -> **plan** -> run. The plan is pure data, built without side effects.

``build_plan`` makes each component's config object (its YAML node, then what the recipe needs of it), resolves it
once (`components.resolution.resolve_component`: explicit value > ``service`` / ``transport`` default >
component default; ``auto`` explained), which checks it against the compatibility table, its transport's options
and layouts, its own options and its resources; then it checks each declared call edge for reachability, derives
wire layouts from the env's specs and the policy, and orders owners by their declared dependencies. A
`LaunchPlan` prints as a table (the dry run) and is saved with every run; each of its entries is the
`Resolved` the owner is built from, and it holds everything else a run reads of the
config (the recipe's config, the env, the logger backend, the launcher's settings, each placement's session
settings), so executing a plan reads no config of its own.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import asdict, dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from components import compat
from components.hosts import HOSTS, Resources, host_class
from components.resolution import Resolved, resolve_component
from components.scope import service_backend, transport_backend
from recipes import RECIPES, Recipe
from recipes.registry import recipe_for_config
from transports.kernel.errors import ConfigurationError, IncompatibleCombinationError
from transports.kernel.placements import Reach, placements, reach_of
from transports.kinds import reaches, transport_label

from .layouts import policy_layouts
from .values import check_values

ComponentPlan = Resolved
"""One owner of the plan: its resolution."""

_RESOURCE_DEFAULTS: dict = asdict(Resources())
_OPTION_NOTES = {("collector", "sync", False): "workers collect the next batch while the learner trains on this one: "
                                               "policy lag <= 1",
                 ("collector", "env_groups", 2): "each worker steps one half of its envs while the policy answers the "
                                                 "other half: faster beside a server process, not bit-reproducible"}


@dataclass(frozen=True)
class LaunchPlan:
    """The whole topology of a run, in start order.

    Attributes:
        recipe: the recipe's name.
        env_id: the environment.
        seed: the run's seed.
        components: one `Resolved` per owner, in start order.
        env_backend: how collectors vectorize the envs (``env.backend``).
        defaults: each component's option defaults (the printed plan names only what a run sets otherwise).
        recipe_config: the recipe's config object.
        env: the ``env`` node (for `components.envs.EnvMaker.from_config`).
        logger: the ``logger`` node: the backend's ``_target_`` and its options.
        launcher: the ``launcher`` settings (`launcher.schema.LauncherConf`).
        sessions: each placement's session settings (its node, ``ray:``, ``submitit:``...; empty where it has none).
        replica: the inference config whose devices a policy replica uses (``components.collector.local_policy``).
        recipe_sets: what the recipe sets of each component's config (``{"collector": {"sync": False, ...}}``),
            over what the YAML said.
        step: the layout of one env step as a collector's rollout holds it (`launcher.layouts`).
        policy_bytes: bytes of the policy's state. Both size what the run holds (`launcher.footprint`).
    """

    recipe: str
    env_id: str
    seed: int
    components: tuple[Resolved, ...]
    env_backend: str = "gymnasium"
    defaults: dict = dataclasses.field(default_factory=dict, compare=False)
    recipe_config: Any = dataclasses.field(default=None, compare=False)
    env: dict = dataclasses.field(default_factory=dict, compare=False)
    logger: dict = dataclasses.field(default_factory=dict, compare=False)
    launcher: Any = dataclasses.field(default=None, compare=False)
    sessions: dict = dataclasses.field(default_factory=dict, compare=False)
    replica: Any = dataclasses.field(default=None, compare=False)
    recipe_sets: dict = dataclasses.field(default_factory=dict, compare=False)
    step: Any = dataclasses.field(default=None, compare=False)
    policy_bytes: int = dataclasses.field(default=0, compare=False)

    def __getitem__(self, name: str) -> Resolved:
        for c in self.components:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def title(self) -> str:
        """The recipe as it was asked for: ``appo`` for ``+recipe=appo``, which runs the ``impala`` recipe with PPO's
        clipped surrogate (its config's ``variant``); else the recipe's name."""
        return getattr(self.recipe_config, "variant", None) or self.recipe

    @property
    def start_order(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.components)

    @property
    def levels(self) -> tuple[tuple[Resolved, ...], ...]:
        """The components in start order, grouped so that each group depends only on earlier ones: the owners of
        one group start at the same time."""
        level: dict[str, int] = {}
        for c in self.components:
            level[c.name] = 1 + max((level[d] for d in c.depends_on), default=-1)
        return tuple(tuple(c for c in self.components if level[c.name] == i) for i in range(max(level.values()) + 1))

    @property
    def not_built(self) -> tuple[Resolved, ...]:
        return tuple(c for c in self.components if not c.built)

    def to_dict(self) -> dict:
        data = {"recipe": self.title, "env_id": self.env_id, "env_backend": self.env_backend, "seed": self.seed,
                "components": [{"name": c.name, **{k: v for k, v in asdict(c).items() if k != "config"},
                                "options": c.options,
                                "transport_label": transport_label(c.transport, c.transport_options)}
                               for c in self.components]}
        return json.loads(json.dumps(data, default=str))

    def render(self) -> str:
        """The plan as a text table (what the dry run prints)."""
        head = ("#", "component", "placement", "transport", "status", "depends on", "why")
        rows = [
            (str(i + 1), c.name, f"{c.placement} ({c.placement_from})",
             transport_label(c.transport, c.transport_options), "ok" if c.built else "NOT IMPLEMENTED YET",
             ", ".join(c.depends_on) or "-", c.transport_reason)
            for i, c in enumerate(self.components)
        ]
        widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
        fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
        backend = "" if self.env_backend == "gymnasium" else f" (env.backend={self.env_backend})"
        lines = [f"plan: recipe={self.title} env={self.env_id}{backend} seed={self.seed}", fmt.format(*head)]
        lines += [fmt.format(*r) for r in rows]
        details = []
        for c in self.components:
            for key, layout in c.layouts.items():
                details.append(f"  {c.name}.{key}: {layout.describe() if hasattr(layout, 'describe') else layout}")
            res = {k: v for k, v in asdict(c.resources).items() if v != _RESOURCE_DEFAULTS.get(k)}  # what was asked for
            if res:
                details.append(f"  {c.name}.resources: {res}")
            for key, default in self.defaults.get(c.name, {}).items():
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


def learner_threads(observation_shape: tuple, collector: Resolved | None, passes: int = 1,
                    cores: int | None = None) -> int:
    """The driver's torch threads where ``launcher.torch_threads`` is not set: one for flat observations (small MLPs
    are fastest on one); for images every core, except where the collector's workers collect while the learner
    trains (``sync: false``) on this machine (placements ``direct``, ``thread``, ``process``) and the learner makes
    one pass over each batch (``passes``: IMPALA's): then it needs about as much CPU as the workers do, and it leaves
    a core to each worker (a learner thread that waits for a core holds back every other). A learner of several
    passes (APPO's four, PPO's) needs several times what its workers do and keeps every core.
    ``benchmarks/impala_atari.py`` measures both on 2 cores: IMPALA faster on one thread, APPO on two."""
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if len(observation_shape) < 3:
        return 1
    shares = (collector is not None and collector.config is not None and not collector.config.sync
              and reach_of(collector.placement) <= Reach.MACHINE and passes <= 1)
    return max(1, cores - int(collector.config.num_collectors)) if shares else max(1, cores)


def recipe_options() -> tuple[str, ...]:
    """The `+recipe=` options the package ships (`conf/recipe/*.yaml`: APPO is IMPALA's recipe with other settings)."""
    import conf

    folder = os.path.join(os.path.dirname(conf.__file__), "recipe")
    return tuple(sorted(name[:-5] for name in os.listdir(folder) if name.endswith(".yaml")))


def recipe_of(cfg: DictConfig) -> tuple[Recipe, Any]:
    """The selected `Recipe` and its config object.

    Raises:
        ConfigurationError: no recipe was selected, or none takes the selected config's type.
    """
    if cfg.get("recipe") is None:
        raise ConfigurationError("no recipe selected: add one on the command line, e.g. +recipe=ppo, or your own "
                                 "as +recipe=my_pkg.my_module:RECIPE", path="recipe", alternatives=recipe_options())
    recipe_cfg = OmegaConf.to_object(cfg.recipe)
    recipe = recipe_for_config(recipe_cfg)
    if recipe is None:
        raise ConfigurationError(f"no recipe takes a config of type {type(recipe_cfg).__name__}", path="recipe",
                                 alternatives=tuple(RECIPES))
    return recipe, recipe_cfg


def component_config(cfg: DictConfig, name: str, needs: dict) -> Any:
    """A component's config object: its YAML node (typed by its config dataclass), then what the recipe needs of it.

    Raises:
        ConfigurationError: a value the YAML sets that the recipe sets otherwise (naming both), or one out of range.
    """
    config = OmegaConf.to_object(cfg.components[name])
    defaults = compat.declaration(name).config()
    for key, value in needs.items():
        mine = getattr(config, key)
        if mine != getattr(defaults, key) and mine != value:
            raise ConfigurationError(f"components.{name}.{key}={mine!r} conflicts with the recipe, which sets it to "
                                     f"{value!r} (from its own settings): change those instead",
                                     path=f"components.{name}.{key}")
    return config.replace(**needs) if needs else config


def _option_defaults(needs: tuple[str, ...], services: dict) -> dict:
    """Each component's option defaults, less what the recipe sets (the plan prints what a run sets otherwise)."""
    return {name: {k: v for k, v in compat.declaration(name).config().options().items()
                   if k not in services.get(name, {})} for name in needs}


def resolve_components(cfg: DictConfig, needs: tuple[str, ...], services: dict, layouts: dict) -> dict[str, Resolved]:
    """Resolve each needed component once, inside the ``service=`` / ``transport=`` scope.

    Raises:
        ConfigurationError: a component, placement, transport, option or resource outside what is allowed.
    """
    service, transport = cfg.service.name, cfg.transport.name
    one_request = {call.service for n in needs for call in compat.declaration(n).calls if call.one_request_per_worker}
    configs = {name: component_config(cfg, name, services.get(name, {})) for name in needs}
    out = {}

    def resolve(name: str, placement: Any = None, kind: Any = None) -> Resolved:
        config = configs[name]
        t_explicit = config.transport is not None
        options = {**(_container(cfg.transport.options) if not t_explicit else {}), **config.transport_options}
        return resolve_component(
            name, placement or config.placement, kind or config.transport, transport_options=options,
            layouts=layouts.get(name), layouts_known=True,  # the plan derives layouts; a replay binds its own
            config=config,
            placement_path=f"components.{name}.placement" if config.placement is not None else "service",
            transport_path=f"components.{name}.transport" if t_explicit else "transport",
            one_request_per_worker=name in one_request,
        )

    with service_backend(service, origin=f"service={service}"), transport_backend(transport, origin=f"transport={transport}"):
        for name in needs:
            out[name] = resolve(name)
        for caller, callee, placement, kind in _moves_for_remote_callers(cfg, out):
            was, where = out[callee].placement, out[caller].placement
            out[callee] = dataclasses.replace(
                resolve(callee, placement, kind), placement_from=f"for the {caller} on {where!r}",
                transport_reason=f"not {was!r}: the {caller} on {where!r} reaches it over {kind!r}, served from a "
                                 f"{placement}")
    return out


def _nearer() -> list[str]:
    """Where a service nobody placed may move so that remote callers reach it: the placements that keep an owner on
    the driver's machine, nearest first (in the driver's process, then beside it)."""
    return [p.name for p in sorted(placements(), key=lambda p: p.reach) if p.reach < Reach.NETWORK]


def _unreached(resolved: dict[str, Resolved]):
    """The declared call edges whose called service's transport does not reach where its caller is placed, as
    ``(caller, its resolution, called service, its resolution)``."""
    for caller, r in resolved.items():
        for call in compat.declaration(caller).calls:
            far = resolved.get(call.service)
            if far is None or (call.when is not None and r.options.get(call.when) in (None, False)):
                continue
            if far.transport != compat.NO_TRANSPORT and not reaches(far.transport, r.placement):
                yield caller, r, call.service, far


def _moves_for_remote_callers(cfg: DictConfig, resolved: dict[str, Resolved]) -> list[tuple[str, str, str, str]]:
    """Services whose placement nobody chose (the service scope or the default) and whose transport cannot reach a
    caller on another machine's reach (collectors as worker ranks or Ray actors): the nearest placement, in the
    driver's process first, with a built transport that reaches it, as ``(caller, callee, placement, transport)``."""
    moves = []
    for caller, r, service, _ in _unreached(resolved):
        node = cfg.components[service]
        if node.placement is not None or node.transport is not None or reach_of(r.placement) < Reach.NETWORK:
            continue
        for nearer in _nearer():
            cell = compat.TABLE.get((service, nearer))
            kinds = [k for k, status in (cell.transports.items() if cell else ())
                     if status == compat.SUPPORTED and reaches(k, r.placement)]
            if kinds:
                moves.append((caller, service, nearer, kinds[0]))
                break
    return moves


def check_calls(resolved: dict[str, Resolved]) -> None:
    """Every declared call edge: the called service's transport must reach where its caller is placed."""
    for caller, r, service, far in _unreached(resolved):
        raise IncompatibleCombinationError(
            f"{service} ({far.placement!r}) over transport {far.transport!r} cannot reach the {caller} placed "
            f"on {r.placement!r}: a {far.transport!r} client only works close to its owner",
            path=f"components.{service}.transport",
            alternatives=tuple(k for k in compat.TABLE[(service, far.placement)].transports
                               if reaches(k, r.placement)),
        )


def needed_components(cfg: DictConfig, needs: tuple[str, ...]) -> tuple[str, ...]:
    """The recipe's components, with the evaluator where ``components.evaluator.eval_every`` is set, less the inference
    server where ``components.collector.local_policy`` runs the policy in the collector's workers.

    Raises:
        ConfigurationError: the inference server is placed or given a transport explicitly as well.
    """
    if cfg.components.evaluator.eval_every is not None and "evaluator" not in needs:
        needs = (*needs, "evaluator")  # evaluation while training: asked for in the config, not by the recipe
    if "collector" not in needs or not cfg.components.collector.local_policy:
        return needs
    node = cfg.components.inference
    for key in ("placement", "transport"):
        if node[key] is not None:
            raise ConfigurationError(
                f"components.inference.{key}={node[key]} places an inference server, but "
                "components.collector.local_policy=true runs the policy in each collector worker and starts none: "
                f"drop one of them", path=f"components.inference.{key}")
    return tuple(n for n in needs if n != "inference")


def _topological(names: tuple[str, ...]) -> tuple[str, ...]:
    order: list[str] = []
    pending = sorted((n for n in compat.COMPONENTS if n in names), key=lambda n: not compat.declaration(n).first)
    while pending:
        for n in pending:
            if all(d in order or d not in names for d in compat.declaration(n).depends_on):
                order.append(n)
                pending.remove(n)
                break
        else:  # pragma: no cover - the declarations are acyclic
            raise RuntimeError(f"dependency cycle among {pending}")
    return tuple(order)


def prepare_placements(cfg: DictConfig) -> None:
    """Let the host of every placement the config names begin its preparation (a forkserver importing torch)
    while the plan is built. Starts no owner; an unknown or unbuilt placement is left to the plan to report."""
    named = {cfg.service.name, *(node.placement for node in cfg.components.values() if node.placement)}
    for placement in named & set(HOSTS):
        host_class(placement).prepare()


def build_plan(cfg: DictConfig) -> LaunchPlan:
    """Build the `LaunchPlan` for a composed config. Starts nothing.

    Raises:
        ConfigurationError: any configuration mistake, before anything starts.
    """
    check_values(cfg)  # every key known and every value in its declared range, first
    recipe, recipe_cfg = recipe_of(cfg)
    from components.envs import EnvMaker  # gymnasium and tensordict: only once a recipe is chosen
    from components.logger import backend_class

    maker = EnvMaker.from_config(cfg.env)
    spec = maker.spec()
    backend_class(cfg.logger)  # a logger _target_ that does not fit fails here, before anything starts
    try:
        services = recipe.services(recipe_cfg, spec)
    except ValueError as exc:
        raise ConfigurationError(str(exc), path="recipe") from exc
    from recipes.networks import check_encoder  # torch: the policy is built next

    check_encoder(recipe_cfg, spec.observation_shape,  # frames too small for the encoder name what sized them
                  maker.image_size, preferred=spec.encoder)
    # one policy request carries the envs of one group of one worker
    split = int(cfg.components.collector.num_collectors) * int(cfg.components.collector.env_groups)
    num_envs = services.get("collector", {}).get("num_envs", 1)
    derived = policy_layouts(recipe, recipe_cfg, spec,
                             num_envs // split if split >= 1 and num_envs % split == 0 else num_envs)
    layouts = {"inference": {"request": derived.request, "response": derived.response}}
    needs = needed_components(cfg, recipe.needs)
    resolved = resolve_components(cfg, needs, services, layouts)
    check_calls(resolved)
    if "inference" in recipe.needs and "inference" not in needs:  # the collector's workers run the policy themselves
        resolved["collector"] = dataclasses.replace(
            resolved["collector"], transport_reason="local_policy: a policy replica in each worker, weights from "
                                                    "weight_sync; no inference server")
    plans = tuple(
        dataclasses.replace(resolved[name], depends_on=tuple(d for d in compat.declaration(name).depends_on
                                                              if d in needs))
        for name in _topological(needs)
    )
    placements = {c.placement for c in plans}
    launcher = OmegaConf.to_object(cfg.launcher)
    if launcher.torch_threads is None:
        launcher.torch_threads = learner_threads(spec.observation_shape, resolved.get("collector"),
                                                 getattr(recipe_cfg, "update_epochs", 1))
    return LaunchPlan(recipe=recipe.name, env_id=spec.env_id, seed=int(cfg.seed), components=plans,
                      env_backend=maker.backend, defaults=_option_defaults(needs, services), recipe_config=recipe_cfg,
                      env=_container(cfg.env), logger=_container(cfg.logger), launcher=launcher,
                      sessions={p: _container(cfg.get(p)) for p in sorted(placements)},
                      replica=OmegaConf.to_object(cfg.components.inference),
                      recipe_sets={name: dict(services.get(name, {})) for name in needs if services.get(name)},
                      step=derived.step, policy_bytes=derived.state_bytes)
