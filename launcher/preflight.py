"""Every configuration mistake, found before anything starts: the preflight of ``python -m launcher``.

Two checks, both raising `ConfigurationError` (the CLI prints it and exits 2):

- `check_argv` composes the command line's config the way Hydra will (every job of a ``--multirun``
  sweep), and Hydra's own config with the ``hydra/...`` and ``hydra.*`` overrides (a launcher's fields), and turns
  Hydra's and OmegaConf's errors into one short message: the key or value, its config path, what is allowed there;
- `launcher.values.check_values` walks a composed config against its schema: the range each field declares
  (`transports.kernel.options.bounded`, `one_of`), keys the schema does not
  have, then the ``rules()`` between fields (``(field to blame, holds, what is wrong)``).
  ``build_plan`` runs it too, so a config composed in Python is checked the same way, dry run or not.

A sweep whose jobs run on this machine (Hydra's own launcher, ``hydra/launcher=local``) has every job's plan made too
(its env, what its recipe asks of it), before the first job trains.

An Optuna sweep (``hydra/sweeper=optuna`` or an option extending it) is checked at the ends of its search space
(`optuna_jobs`): each choice, both ends of each interval and range, so a value no trial could run is refused
before the first trial trains; what would make the search itself wrong (minimizing the return, a storage this Optuna
cannot open) is refused too. Its dry run plans those jobs and stops (`launcher.cli.dry_run_search`).

Where it cannot be sure what Hydra will do (``--help``, ``--cfg``, ``--info``, another config path or name,
``hydra.searchpath``, a sweeper other than Optuna's, ``HYDRA_FULL_ERROR=1``) the preflight steps aside and leaves
the command line to Hydra.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import re
import sys
import typing
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from transports.kernel.errors import ConfigurationError
from transports.kernel.options import fields_of

from . import schema
from .conventions import EXIT_CONFIG, normalize_argv
from .values import check_values, kind_text

_HANDS_OFF = ("help", "hydra_help", "cfg", "info", "package", "resolve", "shell_completion", "config_path",
              "config_name", "experimental_rerun")
"""Hydra's flags that show instead of run, or compose another config: the preflight leaves those to Hydra."""

_HYDRA_DECIDES = ("hydra.searchpath", "hydra.sweeper", "hydra/sweeper", "hydra.mode")
"""Hydra overrides that change which configs exist or how a sweep is expanded."""
_SWEEPER = ("hydra.sweeper", "hydra/sweeper")
"""Of those, the ones choosing or configuring the sweeper: Optuna's is read here (`optuna_jobs`)."""


# ---------------------------------------------------------------------------------------------- the command line
def preflight(argv: list[str]) -> list[DictConfig]:
    """Exit with status 2 and one short message if the command line's config holds a mistake; else return the composed
    configs (`check_argv`: for an Optuna sweep, its `SearchEnds`, whose dry run the caller prints).

    Args:
        argv: the command line after the program name.
    """
    try:
        return check_argv(argv)
    except ConfigurationError as exc:
        print(f"configuration error: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_CONFIG)


def check_argv(argv: list[str]) -> list[DictConfig]:
    """Compose the config of every job the command line runs, as Hydra will, and check its values and where its
    components go (`launcher.checks.check_placements`); then, for a sweep whose jobs run on this machine, each
    job's plan (`_plan_every_job`), so no job trains before every one is known to start.

    Args:
        argv: the command line after the program name (``+recipe=ppo`` is read as ``recipe=ppo``).

    Returns:
        The composed config of each job (none where the preflight leaves the command line to Hydra); for an Optuna
        sweep, of each job at the ends of its search space, as `SearchEnds`.

    Raises:
        ConfigurationError: an override that does not parse, an unknown key or group option, a value of the
            wrong type or out of range, naming its config path and what is allowed.
    """
    from .checks import check_placements
    from .references import register_references

    register_references(argv)  # a recipe named by module:attribute is an option of the recipe group from now on
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return []
    argv = normalize_argv(list(argv))
    jobs = sweep_jobs(argv)
    search = config_dir_override(argv)
    configs = []
    for overrides in jobs or ():
        try:
            try:
                cfg = compose([*overrides, *search])
            except Exception as exc:
                if not _is_config_error(exc):
                    return []  # not a mistake in the config: Hydra reports it its own way
                raise explain(exc) from None
            check_values(cfg, strict=False)
            check_placements(cfg)  # the table, before torch is imported
        except ConfigurationError as exc:
            if isinstance(jobs, SearchEnds):
                raise jobs.where(exc, overrides) from None
            raise
        configs.append(cfg)
    launcher = _check_hydra(argv, [*jobs[0], *search]) if jobs else None
    _check_resumes(configs)
    if len(configs) > 1 and launcher in _RUN_HERE:
        _plan_every_job(configs)
    return SearchEnds(configs, jobs.space) if isinstance(jobs, SearchEnds) else configs


_RUN_HERE = ("hydra._internal.core_plugins.basic_launcher.BasicLauncher",
             "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher")
"""Hydra launchers whose jobs run on this machine: Hydra's own (one after another, in this process; the default) and
``hydra/launcher=local`` (submitit's local subprocesses)."""


def _plan_every_job(configs: list[DictConfig]) -> None:
    """Make the plan of every job of a sweep that runs on this machine (`launcher.plan.build_plan`: the env
    each job makes, what its recipe asks of it, its devices...), so a mistake in any job is refused before the first
    one trains, not as its turn comes. A dry run is left to its jobs (nothing trains); a sweep submitted elsewhere
    (``hydra/launcher=slurm``) too: a job's plan checks the machine it runs on (its devices).

    Raises:
        ConfigurationError: what the plan of a job refuses.
    """
    from .checks import check_devices_here
    from .plan import build_plan

    for cfg in configs:
        if cfg.launcher.dry_run:
            continue
        try:
            check_devices_here(build_plan(cfg))  # the jobs run here: their devices are this machine's
        except ConfigurationError:
            raise
        except Exception:  # noqa: BLE001 - not a mistake in the config: the job reports it as it runs
            return


def _check_hydra(argv: list[str], job: list[str]) -> str | None:
    """Compose Hydra's own config with the command line's ``hydra/...`` and ``hydra.*`` overrides (a launcher and
    its fields, typed by the launcher plugin's schema), so a mistake there is one message too.

    Returns:
        The ``_target_`` of the Hydra launcher that runs the jobs (``None`` where Hydra's config does not compose
        here: Hydra says why).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = OverridesParser.create().parse_overrides(hydra_args(argv).overrides)
    own = [o.input_line for o in overrides if o.key_or_group.startswith("hydra.") or o.is_hydra_override()]
    if not own:
        return _RUN_HERE[0]  # the primary config chooses no launcher: Hydra's own
    try:
        cfg = compose([*job, *own], hydra=True)
    except Exception as exc:
        if _is_config_error(exc):
            raise explain(exc) from None
        return None
    for key in ("run", "sweep"):
        if any(line.split("=", 1)[0].lstrip("+") == f"hydra.{key}.dir" for line in own):
            _check_writable(cfg.hydra[key].dir, f"hydra.{key}.dir")
    return str(cfg.hydra.launcher.get("_target_"))


def _check_writable(path: str, key: str) -> None:
    """A run directory the run can make: its nearest existing ancestor is a directory this process may write to."""
    here = os.path.abspath(path)
    while not os.path.exists(here):
        here = os.path.dirname(here)
    if os.path.isdir(here) and os.access(here, os.W_OK | os.X_OK):
        return
    what = "a file, not a directory" if not os.path.isdir(here) else "a directory this user may not write to"
    raise ConfigurationError(f"{key}={path!r} cannot be made: {here} is {what}; choose another directory", path=key)


def config_dir_override(argv: list[str]) -> list[str]:
    """``--config-dir`` as the search path override that adds the same directory where Hydra adds it (after the
    launcher's own configs); ``[]`` without one.

    Raises:
        ConfigurationError: the directory does not exist, or holds a config file that one of the launcher's (or
            Hydra's) own hides (`_check_hidden`).
    """
    args = hydra_args(argv)
    if args is None or not args.config_dir:
        return []
    where = os.path.abspath(args.config_dir)
    if not os.path.isdir(where):
        raise ConfigurationError(f"--config-dir {args.config_dir!r} is not a directory ({where})", path="--config-dir")
    _check_hidden(args.config_dir, where)
    return [f"hydra.searchpath=[file://{where}]"]


def _check_hidden(given: str, where: str) -> None:
    """Refuse a ``--config-dir`` file named like one the launcher ships (``recipe_env/appo_minatar.yaml``), or one of
    Hydra's own: Hydra searches its own configs and the launcher's ``conf`` before a ``--config-dir``, so the first of
    that name is read and the user's is silently ignored. (Names the schema registers, ``base_ppo``..., come after
    the user's directory: a file of such a name is read, so it is not refused.)

    Raises:
        ConfigurationError: naming the user's file, the shipped one it would lose to, and what to do.
    """
    from hydra._internal.config_repository import ConfigRepository
    from hydra._internal.utils import create_config_search_path

    schema.register()
    ahead = [s for s in ConfigRepository(create_config_search_path("pkg://conf")).get_sources()
             if s.provider != "schema"]  # the sources Hydra searches before --config-dir
    for parent, dirs, files in os.walk(where):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for file in sorted(f for f in files if f.endswith(".yaml")):
            name = os.path.relpath(os.path.join(parent, file), where)[:-len(".yaml")].replace(os.sep, "/")
            source = next((s for s in ahead if s.is_config(name)), None)
            if source is None:
                continue
            group, _, option = name.rpartition("/")
            todo = (f"rename yours (e.g. {name}_mine.yaml) and choose it with {group}={option}_mine" if group else
                    "rename yours and choose it with --config-name")
            whose = "the launcher's own configs" if source.provider == "main" else "Hydra's own configs"
            raise ConfigurationError(
                f"--config-dir {given!r} holds {name}.yaml, a name {whose} take ({source.full_path()}/{name}.yaml): "
                f"Hydra reads theirs first, so yours would be ignored; {todo}, or set its keys on the command line",
                path="--config-dir")


def _check_resumes(configs: list[DictConfig]) -> None:
    """Two jobs of one sweep may not continue the same run directory (``auto`` gives each job its own)."""
    named = [str(c.launcher.get("resume")) for c in configs if c.launcher.get("resume") not in (None, "auto")]
    twice = sorted({where for where in named if named.count(where) > 1})
    if twice:
        raise ConfigurationError(f"launcher.resume={twice[0]!r} would continue one run directory in several jobs of "
                                 "the sweep: resume one run per command, or use launcher.resume=auto "
                                 "(each job its own)", path="launcher.resume")


def sweep_jobs(argv: list[str]) -> list[list[str]] | None:
    """The config overrides of each job the command line runs (one job unless ``--multirun``); ``hydra.*`` and
    ``hydra/...`` overrides are left out (they configure Hydra). ``None``: leave this command line to Hydra.

    Raises:
        ConfigurationError: an override that does not parse, or a sweep without ``--multirun``.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    args = hydra_args(argv)
    if args is None or any(getattr(args, name, None) for name in _HANDS_OFF):
        return None
    try:
        overrides = OverridesParser.create().parse_overrides(args.overrides)
    except OverrideParseException as exc:
        reasons = [line for line in exc.message.splitlines()[1:] if line and not line.startswith("See ")]
        reason = reasons[0] if reasons else "it does not follow Hydra's override grammar"
        raise ConfigurationError(f"cannot read the override {exc.override!r}: {reason}"
                                 + ("; write key=value" if "EQUAL" in reason else ""),
                                 path=exc.override.split("=")[0].lstrip("+~")) from None
    decides = [o for o in overrides if o.key_or_group.startswith(_HYDRA_DECIDES)]
    if decides:
        if args.multirun and all(o.key_or_group.startswith(_SWEEPER) for o in decides):
            return optuna_jobs(overrides)
        return None
    task = [o for o in overrides if not (o.key_or_group == "hydra" or o.is_hydra_override())]
    if not args.multirun:
        for o in task:
            if o.is_sweep_override():
                raise ConfigurationError(f"{o.input_line!r} sweeps over several values: add --multirun to run one job "
                                         f"per value, or write a list as {o.get_key_element()}=[...]",
                                         path=o.key_or_group)
        return [[o.input_line for o in task]]
    axes: dict[str, list[str]] = {}
    for o in task:  # as Hydra's basic sweeper expands them: one job per combination
        key = o.get_key_element()
        if o.is_sweep_override() and not o.is_discrete_sweep():
            return None
        values = o.sweep_string_iterator() if o.is_sweep_override() else [o.get_value_element_as_str()]
        axes[key] = [f"{key}={v}" for v in values]
    return [list(job) for job in itertools.product(*axes.values())]


class SearchEnds(list):
    """The jobs that stand for an Optuna sweep's search space (`optuna_jobs`): each job's overrides, or (as
    `check_argv` returns them) each job's composed config; with the search space they stand for.

    Args:
        jobs: each job's overrides, or composed configs.
        space: the searched keys' overrides as written (``recipe.lr=tag(log, interval(3e-4, 3e-2))``), by key.
    """

    def __init__(self, jobs: list, space: dict[str, str]):
        super().__init__(jobs)
        self.space = space

    def at(self, job: list[str] | DictConfig) -> list[str]:
        """The values of the searched keys that ``job`` (its overrides or its config) takes, as overrides."""
        if isinstance(job, DictConfig):
            return [f"{key}={OmegaConf.select(job, key.lstrip('+~'))}" for key in self.space]
        return [o for o in job if o.split("=", 1)[0] in self.space]

    def where(self, exc: ConfigurationError, job: list[str]) -> ConfigurationError:
        """``exc`` (a mistake in ``job``) saying which values of the search space the job took."""
        space = ", ".join(f"{line!r}" for line in self.space.values())
        line = self.space.get(exc.path or "", "")
        hint = ("; Hydra's interval() is of floats: int(interval(a, b)) draws integers"
                if "must be an integer" in exc.message and "interval(" in line and "int(" not in line else "")
        return ConfigurationError(f"{exc.message} (at {' '.join(self.at(job))}, an end of the Optuna search space "
                                  f"{space}){hint}", path=exc.path, alternatives=exc.alternatives)


def optuna_jobs(overrides: list) -> SearchEnds | None:
    """The jobs that stand for an Optuna sweep's search space: one with the first value of every searched key, then
    one for each other end of a key (each choice; both ends of an interval or a range), the other keys at their first.
    The search space is ``hydra.sweeper.params`` and the keys the command line sweeps (which replace a key both name),
    as the sweeper reads them.

    Args:
        overrides: the command line's overrides, parsed (Hydra's ``Override``).

    Returns:
        The jobs' config overrides; ``None``: the sweeper is not Optuna's, or Hydra's config does not compose here
        (Hydra says why), or the search space holds what only Hydra expands (left to Hydra).

    Raises:
        ConfigurationError: ``hydra/sweeper=optuna`` without the plugin; a direction other than ``maximize``; a
            ``storage`` this Optuna cannot open.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from .sweep import OPTUNA_SWEEPER

    task = [o for o in overrides if not (o.key_or_group == "hydra" or o.is_hydra_override())]
    own = [o.input_line for o in overrides if o.key_or_group.startswith("hydra.") or o.is_hydra_override()]
    try:
        cfg = compose([*(o.input_line for o in task if not o.is_sweep_override()), *own], hydra=True)
    except Exception as exc:
        _no_optuna_plugin(exc)
        if _is_config_error(exc):
            raise explain(exc) from None
        return None
    sweeper = cfg.hydra.sweeper
    if sweeper.get("_target_") != OPTUNA_SWEEPER:
        return None
    _check_optuna(sweeper)
    lines = [f"{key}={value}" for key, value in (sweeper.get("params") or {}).items()]
    searched: dict[str, list[str]] = {}
    space: dict[str, str] = {}
    for o in OverridesParser.create().parse_overrides([*lines, *(o.input_line for o in task)]):
        ends = _ends(o)
        if ends is None:
            return None
        searched[o.get_key_element()] = ends
        if o.is_sweep_override():
            space[o.get_key_element()] = o.input_line
        else:
            space.pop(o.get_key_element(), None)
    base = {key: ends[0] for key, ends in searched.items()}
    jobs = [[f"{key}={value}" for key, value in base.items()]]
    for key, ends in searched.items():
        for value in ends[1:]:
            jobs.append([f"{k}={value if k == key else v}" for k, v in base.items()])
    return SearchEnds(jobs, space)


TRIAL_SUBDIR = "${hydra.job.num}"
"""``hydra.sweep.subdir`` of an Optuna sweep: each trial's directory named by its job number. The default (the job
number and its overrides) outgrows a file name (255 bytes) with a few of Optuna's 17-digit values, and Hydra fails
as the first trial starts; a trial's overrides are in its ``.hydra/overrides.yaml`` and in the sweep summary."""


def trial_dirs(argv: list[str]) -> list[str]:
    """``argv`` with ``hydra.sweep.subdir=`` `TRIAL_SUBDIR` added for an Optuna sweep that does not choose its
    own; else ``argv`` as it is."""
    args = hydra_args(argv)
    if args is None or not args.multirun or any(o.split("=", 1)[0].lstrip("+~") == "hydra.sweep.subdir"
                                                for o in args.overrides):
        return argv
    try:
        jobs = sweep_jobs(argv)
    except ConfigurationError:
        return argv  # the preflight said why already
    return [*argv, f"hydra.sweep.subdir={TRIAL_SUBDIR}"] if isinstance(jobs, SearchEnds) else argv


def _ends(o) -> list[str] | None:
    """The values of one key of an Optuna search space to check: its value, each choice, both ends of an interval or
    a range (an interval's upper end included: a superset of what Optuna draws); ``None``: another kind of sweep."""
    if not o.is_sweep_override():
        return [o.get_value_element_as_str()]
    if o.is_choice_sweep():
        return list(o.sweep_string_iterator())
    if o.is_range_sweep():
        values = list(o.sweep_string_iterator())
        return [values[0], values[-1]] if len(values) > 1 else values or None
    if o.is_interval_sweep():
        value = o.value()
        return [str(value.start), str(value.end)]
    return None


def _check_optuna(sweeper: DictConfig) -> None:
    """What would make an Optuna search wrong from its first trial. Raises ConfigurationError."""
    direction = sweeper.get("direction")
    names = [getattr(d, "name", str(d)).rpartition(".")[2] for d in
             (direction if isinstance(direction, (list, tuple)) or OmegaConf.is_list(direction) else [direction])]
    if names != ["maximize"]:
        raise ConfigurationError(
            f"hydra.sweeper.direction={names[0] if len(names) == 1 else names}: a trial's objective is one number, "
            "its run's return, which the search should maximize: set hydra.sweeper.direction=maximize "
            "(hydra/sweeper=ppo_cartpole_optuna does)", path="hydra.sweeper.direction")
    if sweeper.get("storage"):
        import optuna
        import sqlalchemy

        if int(optuna.__version__.split(".")[0]) < 3 and int(sqlalchemy.__version__.split(".")[0]) >= 2:
            raise ConfigurationError(
                f"hydra.sweeper.storage={sweeper.storage!r}: Optuna {optuna.__version__} (the newest that "
                f"hydra-optuna-sweeper takes) cannot open a database with SQLAlchemy {sqlalchemy.__version__}; "
                "leave hydra.sweeper.storage=null (the study is kept in memory; optimization_results.yaml and the "
                "sweep summary are written in the sweep directory)", path="hydra.sweeper.storage")


def _no_optuna_plugin(exc: BaseException) -> None:
    """Raise the install line where ``hydra/sweeper=...`` names Optuna's sweeper and the plugin is not installed."""
    import importlib.util

    from hydra.errors import MissingConfigException

    missing = getattr(exc, "missing_cfg_file", None) if isinstance(exc, MissingConfigException) else None
    if (missing or "").startswith("hydra/sweeper") and "optuna" in missing \
            and importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is None:
        raise ConfigurationError(f"hydra/sweeper={missing.rpartition('/')[2]} needs "
                                 "Hydra's Optuna sweeper: pip install '.[optuna]' (hydra-optuna-sweeper)",
                                 path="hydra/sweeper") from None


def hydra_args(argv: list[str]) -> argparse.Namespace | None:
    """The command line as Hydra's own parser reads it (``None`` if it does not parse: Hydra says why)."""
    try:
        from hydra._internal.utils import get_args_parser
    except ImportError:  # pragma: no cover - another Hydra: leave the command line to it
        return None
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            return get_args_parser().parse_args(argv)
        except SystemExit:
            return None


def compose(overrides: list[str], *, hydra: bool = False) -> DictConfig:
    """The config ``python -m launcher`` composes for these overrides (Hydra's compose API over ``conf``);
    ``hydra``: with Hydra's own config under ``hydra`` (its launcher, its run directory...)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    schema.register()
    with initialize_config_module(config_module="conf", version_base=None):
        return hydra_compose(config_name="config", overrides=overrides, return_hydra_config=hydra)


def _is_config_error(exc: BaseException) -> bool:
    import yaml
    from hydra.errors import HydraException

    # ValueError: an override Hydra refuses; YAMLError: a config file (of --config-dir) that is not YAML
    return isinstance(exc, (HydraException, OmegaConfBaseException, ValueError, yaml.YAMLError))


def _components_placed_on(placement: str) -> list[str]:
    """The components the compatibility table lets run on ``placement`` today (a built cell)."""
    from components import compat

    return [name for name in compat.COMPONENTS if placement in compat.placements_of(name)
            and compat.get_cell(name, placement).built]


def explain(exc: BaseException) -> ConfigurationError:
    """A Hydra or OmegaConf composition error as one short `ConfigurationError`: what is wrong, the value,
    the config path and what is allowed there."""
    import yaml
    from hydra.errors import MissingConfigException

    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        group = os.path.basename(os.path.dirname(mark.name))
        return ConfigurationError(f"{mark.name} is not valid YAML: {exc.problem} (line {mark.line + 1}, column "
                                  f"{mark.column + 1})", path=group or os.path.basename(mark.name))
    if isinstance(exc, MissingConfigException) and exc.missing_cfg_file and exc.options is not None:
        group, _, option = exc.missing_cfg_file.rpartition("/")
        takes = _components_placed_on(option) if group == "service" else []
        if takes:  # a placement that only some components take: name them, as the table says
            where = ", ".join(f"components.{name}.placement={option}" for name in takes)
            return ConfigurationError(f"service has no option {option!r}: {option!r} places only "
                                      f"{' and '.join(takes)} ({where}); the other services go elsewhere",
                                      path=group,
                                      alternatives=tuple(o for o in exc.options if not o.startswith("base_")))
        return ConfigurationError(f"{group or 'the config'} has no option {option!r}", path=group or option,
                                  alternatives=tuple(o for o in exc.options if not o.startswith("base_")))
    cause = exc if isinstance(exc, OmegaConfBaseException) else exc.__cause__
    if cause is None and isinstance(exc.__context__, OmegaConfBaseException):
        cause = exc.__context__  # Hydra merging a config file: "In 'recipe_env/x': ... raised while composing config"
    key, full_key = getattr(cause, "key", None), getattr(cause, "full_key", None)
    source = re.match(r"In '([^']+)': \w+ raised while composing config", str(exc))
    origin = f" (in {source.group(1)}.yaml)" if source else ""  # the config file that set it, a user's own perhaps
    owner = getattr(cause, "object_type", None)
    fields = fields_of(owner)
    if full_key and isinstance(cause, (ConfigKeyError, ConfigAttributeError)):  # a key the schema lacks
        parent = full_key.rpartition(".")[0] or "the config"
        if fields:
            return ConfigurationError(f"{parent} has no key {key!r}{origin}", path=full_key, alternatives=tuple(fields))
        if parent == "recipe":
            return ConfigurationError(f"recipe has no key {key!r}: no recipe is selected (add one, e.g. +recipe=ppo)",
                                      path=full_key)
        return ConfigurationError(f"{parent} has no key {key!r}: add one with +{full_key}=...", path=full_key)
    if full_key and isinstance(cause, ValidationError) and key in fields:
        hint = typing.get_type_hints(owner).get(key, Any)
        got = getattr(cause, "value", None)
        return ConfigurationError(f"{full_key} must be {kind_text(hint)}, got {got!r}{origin}", path=full_key)
    text = str(cause if full_key or source else exc).strip().splitlines()
    return ConfigurationError((text[0] if text else type(exc).__name__) + origin, path=full_key or None)
