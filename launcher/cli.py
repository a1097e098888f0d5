"""``python -m launcher``: the command line as phases, each one function, run in this order for every job.

1. **check** (:func:`launcher.preflight.preflight`): compose the config of every job the command line runs, once,
   as Hydra will, and check it; a mistake exits 2 with one short message before Hydra starts.
2. **plan** (:func:`plan`): Hydra composes the job's config and hands it over; the plan resolves and checks every
   component (:func:`launcher.plan.build_plan`). A dry run prints it and stops here.
3. **run directory and resume** (:func:`prepare`): where the run writes and what checkpoint it continues from
   (:func:`launcher.checkpointing.resolve`); the resolved config and the plan are written there.
4. **execute** (:func:`launcher.run.execute`): the owners start in order, the recipe trains, everything stops.
5. **report** (:func:`report`): ``summary.json``, the learning curve and the summary line.

How a run ends maps to one exit status in one place (:func:`_ended`; the statuses: :mod:`launcher.conventions`):
a configuration mistake exits 2 (leaving no run directory), a service that died is one line naming it (exit 3, the
traceback in ``launcher.log``), a full disk is one line naming what could not be written (exit 4), Ctrl-C and
SIGTERM tear every service down in order and exit 130 and 143 with ``summary.json`` saying ``interrupted``; in a
submitit job its preemption signal does the same, then requeues the job (:mod:`launcher.requeue`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import sys
from dataclasses import dataclass
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from transports.errors import ConfigurationError

from . import schema
from .conventions import (EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_NO_SPACE, EXIT_SERVICE_DIED, EXIT_TERMINATED,
                          normalize_argv)
from .failures import ServiceDied, ShutdownShield, Terminated, ending, handle_sigterm, in_chain, no_space
from .requeue import Preempted, handle_preemption

log = logging.getLogger("launcher")
schema.register()


# ---------------------------------------------------------------------------------------------- the phases
def plan(cfg: DictConfig):
    """Phase 2: the job's :class:`~launcher.plan.LaunchPlan`. A worker rank that ``torchrun`` or ``srun`` started
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
        resumed: the run directory and the checkpoint (:class:`launcher.checkpointing.Resumed`).
        finished: why the resumed run needs no more training (its results stay where they are), or ``None``.
    """

    resumed: object
    finished: str | None = None
    lock: object = None

    def release(self) -> None:
        """Let another run write into the run directory (:class:`launcher.rundir.RunDirLock`)."""
        if self.lock is not None:
            self.lock.release()


def prepare(built, cfg: DictConfig, own_dir: str) -> Prepared:
    """Phase 3: the run directory (this job's own, or the resumed run's) and the checkpoint it continues from; the
    resolved config and the plan are written there.

    Raises:
        ConfigurationError: a resume that cannot be done, or a run directory a run still in progress writes into
            (before anything starts).
    """
    from recipes.checkpoint import remove_leftovers

    from .checkpointing import CHECKPOINT, resolve
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
    """Phase 4: run the plan (:func:`launcher.run.execute`) with the live progress line; a run that ends early
    (Ctrl-C, SIGTERM, a dead service) still leaves its ``summary.json``. ``shield``: see
    :class:`launcher.failures.ShutdownShield`."""
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
    (:class:`launcher.failures.ShutdownShield`); ``None``: the run's own, lowered once its services are down."""
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
def _hydra_main(cfg: DictConfig) -> None:
    run_dir = HydraConfig.get().runtime.output_dir
    _quiet_when_full()
    _choose_wait_policy(cfg)
    handle_sigterm()
    handle_preemption()  # in a submitit job: its preemption signal checkpoints and stops the run, then requeues
    # up from the start of the shutdown to the process's exit: a second Ctrl-C neither cuts the shutdown short nor
    # the summary and the last line after it
    shield = ShutdownShield(float(cfg.launcher.shutdown_timeout))
    try:
        launch(cfg, run_dir, shield)
    except BaseException as exc:  # noqa: BLE001 - each ending is mapped to its status; the rest is raised again
        _ended(exc, cfg, run_dir)
    shield.lower_shield()  # a sweep's next job starts with the usual handlers
    ending()


OVERLAP_WAIT = {"OMP_WAIT_POLICY": "PASSIVE"}
"""Set for a run whose collection overlaps learning (``components.collector.sync=false``), where the user has not set
it, before torch loads: torch's OpenMP threads then sleep while they wait instead of spinning, so the owners that share
the driver's cores (a collector at ``resources.nice=19`` above all) get the cycles the learner leaves. A run that
collects and learns in turn keeps the spinning threads, which answer each parallel step sooner (``benchmarks/atari.py``
measured the difference on both kinds of run)."""


def _choose_wait_policy(cfg: DictConfig) -> None:
    """:data:`OVERLAP_WAIT` for a run that overlaps collection with learning (``components.collector.sync=false``, or
    a recipe whose config says it always does, as IMPALA's); inherited by every process it starts."""
    collector = cfg.get("components", {}).get("collector") or {}
    recipe = cfg.get("recipe")
    always = recipe is not None and getattr(OmegaConf.get_type(recipe), "collects_while_learning", False)
    if collector.get("sync", True) is False or always:
        for name, value in OVERLAP_WAIT.items():
            os.environ.setdefault(name, value)


def _ended(exc: BaseException, cfg: DictConfig, run_dir: str) -> None:
    """Print how the run ended in one line and exit with its status; what is not an ending of ours (an error in the
    recipe or the launcher) is raised again (Python's traceback, exit 1)."""
    ending()
    if isinstance(exc, ConfigurationError):
        from .rundir import discard_unused

        discard_unused(run_dir)  # a refused run leaves no directory behind (its launcher.log closed first)
        print(f"configuration error: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_CONFIG)
    if isinstance(exc, ServiceDied):
        _service_died(exc, run_dir)
    if isinstance(exc, KeyboardInterrupt):
        if (died := _died_first(exc)) is not None:  # Ctrl-C while a dead service's run was winding down
            _service_died(died, run_dir, then="Ctrl-C arrived during the shutdown")
        print("interrupted: every service was shut down", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
    if isinstance(exc, Preempted):
        then = ("resumes from the checkpoint" if cfg.launcher.checkpoint_every else
                "starts over: launcher.checkpoint_every=0 writes no checkpoint")
        print(f"preempted ({exc.signal_name}): every service was shut down; the job goes back to submitit to be "
              f"requeued (a requeued job {then})", file=sys.stderr, flush=True)
        exc.requeue()  # exits, or raises why the job is not requeued (it timed out max_num_timeout times)
    if (full := no_space(exc)) is not None:
        _no_space(exc, full, run_dir)
    if isinstance(exc, Terminated):
        if (died := _died_first(exc)) is not None:  # e.g. torchrun ends every rank once one of them died
            _service_died(died, run_dir, then="SIGTERM arrived during the shutdown")
        print("terminated (SIGTERM): every service was shut down", file=sys.stderr, flush=True)
        sys.exit(EXIT_TERMINATED)
    raise exc


def _no_space(exc: BaseException, full: str, run_dir: str) -> None:
    """One line saying what could not be written and what the run directory holds, then exit 4."""
    log.info("the run stopped: %s", full, exc_info=exc)  # where launcher.log can still be written
    kept = [what for name, what in (("checkpoint.pt", "the last checkpoint written (checkpoint.pt)"),
                                    ("summary.json", "summary.json")) if os.path.exists(os.path.join(run_dir, name))]
    print(f"error: the run stopped: {full}; every service was shut down; kept in {run_dir}: "
          f"{', '.join(kept) if kept else 'nothing but what was written before'} (free space there: "
          f"{_free(run_dir)})", file=sys.stderr, flush=True)
    sys.exit(EXIT_NO_SPACE)


def _free(path: str) -> str:
    import shutil

    try:
        return f"{shutil.disk_usage(path).free / 2**20:,.1f} MiB"
    except OSError:
        return "unknown"


def _quiet_when_full() -> None:
    """The handlers writing ``launcher.log`` drop a record they cannot write for want of space, instead of printing a
    traceback for each: the run's last line says the disk is full."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handleError = functools.partial(_drop_when_full, handler.handleError)


def _drop_when_full(handle_error, record: logging.LogRecord) -> None:
    if no_space(sys.exc_info()[1]) is None:
        handle_error(record)


def _died_first(exc: BaseException) -> ServiceDied | None:
    """The service death a signal interrupted the handling of (the shutdown it started), if any."""
    return in_chain(exc, lambda e: isinstance(e, ServiceDied))


def _service_died(exc: ServiceDied, run_dir: str, then: str = "") -> None:
    """One line naming the dead service (its traceback goes to launcher.log), then exit 3: the run's first failure
    decides the status, even when a signal arrived while the others were being shut down."""
    log.info("the run stopped: %s", exc, exc_info=exc)  # the whole story goes to launcher.log only
    others = f"{then}; every other service was shut down" if then else "every other service was shut down"
    print(f"error: {exc}; {others} (traceback: {os.path.join(run_dir, 'launcher.log')})", file=sys.stderr, flush=True)
    sys.exit(EXIT_SERVICE_DIED)


def exit_now(code: object) -> NoReturn:
    """End ``python -m launcher`` with ``code`` (``sys.exit``'s argument) once the run has said how it ended: the exit
    handlers run (``launcher.log`` and the output flushed, temporary directories removed, a Ray connection closed), then
    the process ends without the interpreter's own teardown (every module and object cleared, the native libraries'
    destructors), which took 2-5 s after a Ray run on a loaded machine: a batch system counts them against its grace
    period after SIGTERM, and every service is down by then. Only the entry point calls it; :func:`main` itself raises
    ``SystemExit``, so a caller in the same process (a test) goes on."""
    import atexit

    status = 0 if code is None else code if isinstance(code, int) else 1
    if not isinstance(code, (int, type(None))):
        print(code, file=sys.stderr)  # as the interpreter prints sys.exit("message")
    atexit._run_exitfuncs()  # what the interpreter runs first at its exit; the rest it does is not needed
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status & 0xFF)


def main() -> None:
    """Entry point of ``python -m launcher``: phase 1 (check), then Hydra runs phases 2 to 5 for each job."""
    from .preflight import preflight
    from .rundir import own_run_dir

    sys.argv = [sys.argv[0], *normalize_argv(sys.argv[1:])]
    preflight(sys.argv[1:])  # a config that does not compose, or a value out of range: exit 2 before Hydra starts
    sys.argv = [sys.argv[0], *own_run_dir(sys.argv[1:])]  # never the directory of a run started the same second
    _hydra_main()
