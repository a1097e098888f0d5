"""A run inside a submitit job (``hydra/launcher=slurm`` or ``local``, or the plugin's own options): a preempted or
timing-out job writes its checkpoint, is requeued, and the requeued job resumes from that checkpoint.

submitit binds its preemption signal (``SIGUSR2``, or the one ``SUBMITIT_PREEMPT_SIGNAL`` names) to a handler that
requeues the job at once: it calls the job's ``checkpoint()`` (hydra-submitit-launcher's: the same job again), runs
``scontrol requeue`` unless the job timed out more than ``max_num_timeout`` times, and exits. Slurm sends that signal
``signal_delay_s`` seconds before the time limit; ``scancel --signal=USR2 <job>`` sends it by hand (a preemption).
`handle_preemption` puts `Preempted` in front of it: raised in the main thread, it unwinds the run as
SIGTERM does, so the last batch boundary's checkpoint is written while the services still run and they stop in
order. Only then does `Preempted.requeue` call submitit's handler.

The requeued job has the same submitit job id and runs in the same Hydra run directory (the sweep directory's
timestamp and the job's overrides travel in the pickled job). Each checkpoint records the job that wrote it, and a
job whose run directory holds a checkpoint of its own id resumes it (`launcher.checkpointing.resolve`), as
``launcher.resume=auto`` would: a requeue by submitit, by Slurm's own preemption or after a node failure alike.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any, Callable

from .failures import Terminated

log = logging.getLogger(__name__)


class Preempted(Terminated):
    """submitit's preemption signal arrived (a preemption, or the time limit ``signal_delay_s`` away): raised in the
    main thread like `Terminated`, so the run writes its checkpoint and shuts down.

    Attributes:
        signal_name: the signal (``SIGUSR2``).
    """

    def __init__(self, signal_name: str, handler: Callable[[int, Any], Any], signum: int):
        super().__init__(signal_name)
        self.signal_name, self._handler, self._signum = signal_name, handler, signum

    def requeue(self) -> None:
        """Hand the job back to submitit once every service is down: it requeues the job and exits (``SystemExit``),
        or raises ``submitit.core.utils.UncompletedJobError`` saying why not (timed out too many times)."""
        # Slurm's requeue ends this job with SIGTERM at once: nothing is left to stop, so it must not cut the
        # requeue short with Terminated.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self._handler(self._signum, None)


def job_id() -> str | None:
    """The submitit job this process runs (Slurm: ``<job>`` or ``<array job>_<task>``); ``None`` outside one."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    import submitit

    return str(submitit.JobEnvironment().job_id)


def handle_preemption() -> None:
    """In a submitit job, turn its preemption signal into `Preempted` in the main thread (call it there).

    Only the first signal raises: a second one (Slurm may repeat it) is logged, so it cannot interrupt the
    checkpoint being written. Outside a submitit job, or where submitit bound no handler, nothing changes.
    """
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return
    import submitit

    signum = getattr(signal, f"SIG{submitit.JobEnvironment.USR_SIG}", None)
    submitits = signal.getsignal(signum) if signum is not None else None
    if not callable(submitits):
        return

    def raise_preempted(signum, frame):
        name = signal.Signals(signum).name
        log.warning("%s: the job is preempted or about to time out; it checkpoints, stops, and goes back to "
                    "submitit to be requeued", name)
        signal.signal(signum, lambda signum, frame: log.warning("%s again: already stopping", name))
        raise Preempted(name, submitits, signum)

    signal.signal(signum, raise_preempted)
