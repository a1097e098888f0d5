"""Resume: where a resumed run continues and from what, the `Checkpoint` a recipe
gets, and the writes at the end of a run.

``launcher.checkpoint_every=N`` (frames; ``0``: no checkpoints) writes ``checkpoint.pt`` into the run directory
every ``N`` frames, and `launcher.run.execute` writes the last batch boundary's state when the recipe returns,
on Ctrl-C, SIGTERM and a submitit job's preemption signal, and when a service dies, before the services stop.
``launcher.resume=<run dir>`` (``auto``: this job's own run directory, a fresh start when it holds no checkpoint)
continues that run there: its services start where it stopped (frame count, weight-sync version, replay contents when
saved), the logger drops what was logged after the checkpoint, and the recipe restores its own state. A requeued
submitit job resumes its own checkpoint without being told (`launcher.requeue`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from transports.kernel.errors import ConfigurationError

from .. import requeue
from .checkpoint import Checkpoint
from .files import load

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"
"""The checkpoint's file name in the run directory."""


@dataclass(frozen=True)
class Resumed:
    """Where a run writes and what it continues from.

    Attributes:
        run_dir: the run directory: metrics, summary, learning curve and checkpoint go there.
        state: the checkpoint read there (see `launcher.checkpointing.files.load`); ``None``: a fresh start.
    """

    run_dir: str
    state: Mapping[str, Any] | None = field(default=None, repr=False)

    @property
    def frames(self) -> int:
        """Frames collected before this run started (0 for a fresh start)."""
        return int(self.state["frames"]) if self.state else 0

    @property
    def policy_version(self) -> int:
        """The weight-sync version the checkpointed weights had (0 for a fresh start)."""
        return int(self.state.get("policy_version") or 0) if self.state else 0

    def finished(self, total_frames: int | None) -> str | None:
        """Why the checkpointed run needs no more training (solved, or ``total_frames`` spent), or ``None``."""
        ended = self.state.get("finished") if self.state else None
        if not ended:
            return None
        if ended.get("solved"):
            return f"solved at {self.frames:,} frames"
        if total_frames is None or self.frames >= total_frames:
            return f"its budget of {total_frames:,} frames is spent" if total_frames else "it had finished"
        return None  # a larger budget now: training goes on


def resolve(plan: Any, own_dir: str) -> Resumed:
    """The run directory this invocation writes into, and the checkpoint it continues from.

    Inside a submitit job, ``launcher.resume`` unset resumes a checkpoint in its own run directory that this same job
    wrote (an earlier attempt, before a requeue: `launcher.requeue`), and starts afresh otherwise.

    Args:
        plan: the run's `LaunchPlan`: its ``launcher.resume``, and the recipe and environment
            it runs (a checkpoint of another one is refused).
        own_dir: this invocation's own run directory (Hydra's output directory).

    Raises:
        ConfigurationError: ``launcher.resume`` names no directory, one without a checkpoint, an unreadable
            checkpoint, or one of another recipe or environment (before anything starts).
    """
    where, recipe, env_id = plan.launcher.resume, plan.recipe, plan.env_id
    job = requeue.job_id()
    if where is None and job is None:
        return Resumed(own_dir)
    if where in (None, "auto"):  # a requeued job: its own directory, if an earlier attempt checkpointed there
        run_dir = os.path.abspath(own_dir)
        if not os.path.exists(os.path.join(run_dir, CHECKPOINT)):
            return Resumed(own_dir)
    else:
        run_dir = os.path.abspath(os.path.expanduser(str(where)))
        if not os.path.isdir(run_dir):
            raise ConfigurationError(f"launcher.resume={where!r} is not a directory: name the run directory to resume "
                                     "(it holds checkpoint.pt), or auto", path="launcher.resume")
        if not os.path.exists(os.path.join(run_dir, CHECKPOINT)):
            raise ConfigurationError(f"{run_dir} holds no {CHECKPOINT}: a run writes checkpoints with "
                                     "launcher.checkpoint_every=<frames> (0, the default, writes none)",
                                     path="launcher.resume")
    try:
        state = load(os.path.join(run_dir, CHECKPOINT))
    except ValueError as exc:
        raise ConfigurationError(str(exc), path="launcher.resume") from None
    saved = state.get("run") or {}
    if where is None and saved.get("job") != job:  # not written by this submitit job: another run's, not resumed
        log.warning("%s holds a checkpoint of submitit job %s, not of this job (%s): starting afresh", run_dir,
                    saved.get("job"), job)
        return Resumed(own_dir)
    for what, now in (("recipe", recipe), ("env", env_id)):
        if saved.get(what) not in (None, now):
            raise ConfigurationError(f"the checkpoint in {run_dir} is of {what} {saved[what]!r}, not {now!r}",
                                     path="launcher.resume")
    return Resumed(run_dir, state)


def changed_settings(resumed: Resumed, plan: Any) -> list[str]:
    """The recipe settings that differ from the checkpointed run's, as ``name: old -> new``."""
    before = (resumed.state or {}).get("run", {}).get("recipe_config") or {}
    now = _recipe_config(plan)
    return [f"{k}: {before[k]!r} -> {now.get(k)!r}" for k in sorted(before) if before[k] != now.get(k)]


def checkpoint_for(plan: Any, resumed: Resumed, clients: Mapping[str, Any]) -> Checkpoint:
    """The recipe's `Checkpoint`: it writes ``checkpoint.pt`` in the run directory every
    ``launcher.checkpoint_every`` frames (none at 0), flushing the logger first, with the replay buffer's contents
    when ``launcher.checkpoint_replay`` is set; it hands back the resumed state."""
    settings = plan.launcher
    every = int(settings.checkpoint_every)
    run = {"recipe": plan.recipe, "env": plan.env_id, "recipe_config": _recipe_config(plan), "job": requeue.job_id()}
    extras = {"run": lambda: run}
    if settings.checkpoint_replay:
        extras["replay"] = clients["replay"].state_dict
    return Checkpoint(os.path.join(resumed.run_dir, CHECKPOINT) if every else None, every, restored=resumed.state,
                      extras=extras, before_write=clients["logger"].flush)


def restore_services(resumed: Resumed, clients: Mapping[str, Any]) -> None:
    """Put the replay contents a checkpoint holds back into the (new, empty) replay buffer."""
    contents = (resumed.state or {}).get("replay")
    if contents is not None:
        clients["replay"].load_state_dict(contents)
        log.info("replay restored: %d transitions", int(contents.get("size", 0)))


def save(checkpoint: Checkpoint, why: str, finished: Mapping[str, Any] | None = None) -> None:
    """Write the last snapshot; a failure is reported, never raised (the run's own ending comes first)."""
    try:
        checkpoint.save(finished=finished)
    except Exception as exc:  # noqa: BLE001 - the previous checkpoint stays; say why this one is missing
        log.warning("no checkpoint written %s: %s: %s (the previous one, if any, is intact)", why,
                    type(exc).__name__, exc)


def saved_summary(run_dir: str) -> dict:
    """The ``summary.json`` a finished run left (empty if there is none)."""
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def _recipe_config(plan: Any) -> dict:
    return {} if plan.recipe_config is None else dataclasses.asdict(plan.recipe_config)
