"""``python -m launcher``: the command line as phases, each one function, run in this order for every job.

1. **check** (`launcher.preflight.preflight`): compose the config of every job the command line runs, once,
   as Hydra will, and check it; a mistake exits 2 with one short message before Hydra starts.
2. **plan** (`plan`): Hydra composes the job's config and hands it over; the plan resolves and checks every
   component (`launcher.plan.build_plan`). A dry run prints it and stops here.
3. **run directory and resume** (`prepare`): where the run writes and what checkpoint it continues from
   (`launcher.checkpointing.resolve`); the resolved config and the plan are written there.
4. **execute** (`launcher.run.execute`): the owners start in order, the recipe trains, everything stops.
5. **report** (`report`): ``summary.json``, the learning curve and the summary line.

How a run ends maps to one exit status in one place (`launcher.endings.end_run`; the statuses:
`launcher.conventions`):
a configuration mistake exits 2 (leaving no run directory), a service that died is one line naming it (exit 3, the
traceback in ``launcher.log``), a full disk is one line naming what could not be written (exit 4), Ctrl-C and
SIGTERM tear every service down in order and exit 130 and 143 with ``summary.json`` saying ``interrupted``; in a
submitit job its preemption signal does the same, then requeues the job (`launcher.requeue`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import sys
from dataclasses import dataclass

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from . import schema
from .conventions import normalize_argv
from .endings import end_run, quiet_when_full
from .failures import ServiceDied, ShutdownShield, Terminated, ending, handle_sigterm, no_space
from .requeue import handle_preemption

log = logging.getLogger("launcher")
schema.register()


# ---------------------------------------------------------------------------------------------- the phases
def plan(cfg: DictConfig):
    """Phase 2: the job's `LaunchPlan`. A worker rank that ``torchrun`` or ``srun`` started
    serves the driver instead and never returns.

    Raises:
        ConfigurationError: any configuration mistake, before anything starts.
    """
    from components.hosts.distributed import check_world, rank_of_environment, serve_rank

    from .checks import check_here
    from .plan import build_plan, prepare_placements

    rank = rank_of_environment(cfg.get("distributed"))
    if rank is not None and not cfg.launcher.dry_run:  # a worker rank torchrun/srun started: the driver sends its work
        serve_rank(cfg.get("distributed"), rank)
    prepare_placements(cfg)
    built = build_plan(cfg)
    if rank_of_environment(cfg.get("distributed"), driver=True) is not None:
        check_world(built)  # ranks started by torchrun/srun: they must match the collector workers
    if not cfg.launcher.dry_run:
        check_here(built)  # what this machine cannot do (a dry run may be planning for another one)
    return built


def dry_run(built) -> None:
    """Print the plan and what a Slurm job running it asks for; start nothing."""
    from .slurm import job_resources, own_jobs

    print(built.render())
    print(job_resources(built).line())  # what hydra/launcher=slurm asks for (launcher/slurm.py)
    for line in own_jobs(built):  # components submitted as jobs of their own (collectors on submitit)
        print(line)


@dataclass(frozen=True)
class Prepared:
    """Where a run writes and what it continues from (phase 3).

    Attributes:
        resumed: the run directory and the checkpoint (`launcher.checkpointing.Resumed`).
        finished: why the resumed run needs no more training (its results stay where they are), or ``None``.
    """

    resumed: object
    finished: str | None = None
    lock: object = None

    def release(self) -> None:
        """Let another run write into the run directory (`launcher.rundir.RunDirLock`)."""
        if self.lock is not None:
            self.lock.release()


def prepare(built, cfg: DictConfig, own_dir: str) -> Prepared:
    """Phase 3: the run directory (this job's own, or the resumed run's) and the checkpoint it continues from; the
    resolved config and the plan are written there.

    Raises:
        ConfigurationError: a resume that cannot be done, or a run directory a run still in progress writes into
            (before anything starts).
    """
    from .checkpointing import CHECKPOINT, remove_leftovers, resolve
    from .rundir import RunDirLock
    from .run import ensure_runnable

    ensure_runnable(built)
    resumed = resolve(built, own_dir)
    # held until the run ends: no other run writes here meanwhile (checked before anything is written)
    lock = RunDirLock(resumed.run_dir, path="hydra.run.dir" if built.launcher.resume in (None, "auto")
                      else "launcher.resume")
    if removed := remove_leftovers(os.path.join(resumed.run_dir, CHECKPOINT)):  # a write a kill -9 cut short
        log.info("removed what an interrupted checkpoint write left: %s", ", ".join(removed))
    try:
        prepared = _write_plan(built, cfg, own_dir, resumed)
    except BaseException:
        lock.release()
        raise
    if prepared.finished:
        lock.release()
        return prepared
    return dataclasses.replace(prepared, lock=lock)


def _write_plan(built, cfg: DictConfig, own_dir: str, resumed) -> Prepared:
    from .checkpointing import changed_settings
    from .report import strict_json

    run_dir = resumed.run_dir
    if resumed.state is not None:
        finished = resumed.finished(getattr(built.recipe_config, "total_frames", None))
        line = (f"nothing to resume: the run in {run_dir} had finished ({finished}); its results are there" if finished
                else f"resuming the run in {run_dir} at {resumed.frames:,} frames")
        if not finished and os.path.abspath(own_dir) != run_dir:
            line += f" (this invocation's log: {os.path.join(own_dir, 'launcher.log')})"
        if not finished and not built.launcher.checkpoint_every:
            line += "; launcher.checkpoint_every=0: no new checkpoints"
        line += "".join(f"\n    changed: {change}" for change in ([] if finished else changed_settings(resumed, built)))
        log.info(line)
        print(line, flush=True)
        if finished:
            return Prepared(resumed, finished)
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "resolved_config.yaml"), "w") as f:
        f.write(OmegaConf.to_yaml(_as_run(cfg, built), resolve=True))
    with open(os.path.join(run_dir, "plan.txt"), "w") as f:
        f.write(built.render() + "\n")
    with open(os.path.join(run_dir, "plan.json"), "w") as f:
        json.dump(strict_json(built.to_dict()), f, indent=2, allow_nan=False)
    print(built.render(), flush=True)
    log.info("plan:\n%s", built.render())
    return Prepared(resumed)


def _as_run(cfg: DictConfig, built) -> DictConfig:
    """``cfg`` with what the recipe sets of each component in place of what the YAML said (APPO's collector runs
    ``sync: false`` whatever ``components.collector.sync`` says): ``resolved_config.yaml`` shows what runs."""
    written = cfg.copy()
    for name, values in built.recipe_sets.items():
        for key, value in values.items():
            written.components[name][key] = value
    return written


def execute(built, prepared: Prepared, shield=None) -> dict:
    """Phase 4: run the plan (`launcher.run.execute`) with the live progress line; a run that ends early
    (Ctrl-C, SIGTERM, a dead service) still leaves its ``summary.json``. ``shield``: see
    `launcher.failures.ShutdownShield`."""
    import torch

    from .report import ProgressLine
    from .run import execute as execute_plan

    run_dir = prepared.resumed.run_dir
    torch.set_num_threads(int(built.launcher.torch_threads))
    torch.manual_seed(built.seed)
    progress = ProgressLine(int(getattr(built.recipe_config, "total_frames", 0) or 0),
                            enabled=bool(built.launcher.progress))
    def ended(interrupted: bool, signal: str | None, failed: str | None) -> None:  # the summary of an early end
        _write_summary(run_dir, {"interrupted": interrupted, "signal": signal, "failed": failed,
                                 "frames": progress.frames,
                                 **{k: v for k, v in progress.metrics.items() if isinstance(v, (int, float))}})

    try:
        return execute_plan(built, run_dir, progress=progress, resumed=prepared.resumed, shield=shield)
    except (KeyboardInterrupt, Terminated, ServiceDied) as exc:  # every service is down by now
        ended(not isinstance(exc, ServiceDied),
              "SIGINT" if isinstance(exc, KeyboardInterrupt) else getattr(exc, "signal_name", None),
              str(exc) if isinstance(exc, ServiceDied) else None)
        raise
    except Exception as exc:
        if (full := no_space(exc)) is not None:  # a summary fits where a batch of metrics did not, often
            with contextlib.suppress(OSError):
                ended(False, None, full)
        raise


def report(built, result: dict, run_dir: str) -> dict:
    """Phase 5: the learning curve, ``summary.json`` and the summary line. Returns ``result``."""
    from .report import plot_learning_curve, summary_line

    name = built.title  # +recipe=appo runs the impala recipe as APPO
    if built.launcher.plot:
        png = plot_learning_curve(result.get("curve", []), os.path.join(run_dir, "learning_curve.png"),
                                  title=f"{name} on {built.env_id} (seed {built.seed})",
                                  target=getattr(built.recipe_config, "target_return", None))
        result["learning_curve"] = png
    _write_summary(run_dir, {k: v for k, v in result.items() if k != "curve"})
    line = summary_line(name, built.env_id, result, run_dir)
    log.info(line)
    print(line, flush=True)
    return result


def launch(cfg: DictConfig, run_dir: str, shield: ShutdownShield | None = None) -> dict | None:
    """Phases 2 to 5 for one composed config. Returns the recipe's result (``None`` for a dry run; a resumed run that
    had finished returns its saved summary). ``shield``: the caller's, raised as the run's shutdown begins and left up
    (`launcher.failures.ShutdownShield`); ``None``: the run's own, lowered once its services are down."""
    built = plan(cfg)
    if built.launcher.dry_run:
        dry_run(built)
        return None
    prepared = prepare(built, cfg, run_dir)
    if prepared.finished:
        from .checkpointing import saved_summary

        return saved_summary(prepared.resumed.run_dir)
    try:
        result = execute(built, prepared, shield)
        return report(built, result, prepared.resumed.run_dir)
    finally:
        prepared.release()


def _write_summary(run_dir: str, summary: dict) -> None:
    """``summary.json``, whole or not at all (a disk that fills up mid-write leaves no half of one), and strict JSON:
    a figure that is not a number yet (no episode ended) is ``null``."""
    from .report import strict_json

    path = os.path.join(run_dir, "summary.json")
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(strict_json(summary), f, indent=2, allow_nan=False)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------------------------------- how a run ends
@hydra.main(version_base=None, config_path="pkg://conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> float | None:
    """Phases 2 to 5 for the job Hydra composed. Returns the run's objective for a hyperparameter search
    (`launcher.sweep.objective`: what Optuna's sweeper takes as the trial's value); ``None`` for a dry run, and
    for a run without a finite one (no episode ended), which Optuna's sweeper marks failed before it goes on (a NaN
    would end the sweep: the sweeper tells Optuna the failed trial's value). A run that fails or is interrupted
    exits with its status instead (a sweep stops there)."""
    from .sweep import objective

    run_dir = HydraConfig.get().runtime.output_dir
    quiet_when_full()
    _choose_wait_policy(cfg)
    handle_sigterm()
    handle_preemption()  # in a submitit job: its preemption signal checkpoints and stops the run, then requeues
    # up from the start of the shutdown to the process's exit: a second Ctrl-C neither cuts the shutdown short nor
    # the summary and the last line after it
    shield = ShutdownShield(float(cfg.launcher.shutdown_timeout))
    result = None
    try:
        result = launch(cfg, run_dir, shield)
    except BaseException as exc:  # noqa: BLE001 - each ending is mapped to its status; the rest is raised again
        end_run(exc, cfg, run_dir)
    shield.lower_shield()  # a sweep's next job starts with the usual handlers
    ending()
    value = math.nan if result is None else objective(result)
    return value if math.isfinite(value) else None


OVERLAP_WAIT = {"OMP_WAIT_POLICY": "PASSIVE"}
"""Set for a run whose collection overlaps learning (``components.collector.sync=false``), where the user has not set
it, before torch loads: torch's OpenMP threads then sleep while they wait instead of spinning, so the owners that share
the driver's cores (a collector at ``resources.nice=19`` above all) get the cycles the learner leaves. A run that
collects and learns in turn keeps the spinning threads, which answer each parallel step sooner (``benchmarks/atari.py``
measured the difference on both kinds of run)."""


def _choose_wait_policy(cfg: DictConfig) -> None:
    """`OVERLAP_WAIT` for a run that overlaps collection with learning (``components.collector.sync=false``, or
    a recipe whose config says it always does, as IMPALA's); inherited by every process it starts."""
    collector = cfg.get("components", {}).get("collector") or {}
    recipe = cfg.get("recipe")
    always = recipe is not None and getattr(OmegaConf.get_type(recipe), "collects_while_learning", False)
    if collector.get("sync", True) is False or always:
        for name, value in OVERLAP_WAIT.items():
            os.environ.setdefault(name, value)


def dry_run_search(configs) -> None:
    """The dry run of an Optuna sweep: the plan of each job at the ends of its search space (what the preflight
    checked, `launcher.preflight.SearchEnds`), then one line; Optuna is not started (no trial would have an
    objective). Exits 0."""
    for cfg in configs:
        print(f"at {' '.join(configs.at(cfg))}:", flush=True)
        dry_run(plan(cfg))
    print(f"dry run of an Optuna sweep: the {len(configs)} jobs at the ends of its search space "
          f"({', '.join(configs.space.values())}) planned; nothing trained, no trial run", flush=True)
    sys.exit(0)


def main() -> None:
    """Entry point of ``python -m launcher``: phase 1 (check), then Hydra runs phases 2 to 5 for each job."""
    from transports.kernel.plugins import hand_down

    from .preflight import SearchEnds, preflight, trial_dirs
    from .rundir import own_run_dir

    hand_down()  # every process of the run imports the plugins this one found, without reading the packages again
    sys.argv = [sys.argv[0], *normalize_argv(sys.argv[1:])]
    configs = preflight(sys.argv[1:])  # a config that does not compose, or a value out of range: exit 2 before Hydra
    if isinstance(configs, SearchEnds) and configs and all(cfg.launcher.dry_run for cfg in configs):
        dry_run_search(configs)
    sys.argv = [sys.argv[0], *own_run_dir(sys.argv[1:])]  # never the directory of a run started the same second
    sys.argv = [sys.argv[0], *trial_dirs(sys.argv[1:])]  # an Optuna trial's directory: its job number
    _hydra_main()
