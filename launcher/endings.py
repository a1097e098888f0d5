"""How a run that stops ends: one line saying how, and its exit status (`launcher.conventions`), decided in one
place (`end_run`); and how ``python -m launcher`` then exits (`exit_now`).

A configuration mistake exits 2 (leaving no run directory), a service that died is one line naming it (exit 3, the
traceback in ``launcher.log``), a full disk is one line naming what could not be written (exit 4), Ctrl-C and SIGTERM
exit 130 and 143 once every service is down; in a submitit job its preemption signal requeues the job
(`launcher.requeue`). What is not an ending of ours (an error in the recipe or the launcher) is raised again.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from typing import NoReturn

from omegaconf import DictConfig

from transports.kernel.errors import ConfigurationError

from .conventions import EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_NO_SPACE, EXIT_SERVICE_DIED, EXIT_TERMINATED
from .failures import ServiceDied, Terminated, ending, in_chain, no_space
from .requeue import Preempted

log = logging.getLogger("launcher")


def end_run(exc: BaseException, cfg: DictConfig, run_dir: str) -> None:
    """Print how the run ended in one line and exit with its status; what is not an ending of ours (an error in the
    recipe or the launcher) is raised again (Python's traceback, exit 1)."""
    ending()
    if isinstance(exc, ConfigurationError):
        from .rundir import discard_unused

        discard_unused(run_dir)  # a refused run leaves no directory behind (its launcher.log closed first)
        print(f"configuration error: {exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_CONFIG)
    if isinstance(exc, ServiceDied):
        service_died(exc, run_dir)
    if isinstance(exc, KeyboardInterrupt):
        if (died := died_first(exc)) is not None:  # Ctrl-C while a dead service's run was winding down
            service_died(died, run_dir, then="Ctrl-C arrived during the shutdown")
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
        if (died := died_first(exc)) is not None:  # e.g. torchrun ends every rank once one of them died
            service_died(died, run_dir, then="SIGTERM arrived during the shutdown")
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


def quiet_when_full() -> None:
    """The handlers writing ``launcher.log`` drop a record they cannot write for want of space, instead of printing a
    traceback for each: the run's last line says the disk is full."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handleError = functools.partial(_drop_when_full, handler.handleError)


def _drop_when_full(handle_error, record: logging.LogRecord) -> None:
    if no_space(sys.exc_info()[1]) is None:
        handle_error(record)


def died_first(exc: BaseException) -> ServiceDied | None:
    """The service death a signal interrupted the handling of (the shutdown it started), if any."""
    return in_chain(exc, lambda e: isinstance(e, ServiceDied))


def service_died(exc: ServiceDied, run_dir: str, then: str = "") -> None:
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
    period after SIGTERM, and every service is down by then. Only the entry point calls it; `main` itself raises
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
