"""``python -m launcher``: compose (Hydra) -> plan -> dry run or run.

A configuration mistake exits with status 2 and a short message (component, placement, transport, config
path, supported alternatives), never a long traceback. A service that dies during the run is one line naming
it (exit 3, the traceback in ``launcher.log``); Ctrl-C and SIGTERM tear every service down in order and exit 130
and 143, with ``summary.json`` saying ``interrupted``; in a submitit job its preemption signal does the same, then
requeues the job (:mod:`launcher.requeue`). The statuses: :mod:`launcher.failures`. With
``launcher.resume`` the run continues in the resumed run directory (:mod:`launcher.checkpointing`); a run that had
finished is not trained again (exit 0).
"""

from __future__ import annotations

import json
import logging
import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from transports.errors import ConfigurationError

from . import schema
from .failures import EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_SERVICE_DIED, EXIT_TERMINATED, ServiceDied, Terminated, \
    handle_sigterm
from .requeue import Preempted, handle_preemption

log = logging.getLogger("launcher")
schema.register()


def launch(cfg: DictConfig, run_dir: str) -> dict | None:
    """Plan, then print (dry run) or execute. Returns the recipe's result (``None`` for a dry run)."""
    from components.hosts.distributed import check_world, rank_of_environment, serve_rank

    from .plan import build_plan, prepare_placements

    rank = rank_of_environment(cfg.get("distributed"))
    if rank is not None and not cfg.launcher.dry_run:  # a worker rank torchrun/srun started: the driver sends its work
        serve_rank(cfg.get("distributed"), rank)
    prepare_placements(cfg)
    plan = build_plan(cfg)
    if rank_of_environment(cfg.get("distributed"), driver=True) is not None:
        check_world(plan)  # ranks started by torchrun/srun: they must match the collector workers
    if cfg.launcher.dry_run:
        from .slurm import job_resources, own_jobs

        print(plan.render())
        print(job_resources(plan, cfg).line())  # what hydra/launcher=slurm asks for (launcher/slurm.py)
        for line in own_jobs(plan, cfg):  # components submitted as jobs of their own (collectors on submitit)
            print(line)
        return None

    import torch

    from .checkpointing import changed_settings, resolve, saved_summary
    from .report import ProgressLine, plot_learning_curve, summary_line
    from .run import ensure_runnable, execute

    ensure_runnable(plan)
    resumed = resolve(cfg, run_dir, plan.recipe, plan.env_id)  # a resume that cannot be done exits 2 here
    own_dir, run_dir = run_dir, resumed.run_dir
    if resumed.state is not None:
        finished = resumed.finished(cfg.recipe.get("total_frames"))
        line = (f"nothing to resume: the run in {run_dir} had finished ({finished}); its results are there" if finished
                else f"resuming the run in {run_dir} at {resumed.frames:,} frames")
        if not finished and os.path.abspath(own_dir) != run_dir:
            line += f" (this invocation's log: {os.path.join(own_dir, 'launcher.log')})"
        if not finished and not cfg.launcher.checkpoint_every:
            line += "; launcher.checkpoint_every=0: no new checkpoints"
        changes = [] if finished else changed_settings(resumed, cfg)
        line += "".join(f"\n    changed: {change}" for change in changes)
        log.info(line)
        print(line, flush=True)
        if finished:
            return saved_summary(run_dir)
    torch.set_num_threads(int(cfg.launcher.torch_threads))
    torch.manual_seed(int(cfg.seed))
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "resolved_config.yaml"), "w") as f:
        f.write(OmegaConf.to_yaml(cfg, resolve=True))
    with open(os.path.join(run_dir, "plan.txt"), "w") as f:
        f.write(plan.render() + "\n")
    with open(os.path.join(run_dir, "plan.json"), "w") as f:
        json.dump(plan.to_dict(), f, indent=2)
    print(plan.render(), flush=True)
    log.info("plan:\n%s", plan.render())

    progress = ProgressLine(int(cfg.recipe.get("total_frames", 0)), enabled=bool(cfg.launcher.progress))
    try:
        result = execute(plan, cfg, run_dir, progress=progress, resumed=resumed)
    except (KeyboardInterrupt, Terminated, ServiceDied) as exc:  # every service is down by now
        _write_summary(run_dir, {
            "interrupted": not isinstance(exc, ServiceDied),
            "signal": "SIGINT" if isinstance(exc, KeyboardInterrupt) else getattr(exc, "signal_name", None),
            "failed": str(exc) if isinstance(exc, ServiceDied) else None,
            "frames": progress.frames, **{k: v for k, v in progress.metrics.items() if isinstance(v, (int, float))},
        })
        raise

    target = getattr(OmegaConf.to_object(cfg.recipe), "target_return", None)
    if cfg.launcher.plot:
        png = plot_learning_curve(result.get("curve", []), os.path.join(run_dir, "learning_curve.png"),
                                  title=f"{plan.recipe} on {plan.env_id} (seed {plan.seed})", target=target)
        result["learning_curve"] = png
    _write_summary(run_dir, {k: v for k, v in result.items() if k != "curve"})
    line = summary_line(plan.recipe, plan.env_id, result, run_dir)
    log.info(line)
    print(line, flush=True)
    return result


def _write_summary(run_dir: str, summary: dict) -> None:
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)


@hydra.main(version_base=None, config_path="pkg://conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    run_dir = HydraConfig.get().runtime.output_dir
    handle_sigterm()
    handle_preemption()  # in a submitit job: its preemption signal checkpoints and stops the run, then requeues
    try:
        launch(cfg, run_dir)
    except ConfigurationError as exc:
        print(f"configuration error: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_CONFIG)
    except ServiceDied as exc:
        _service_died(exc, run_dir)
    except KeyboardInterrupt as exc:
        if (died := _died_first(exc)) is not None:  # Ctrl-C while a dead service's run was winding down
            _service_died(died, run_dir, then="Ctrl-C arrived during the shutdown")
        print("interrupted: every service was shut down", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
    except Preempted as exc:
        then = ("resumes from the checkpoint" if cfg.launcher.checkpoint_every else
                "starts over: launcher.checkpoint_every=0 writes no checkpoint")
        print(f"preempted ({exc.signal_name}): every service was shut down; the job goes back to submitit to be "
              f"requeued (a requeued job {then})", file=sys.stderr, flush=True)
        exc.requeue()  # exits, or raises why the job is not requeued (it timed out max_num_timeout times)
    except Terminated as exc:
        if (died := _died_first(exc)) is not None:  # e.g. torchrun ends every rank once one of them died
            _service_died(died, run_dir, then="SIGTERM arrived during the shutdown")
        print("terminated (SIGTERM): every service was shut down", file=sys.stderr, flush=True)
        sys.exit(EXIT_TERMINATED)


def _died_first(exc: BaseException) -> ServiceDied | None:
    """The service death a signal interrupted the handling of (the shutdown it started), if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ServiceDied):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _service_died(exc: ServiceDied, run_dir: str, then: str = "") -> None:
    """One line naming the dead service (its traceback goes to launcher.log), then exit 3: the run's first failure
    decides the status, even when a signal arrived while the others were being shut down."""
    log.info("the run stopped: %s", exc, exc_info=exc)  # the whole story goes to launcher.log only
    others = f"{then}; every other service was shut down" if then else "every other service was shut down"
    print(f"error: {exc}; {others} (traceback: {os.path.join(run_dir, 'launcher.log')})", file=sys.stderr, flush=True)
    sys.exit(EXIT_SERVICE_DIED)


def normalize_argv(argv: list[str]) -> list[str]:
    """Accept ``+recipe=ppo`` as well as ``recipe=ppo`` (the defaults list already holds ``recipe: null``)."""
    out = []
    for arg in argv:
        if arg.startswith("+recipe=") or arg.startswith("++recipe="):
            arg = arg.lstrip("+")
        out.append(arg)
    return out


def main() -> None:
    """Entry point of ``python -m launcher``."""
    from .preflight import preflight

    sys.argv = [sys.argv[0], *normalize_argv(sys.argv[1:])]
    preflight(sys.argv[1:])  # a config that does not compose, or a value out of range: exit 2 before Hydra starts
    _hydra_main()
