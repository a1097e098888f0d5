"""What makes a test ``slow``: the start-ups that cost seconds each. A test that does one of these must be marked
``slow``, so the quick loop (``python -m pytest -m "not slow"``) stays within its budget; :func:`guard` enforces it:
in a test not marked ``slow`` each of these entry points fails the test at once, naming what it started.

- a fresh Python interpreter of ours: ``python -m launcher`` or any ``sys.executable`` subprocess, ``torchrun``,
  a multiprocessing child started with ``spawn`` (the ``process`` placement's forkserver children are forks of a
  warm server: milliseconds, allowed);
- a Ray cluster or a Ray actor;
- a Monarch proc, an rpc world, a worker rank (``distributed``), a submitit job, a Slurm command (``sbatch``...).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Callable

import pytest

ENTRY_POINTS: tuple[tuple[str, str], ...] = (
    ("components.hosts.ray.ray_cluster", "a Ray cluster"),
    ("components.hosts.ray.RayHost._launch", "a Ray actor"),
    ("components.hosts.monarch.MonarchHost._launch", "a Monarch proc"),
    ("components.hosts.rpc.RpcHost._launch", "an rpc world"),
    ("components.hosts.distributed.DistributedHost._launch", "a worker rank"),
    ("components.hosts.submitit.SubmititHost._launch", "a submitit job"),
    ("multiprocessing.popen_spawn_posix.Popen._launch", "a spawned interpreter"),
)
"""``module.attribute`` -> what calling it starts."""

SLURM_COMMANDS = ("sbatch", "srun", "salloc", "scancel", "scontrol")


def _what_a_command_starts(args: Any) -> str | None:
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args or [])
    if not argv:
        return None
    program = os.path.basename(str(argv[0]))
    if str(argv[0]) == sys.executable or program.startswith("python"):
        return "a subprocess launcher" if "launcher" in map(str, argv[1:3]) else "a Python subprocess"
    if program == "torchrun":
        return "torchrun ranks"
    if program in SLURM_COMMANDS:
        return f"a Slurm command ({program})"
    return None


def guard(monkeypatch: pytest.MonkeyPatch, nodeid: str) -> None:
    """Make every start-up of :data:`ENTRY_POINTS` and every expensive subprocess fail the test ``nodeid``."""

    def refuse(what: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            pytest.fail(f"{nodeid} starts {what} but is not marked slow: mark it @pytest.mark.slow (it costs seconds; "
                        "the quick loop must not)", pytrace=False)
        return refused

    for target, what in ENTRY_POINTS:
        monkeypatch.setattr(target, refuse(what))
    popen_init = subprocess.Popen.__init__

    def checked_init(self: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
        what = _what_a_command_starts(args)
        if what is not None:
            refuse(what)()
        popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", checked_init)
