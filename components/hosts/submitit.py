"""``submitit``: the target runs in a Slurm job (or in submitit's local subprocess), submitted through submitit.

Only collector workers take this placement (see the compatibility table): the hosts a collector launches together
go out as one job array. Each job connects back to the driver over TCP (``submitit.host``, 127.0.0.1 unless set:
on a cluster, an address of the driver's node that the compute nodes reach) and authenticates with the HMAC
challenge of `multiprocessing.connection`, on a random key that only the job's own pickled function carries
(in submitit's job folder, under the run directory). Nothing the driver receives is unpickled before that
challenge passed. Then the job runs the control loop of a ``process`` child: the driver's calls by message, the
answers back; everything the job reaches of the other services goes through their clients, which here are
``distributed`` or ``ray`` clients (the table and the plan's reachability check insist on it).

The driver waits for every job to connect within ``submitit.connect_timeout`` seconds (time in the queue
included). A job that ends before connecting, whose connection closes (``scancel``, a crash, a node lost: TCP
keep-alive notices within about 30 s) is a peer failure naming its Slurm job id, its state and its log file.
``shutdown`` asks by message, waits for the job to return, and cancels it if it has not within the deadline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import pickle
import secrets
import shutil
import socket
import subprocess
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

from transports.kernel.errors import ConfigurationError
from transports.kernel.options import bounded, check_instance
from transports.kernel.placements import Placement, Reach, register

from .base import Resources, RunSetting
from ._submitit_job import job_main, ray_cluster
from .connected import ConnectedHost
from .settings import settings_of

log = logging.getLogger(__name__)

@dataclasses.dataclass
class SubmititSettings:
    """``submitit.*`` in YAML: how targets placed on ``submitit`` (collector workers) are submitted, as one job array.

    Attributes:
        cluster: ``slurm`` (sbatch), or ``local`` (submitit's local subprocesses, on this machine).
        folder: submitit's job folder (scripts, pickled functions, logs); ``None``: ``<run dir>/submitit``.
        host: the address jobs connect back to (loopback unless set; on a cluster: one of the driver node's).
        connect_timeout: seconds for every job to connect, waiting in the queue included.
        partition: the Slurm partition (``None``: the cluster's default one).
        timeout_min: each collector job's time limit.
        mem_gb: each collector job's memory.
        job_name: the Slurm job name.
        setup: shell lines run before the job's Python (``module load ...``, activating an environment).
        slurm_additional_parameters: any other sbatch option, ``{"account": "rl"}``.
    """

    cluster: str = "slurm"
    folder: Optional[str] = None
    host: str = "127.0.0.1"
    connect_timeout: float = bounded(300.0, gt=0, unit="seconds")
    partition: Optional[str] = None
    timeout_min: int = bounded(60, ge=1, unit="minutes")
    mem_gb: float = bounded(2.0, gt=0, unit="GB")
    job_name: str = "rl_collector"
    setup: List[str] = dataclasses.field(default_factory=list)
    slurm_additional_parameters: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        check_instance(self, path="submitit")
        if self.cluster not in ("slurm", "local"):
            raise ConfigurationError(f"submitit.cluster must be 'slurm' or 'local', got {self.cluster!r}",
                                     path="submitit.cluster", alternatives=("slurm", "local"))
        # No check of this machine here: a dry run plans for a cluster it may not be on (see check_session).


class SlurmUnavailable(Exception):
    """``sinfo`` cannot be asked (not installed, or the controller does not answer)."""


def sinfo(fmt: str, run: Callable[..., Any] = subprocess.run, timeout: float = 30.0) -> str:
    """What ``sinfo --noheader --format=<fmt>`` prints.

    Raises:
        SlurmUnavailable: ``sinfo`` is not installed, fails, or does not answer within ``timeout`` seconds.
    """
    try:
        out = run(["sinfo", "--noheader", f"--format={fmt}"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmUnavailable(f"sinfo cannot run ({exc})") from None
    if out.returncode != 0:
        said = (out.stderr or out.stdout or "").strip().splitlines()
        raise SlurmUnavailable(f"sinfo failed: {said[-1] if said else f'exit status {out.returncode}'}")
    return out.stdout


def slurm_answers(path: str, instead: str, timeout: float = 10.0) -> None:
    """Return if a Slurm controller answers ``sinfo`` within ``timeout`` seconds, else refuse naming ``path``.

    Raises:
        ConfigurationError: ``sinfo`` is missing, fails or does not answer: what it said, and ``instead``.
    """
    try:
        sinfo("%P", timeout=timeout)
    except SlurmUnavailable as exc:
        raise ConfigurationError(f"no Slurm controller answers here ({exc}): run where Slurm is reachable, or "
                                 f"{instead}", path=path) from None


def check_sbatch() -> None:
    """Return if ``sbatch`` is on the PATH, else refuse naming ``submitit.cluster``.

    Raises:
        ConfigurationError: no ``sbatch`` on the PATH: run where Slurm is reachable, or ``submitit.cluster=local``.
    """
    if shutil.which("sbatch") is None:
        raise ConfigurationError("collectors on 'submitit' submit Slurm jobs, but no sbatch is on the PATH: run "
                                 "where Slurm is reachable, or set submitit.cluster=local to run the jobs as "
                                 "local subprocesses", path="submitit.cluster")


def job_parameters(settings: SubmititSettings, resources: Resources) -> dict[str, Any]:
    """submitit's parameters of one job: the host's ``resources`` (CPUs, GPUs) and ``submitit.*``."""
    params: dict[str, Any] = dict(timeout_min=settings.timeout_min, cpus_per_task=max(1, math.ceil(resources.num_cpus or 1)),
                                  mem_gb=settings.mem_gb, gpus_per_node=math.ceil(resources.num_gpus), nodes=1,
                                  tasks_per_node=1, name=settings.job_name)
    if settings.cluster == "slurm":
        params.update(slurm_partition=settings.partition, slurm_setup=list(settings.setup),
                      slurm_additional_parameters=dict(settings.slurm_additional_parameters))
    return {k: v for k, v in params.items() if v is not None}


def _settings(settings: Mapping[str, Any]) -> SubmititSettings:
    return settings_of(SubmititSettings, settings)


class _Session:
    """The submitit executor of one run and the hosts launched since the last submission (sent as one array)."""

    def __init__(self, settings: SubmititSettings, run_dir: str | None):
        self.settings = settings
        self.folder = os.path.abspath(settings.folder or os.path.join(run_dir or os.getcwd(), "submitit"))
        self.pending: list["SubmititHost"] = []
        self.lock = threading.Lock()

    def executor(self, resources: Resources):
        import submitit

        if self.settings.cluster == "slurm":
            check_sbatch()  # an owner built from Python, outside the launcher's check_here
        executor = submitit.AutoExecutor(folder=os.path.join(self.folder, "%j"), cluster=self.settings.cluster)
        executor.update_parameters(**job_parameters(self.settings, resources))
        return executor

    def submit_pending(self) -> None:
        """Submit every launched host not submitted yet: one job array (one job on ``local``)."""
        with self.lock:
            hosts, self.pending = self.pending, []
            if not hosts:
                return
            executor = self.executor(hosts[0].resources)
            ray_at = ray_cluster()
            with executor.batch():
                jobs = [executor.submit(job_main, pickle.dumps(h.factory, protocol=pickle.HIGHEST_PROTOCOL), h.address,
                                        h._key, h.name, ray_at) for h in hosts]
        for host, job in zip(hosts, jobs):
            host.job = job
            log.info("%s: submitted as %s job %s (log: %s)", host.name, self.settings.cluster, job.job_id,
                     job.paths.stderr)


_current = RunSetting(None)  # the run's _Session


class SubmititHost(ConnectedHost):
    """Runs the target in a submitit job that connects back to this host's listening socket."""

    placement = "submitit"
    process_memory_gb = 0.0  # its own job's memory (submitit.mem_gb), not the run's

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.job = None
        self._key = secrets.token_bytes(32)
        self._session = _current.value or _Session(SubmititSettings(), None)
        self.address: tuple[str, int] | None = None

    @classmethod
    @contextlib.contextmanager
    def session(cls, settings: Mapping[str, Any], *, run_dir: str | None = None) -> Iterator[None]:
        """The run's executor settings (``submitit.*``), checked before any owner starts."""
        with _current.holding(_Session(_settings(settings), run_dir)):
            yield

    @classmethod
    def check_session(cls, settings: Mapping[str, Any], placed: Mapping[str, Resources]) -> None:
        """``submitit.*`` as the session reads it, and with ``cluster=slurm`` an ``sbatch`` on the PATH and a
        controller that answers ``sinfo`` (else the jobs would be submitted to nothing, or not at all). Run where the
        plan runs, never by a dry run: a plan may be made on a machine that is not on the cluster."""
        if _settings(settings).cluster == "slurm":
            check_sbatch()
            slurm_answers("submitit.cluster", "set submitit.cluster=local to run the jobs as local subprocesses")

    @classmethod
    def on_run_machine(cls, settings: Mapping[str, Any]) -> bool:
        return False  # each target is a job of its own

    @classmethod
    def prepare(cls) -> None:
        """Nothing to warm up: the jobs start their own interpreters."""

    @classmethod
    def own_jobs(cls, settings: Mapping[str, Any], resources: Resources, count: int) -> str:
        s = _settings(settings)
        p = job_parameters(s, resources)
        kind = "Slurm" if s.cluster == "slurm" else "local submitit"
        array = f"one array, partition {s.partition or '(default)'}" if s.cluster == "slurm" else "one batch"
        return (f"{count} {kind} job{'s' if count > 1 else ''} ({array}), each cpus_per_task={p['cpus_per_task']} "
                f"mem_gb={p['mem_gb']:g} gpus_per_node={p['gpus_per_node']} timeout_min={p['timeout_min']} "
                "(submitit.*, resources)")

    # ------------------------------------------------------------------ start
    def _launch(self) -> None:
        self._server = socket.create_server((self._session.settings.host, 0))
        self.address = self._server.getsockname()[:2]
        with self._session.lock:
            self._session.pending.append(self)

    def wait_ready(self) -> None:
        self._session.submit_pending()  # the hosts launched with this one go out together, as one array
        self._connect(time.monotonic() + self._session.settings.connect_timeout, lambda: (
            f"{self._job_words()} did not connect within {self._session.settings.connect_timeout:g} s (state "
            f"{self._state()}; submitit.connect_timeout waits for the queue too)"))

    def _gone(self) -> str | None:
        return self._lost(" before connecting") if self.job is not None and self.job.done() else None

    def _lost(self, when: str = "") -> str:
        log_file = "" if self.job is None else f"; its log: {self.job.paths.stderr}"
        return f"{self.name}: {self._job_words()} ended ({self._state(settle=2.0)}){when}{log_file}"

    def _job_words(self) -> str:
        cluster = "Slurm" if self._session.settings.cluster == "slurm" else "local submitit"
        return f"the {cluster} job {self.job.job_id}" if self.job is not None else "its job (not submitted)"

    def _state(self, settle: float = 0.0) -> str:
        """The job's state as the cluster reports it, waiting up to ``settle`` seconds for it to leave RUNNING."""
        if self.job is None:
            return "not submitted"
        deadline = time.monotonic() + settle
        while True:
            try:
                state = self.job.get_info(mode="force").get("State") or self.job.state
            except Exception as exc:  # noqa: BLE001 - the cluster could not say: report that instead
                return f"unknown: {exc}"
            if state not in ("RUNNING", "PENDING", "UNKNOWN", "COMPLETING") or time.monotonic() >= deadline:
                return state
            time.sleep(0.25)

    # -------------------------------------------------------------- shutdown
    def _force_stop(self, budget: float) -> None:
        """Cancel the job unless it is done within ``budget`` seconds (a job never submitted is dropped)."""
        self._stopping = True
        with self._session.lock:
            if self in self._session.pending:
                self._session.pending.remove(self)
        if self.job is None:
            return
        deadline = time.monotonic() + budget
        while not self.job.done(force_check=True):
            if time.monotonic() >= deadline:
                self.job.cancel(check=False)
                log.info("%s: cancelled %s", self.name, self._job_words())
                return
            time.sleep(0.25)

    # ------------------------------------------------------------------ introspection
    @property
    def job_id(self) -> str | None:
        return None if self.job is None else str(self.job.job_id)


PLACEMENT = register(Placement("submitit", SubmititHost, Reach.NETWORK,
                                summary="collectors only: a Slurm job of its own (submitit)"))
