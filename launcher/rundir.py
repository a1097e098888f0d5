"""A run directory of every run's own.

Hydra names a run's directory after the second it started (``outputs/<date>/<time>``), so two runs started in the
same second would write into one directory: interleaved metrics, one summary over the other. Two guards keep that
from happening:

- `own_run_dir`, before Hydra starts: a command line that runs one job in the default directory gets that
  directory if no run has made it yet, else the first free ``<dir>-2``, ``<dir>-3``... (made here, atomically), and
  passes it on to Hydra as ``hydra.run.dir`` (a sweep in the default sweep directory likewise, as ``hydra.sweep.dir``).
- `RunDirLock`, while the run writes: an exclusive lock on ``<run dir>/.lock`` (``flock``: the system drops it
  when the process ends, however it ends). A run told to write into a directory that a live run holds (the same
  ``hydra.run.dir``, or ``launcher.resume`` of a run still going) is refused before it writes anything there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

from transports.kernel.errors import ConfigurationError

LOCK = ".lock"
"""The lock file's name in the run directory (it holds the pid of the run that writes there)."""


def unique(path: str) -> str:
    """``path`` if nobody has made it yet, else the first of ``path-2``, ``path-3``... that nobody has: made here
    (``os.mkdir`` fails on a directory that exists, so two processes never get the same one)."""
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    candidate, n = path, 1
    while True:
        try:
            os.mkdir(candidate)
            return candidate
        except FileExistsError:
            n += 1
            candidate = f"{path}-{n}"


MADE_HERE: set[str] = set()
"""The run directories this command line makes (absolute): the only ones a refused run removes again."""


def own_run_dir(argv: list[str]) -> list[str]:
    """``argv`` with ``hydra.run.dir=`` a directory of this run's own added, where the command line runs one job in
    the default run directory (``hydra.sweep.dir=`` for a sweep in the default sweep directory); else ``argv`` as it
    is (a directory the user chose, a command line the preflight leaves to Hydra)."""
    from .conventions import normalize_argv
    from .preflight import config_dir_override, hydra_args, compose, sweep_jobs

    args = hydra_args(argv)
    if args is None or args.config_path or args.config_name:
        return argv
    key = "hydra.sweep.dir" if args.multirun else "hydra.run.dir"
    chosen = any(o.split("=", 1)[0].lstrip("+~") == key for o in args.overrides)
    try:
        jobs = sweep_jobs(argv)
        if jobs is None or (len(jobs) != 1 and not args.multirun):
            return argv
        overrides = normalize_argv(list(args.overrides))
        if args.multirun:  # Hydra's settings, with the first job's (a sweep's values do not compose as one config)
            overrides = [*jobs[0], *(o for o in overrides if o.lstrip("+~").startswith(("hydra.", "hydra/")))]
        cfg = compose([*overrides, *config_dir_override(argv)], hydra=True)
        path = str(cfg.hydra.sweep.dir if args.multirun else cfg.hydra.run.dir)
    except Exception:  # noqa: BLE001 - a command line Hydra will refuse: it says why, in its own words
        return argv
    if not args.multirun and cfg.distributed.ranks == "env" and int(os.environ.get("RANK") or 0) >= 1:
        return argv  # a worker rank torchrun or srun started: it serves the driver and writes no run of its own
    if chosen:  # the user's own directory: this run's to remove if refused only where it does not exist yet
        if not os.path.exists(path):
            MADE_HERE.add(os.path.abspath(path))
        return argv
    path = unique(path)  # a sweep's too: its jobs' directories go with it if refused
    MADE_HERE.add(os.path.abspath(path))
    return [*argv, f"{key}={path}"]


_STARTED = {".hydra": {"config.yaml", "hydra.yaml", "overrides.yaml"}, "launcher.log": None, LOCK: None}
"""What a run directory holds before a run has written anything of its own: Hydra's records and the launcher's log."""


def discard_unused(run_dir: str) -> bool:
    """Remove a run directory that this command line made (`MADE_HERE`; a job's directory below a sweep directory
    made here) and that holds nothing but what Hydra writes when a job starts (a run refused for a configuration
    mistake leaves no directory behind), then its parents that are left empty (a sweep's with only its
    ``multirun.yaml``), up to the working directory. Any other directory is kept as it is. Returns whether it was
    removed."""
    import shutil

    where = os.path.abspath(run_dir)
    # a job of a sweep made here: its directory is below the sweep's, deeper than one level where an override's
    # value holds a "/" (env.id=ALE/Pong-v5 names the job's directory "0_env.id=ALE/Pong-v5")
    sweep = next((p for p in _ancestors(where) if p in MADE_HERE), None)
    if (where not in MADE_HERE and sweep is None) or where == os.path.abspath(os.getcwd()) \
            or os.path.abspath(os.getcwd()).startswith(where.rstrip(os.sep) + os.sep):
        return False
    try:
        entries = set(os.listdir(run_dir))
        if not entries <= set(_STARTED) or not set(os.listdir(os.path.join(run_dir, ".hydra"))
                                                    if ".hydra" in entries else ()) <= _STARTED[".hydra"]:
            return False
        if LOCK in entries and _held(os.path.join(run_dir, LOCK)):
            return False  # a live run writes here
        _close_logs_in(run_dir)
        shutil.rmtree(run_dir)
    except OSError:
        return False
    stop, parent = os.path.abspath(os.getcwd()), os.path.dirname(where)
    while parent.startswith(stop + os.sep):
        with contextlib.suppress(OSError):
            if parent == sweep and os.listdir(sweep) == ["multirun.yaml"]:  # no other job of the sweep ran
                os.unlink(os.path.join(sweep, "multirun.yaml"))
        try:
            os.rmdir(parent)  # only an empty one
        except OSError:
            break
        parent = os.path.dirname(parent)
    return True


def _ancestors(path: str) -> list[str]:
    """The directories above ``path`` (absolute), nearest first."""
    found, parent = [], os.path.dirname(path)
    while parent != os.path.dirname(parent):
        found.append(parent)
        parent = os.path.dirname(parent)
    return found


def _close_logs_in(run_dir: str) -> None:
    """Close and detach the logging handlers that write into ``run_dir`` (Hydra's ``launcher.log``)."""
    import logging

    inside = os.path.abspath(run_dir) + os.sep
    for logger in [logging.getLogger(), *(lg for lg in logging.Logger.manager.loggerDict.values()
                                         if isinstance(lg, logging.Logger))]:
        for handler in list(logger.handlers):
            if os.path.abspath(getattr(handler, "baseFilename", "")).startswith(inside):
                logger.removeHandler(handler)
                handler.close()


def _held(lock_file: str) -> bool:
    fd = os.open(lock_file, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


class RunDirLock:
    """Holds ``<run_dir>/.lock`` exclusively until `release` (or the process's end).

    Args:
        run_dir: the directory the run writes into (made if missing).
        path: the config path that chose it, for the message.

    Raises:
        ConfigurationError: a live run holds the directory (naming it, its pid and ``path``).
    """

    def __init__(self, run_dir: str, path: str = "hydra.run.dir"):
        os.makedirs(run_dir, exist_ok=True)
        self.run_dir = run_dir
        self._fd: int | None = os.open(os.path.join(run_dir, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(self._fd)
            self._fd = None
            raise ConfigurationError(
                f"{run_dir} is the run directory of a run still in progress (pid {holder}): give this run a directory "
                "of its own (leave hydra.run.dir unset, or name another), or wait for that run to end",
                path=path) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        """Let another run write here (idempotent); the lock file stays."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
