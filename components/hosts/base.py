"""The host protocol: one small host per placement runs one target where that placement puts it.

An owner supplies a *target factory*: a picklable callable that builds the heavy resource (a policy and its
serving loop, a replay storage, a logging SDK, a rollout worker) and is called where the placement puts it.
The host builds the target there, waits for the ready handshake (an error while building surfaces at
`Host.start`), runs the target's serving loop (its ``serve(stop)`` method, when it has one), carries
control calls to it (`Host.call`, `Host.submit`), watches it (``on_death`` is called once when it
dies unasked) and stops it within one deadline (``close()`` runs where the target lives).

A target is any object; the host looks for two optional methods:

- ``serve(stop: threading.Event) -> None``: the serving loop, run until ``stop`` is set;
- ``close() -> None``: release the resource, where it lives, after the loop returned.

Control calls run other methods of the target by name, one at a time, in order: on a thread of the target's
own (never on its serving loop), or in the caller for a target that lives there (``direct``).
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Dict, Mapping, Optional, Sequence

from transports.kernel.options import bounded, check_instance
from transports.segment_dir import shortage

from .nice import Niced, refuse_inline_nice

DEFAULT_STOP_TIMEOUT = 10.0


@dataclass
class Resources:
    """What one host may use and how it is supervised (``components.<name>.resources`` in YAML).

    ``num_cpus=None`` reserves no CPU (several owners then share a small machine; the OS schedules them);
    ``max_restarts`` restarts a crashed Ray actor (its interrupted calls are retried as many times) and a collector
    worker on any host (its interrupted rollout is retried);
    ``startup_timeout`` bounds scheduling plus construction on every host;
    ``nice`` lowers the scheduling priority of the owner's thread or process (see `Niced`): on a machine whose
    cores the learner keeps busy, collectors and their inference server at ``nice=19`` take only the cycles it leaves.
    """

    num_cpus: Optional[float] = bounded(None, ge=0)  # CPUs reserved for the owner (None: the placement's default)
    num_gpus: float = bounded(0.0, ge=0)  # GPUs reserved for the owner
    memory: Optional[int] = bounded(None, gt=0, unit="bytes")  # bytes of memory reserved (Ray)
    max_restarts: int = bounded(0, ge=0)  # times a crashed owner is restarted (Ray actors; collector workers anywhere)
    max_concurrency: int = bounded(1, ge=1)  # concurrent calls an actor serves (Ray)
    custom: Dict[str, float] = field(default_factory=dict)  # custom resources, e.g. {node_b: 1}
    startup_timeout: float = bounded(120.0, gt=0, unit="seconds")  # for the owner's thread, process or actor to be ready
    nice: int = bounded(0, ge=0, le=19)  # scheduling niceness of the owner's thread or process (19: only idle cycles)

    def __post_init__(self):
        check_instance(self, path="resources")

    @classmethod
    def of(cls, conf: Any) -> "Resources":
        """A `Resources` from ``None``, an instance, or a mapping / config node with its fields."""
        if conf is None:
            return cls()
        if isinstance(conf, cls):
            return conf
        get = conf.get if hasattr(conf, "get") else lambda k, d=None: getattr(conf, k, d)
        fields = {k: get(k) for k in cls.__dataclass_fields__ if get(k) is not None}
        if "custom" in fields:
            fields["custom"] = dict(fields["custom"])
        return cls(**fields)


class RunSetting:
    """A placement's settings for the run in progress: set by its host class's ``session``, read by its hosts (a
    host made outside any session sees ``default``).

    Examples:
        >>> _current = RunSetting(Settings())
        >>> with _current.holding(Settings(port=9000)):   # in session()
        ...     _current.value.port                       # in a host
        9000
    """

    def __init__(self, default: Any):
        self.value = default

    @contextlib.contextmanager
    def holding(self, value: Any):
        """Make ``value`` the setting inside the ``with`` block; the previous one comes back after it."""
        previous, self.value = self.value, value
        try:
            yield
        finally:
            self.value = previous


class Pending(ABC):
    """The answer to one `Host.submit`: ``ready(timeout)`` and ``result(timeout)``."""

    @abstractmethod
    def ready(self, timeout: float) -> bool:
        """Whether the answer (or the target's death) arrived within ``timeout`` seconds."""

    @abstractmethod
    def result(self, timeout: float | None = None) -> Any:
        """The method's result; raises its error (as `RemoteError` when it crossed a
        process boundary), `PeerFailureError` when the target died."""


class Done(Pending):
    """A `Pending` that is complete already (a call that ran in the caller)."""

    __slots__ = ("value", "error")

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.value, self.error = value, error

    def ready(self, timeout: float) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


class FuturePending(Pending):
    """A `Pending` over a future that has ``ready(timeout)`` and ``result(timeout)`` itself (an actor call's)."""

    __slots__ = ("future",)

    def __init__(self, future: Any):
        self.future = future

    def ready(self, timeout: float) -> bool:
        return self.future.ready(timeout)

    def result(self, timeout: float | None = None) -> Any:
        return self.future.result(timeout)


class Host(ABC):
    """Runs one target where a placement puts it. One subclass per placement, registered with its placement
    (``PLACEMENT = register(Placement(...))`` in its module, `transports.kernel.placements`).

    Args:
        name: names the thread, process or actor (shown by ``ps`` and in messages).
        factory: picklable callable building the target where the host runs it.
        resources: what the host may use (see `Resources`).
        on_death: called once, with the reason, when the target dies without being asked to stop.
        concurrency: calls the target must take at once (a Ray actor serving batched requests needs several).
        index: ``(position, count)`` of this host among its owner's hosts (a collector's workers): a worker rank.

    Attributes:
        placement: the placement this host implements.
        inline: the target lives in the caller's thread: no serving loop, the owner is its own client.
        same_process: the target shares the owner's process (and its memory).
        command_transport: the request/reply kind that carries commands to a target hosted here when its bulk
            payloads take a transport of their own (``distributed``).
        restarts_itself: the placement restarts a crashed target itself, up to ``resources.max_restarts`` times,
            and retries the interrupted calls (Ray); elsewhere the owner rebuilds the host where it can.
        process_memory_gb: memory of the process of its own a target hosted here runs in (where not
            ``same_process``), as a Slurm job reserves it (`launcher.slurm`).
        shares_memory: the target runs in another process of the caller's machine, always: results may be handed
            over through shared memory by name (collector rollouts, see `components.collectors.handoff`).
        may_share_memory: the target may run on the caller's machine or another (a cluster's node): it hands results
            over through shared memory where a probe finds the caller's shared memory
            (`components.collectors.handoff.SameMachine`).
    """

    placement: ClassVar[str] = ""
    inline: ClassVar[bool] = False
    same_process: ClassVar[bool] = False
    command_transport: ClassVar[str] = "queue"
    restarts_itself: ClassVar[bool] = False
    process_memory_gb: ClassVar[float] = 0.0
    shares_memory: ClassVar[bool] = False
    may_share_memory: ClassVar[bool] = False

    def __init__(self, name: str, factory: Callable[[], Any], *, resources: Resources | None = None,
                 on_death: Callable[[str], None] | None = None, concurrency: int = 1,
                 index: tuple[int, int] = (0, 1)):
        self.resources = resources or Resources()
        if self.resources.nice:
            refuse_inline_nice(type(self), self.resources)
            factory = Niced(factory, self.resources.nice, whole_process=not self.same_process)
        self.name, self.factory, self.index = name, factory, index
        self.on_death = on_death
        self.concurrency = concurrency
        self.death: str | None = None
        self._launched = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> "Host":
        """Build the target where the placement puts it; return once it is ready.

        Raises:
            RemoteError: building the target raised there (with its traceback text); or the builder's own
                exception, for hosts in the caller's process.
            PeerFailureError: the target died while starting.
            ServiceTimeoutError: not ready within ``resources.startup_timeout``.
        """
        self.launch()
        self.wait_ready()
        return self

    def launch(self) -> None:
        """Begin building the target without waiting (so several hosts can start at once)."""
        if self._launched:
            raise RuntimeError(f"{self.name}: the host was started already")
        self._launched = True
        self._launch()

    @abstractmethod
    def _launch(self) -> None: ...

    @abstractmethod
    def wait_ready(self) -> None:
        """Wait for the ready handshake of `launch` (see `start` for what it raises)."""

    @abstractmethod
    def submit(self, method: str, *args: Any) -> Pending:
        """Run ``method(*args)`` on the target without waiting for it."""

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        """Run ``method(*args)`` on the target and return its result (or raise its error here)."""
        return self.submit(method, *args).result(timeout)

    def begin_shutdown(self) -> None:
        """Ask the target to stop without waiting (so several hosts wind down at once)."""

    @abstractmethod
    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the target within ``timeout`` seconds (ask, then force). Idempotent."""

    @classmethod
    def prepare(cls) -> None:
        """Begin, without waiting, what this placement's first host would otherwise wait for (called as soon as a
        run knows it will use the placement). By default: nothing."""

    @classmethod
    def warm(cls, expected: "Sequence[tuple[Resources, int]]") -> None:
        """Begin starting, without waiting, the processes of the hosts a run will launch here (one per entry: its
        resources and the calls it must take at once), so that each host's launch takes one that is already up
        instead of starting its own. Called inside this placement's `session`, before the first owner starts;
        what is not taken is stopped with the session. By default: nothing."""

    @classmethod
    def check_resources(cls, resources: "Resources") -> None:
        """Refuse ``resources`` this placement cannot honour (called when the plan is made, before anything starts).
        By default: everything but a ``nice`` level for a target that runs in the caller's own thread.

        Raises:
            ConfigurationError: naming the field (``resources.<field>``).
        """
        refuse_inline_nice(cls, resources)

    @classmethod
    def winding_down(cls) -> None:
        """The run is ending on a signal, which may have reached this placement's own daemons too (a SIGTERM to the
        process group): from now on, wait only briefly for anything that may never answer. By default: nothing."""

    @classmethod
    def check_session(cls, settings: Mapping[str, Any], placed: Mapping[str, "Resources"]) -> None:
        """Refuse, when the plan is made and before anything starts, what this placement cannot do on this machine
        or cluster: session settings it cannot honour, or resources that nothing it reaches offers. ``settings`` as
        for `session`; ``placed``: each component placed here and its resources. By default: nothing.

        Raises:
            ConfigurationError: naming the setting (``ray.temp_dir``) or the component's field
                (``components.inference.resources.num_gpus``) and what to do.
        """

    @classmethod
    def session(cls, settings: Mapping[str, Any], *, run_dir: str | None = None) -> contextlib.AbstractContextManager:
        """What this placement needs around all of its hosts in a run (entered before the first owner starts,
        left after the last one stopped); ``settings`` is the config node named after the placement (``ray:``),
        ``run_dir`` the run's directory. By default: nothing."""
        return contextlib.nullcontext()

    @classmethod
    def on_run_machine(cls, settings: Mapping[str, Any]) -> bool:
        """Whether targets hosted here run on the machine of the run that starts them (so a Slurm job running the
        plan must hold them); ``settings`` as for `session`. By default: yes."""
        return True

    @classmethod
    def own_jobs(cls, settings: Mapping[str, Any], resources: "Resources", count: int) -> str | None:
        """What ``count`` targets hosted here ask a batch system for, in words, where each is a job of its own
        (printed by the dry run); ``settings`` as for `session`. By default: ``None`` (no jobs of their own)."""
        return None

    @classmethod
    def session_memory_gb(cls, settings: Mapping[str, Any]) -> float:
        """Memory of what this placement starts on the run's machine besides its targets (a forkserver, a local Ray
        cluster's daemons), as a Slurm job reserves it. By default: none."""
        return 0.0

    # ------------------------------------------------------------------ introspection
    @property
    @abstractmethod
    def is_alive(self) -> bool:
        """Whether the target was started, still runs (its thread, process, actor or job) and is not shutting down."""

    @property
    def pid(self) -> int | None:
        """The pid of the process the target lives in, where there is one to report."""
        return None

    @property
    def job_id(self) -> str | None:
        """The batch-system job the target runs in, where it has one of its own (``submitit``)."""
        return None

    @property
    def node_address(self) -> str | None:
        """The network address of the node the target runs on, where that may be another machine (a Ray node, a
        rank or job that connected back); ``None``: this machine."""
        return None

    @property
    def handle(self) -> Any:
        """The actor handle of a target in an actor (``None`` elsewhere)."""
        return None

    def _died(self, reason: str) -> None:
        if self.death is None:
            self.death = reason
            if self.on_death is not None:
                self.on_death(reason)


def exit_description(code: int | None) -> str:
    """How a process ended, in words: ``killed by SIGKILL`` for a negative exit code, ``exit code 1`` otherwise. A
    SIGBUS is said to be what it is on Linux, a page of shared memory that could not be backed, naming the segment
    directory and the room left there."""
    import signal

    if code is None:
        return "still running"
    if code == -signal.SIGBUS:
        return f"killed by SIGBUS: {shortage()}"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def shutdown_all(hosts, timeout: float | None = None) -> None:
    """Stop several hosts within one deadline: every one is asked first, then each is waited for."""
    import time

    timeout = DEFAULT_STOP_TIMEOUT if timeout is None else timeout
    deadline = time.monotonic() + timeout
    for host in hosts:
        host.begin_shutdown()
    for host in hosts:
        host.shutdown(max(0.1, deadline - time.monotonic()))


def run_serving_loop(target: Any, stop: threading.Event) -> None:
    """Run the target's ``serve(stop)``, or wait for ``stop`` when it has none."""
    serve = getattr(target, "serve", None)
    if serve is None:
        stop.wait()
    else:
        serve(stop)


def build_and_serve(factory: Callable[[], Any]) -> tuple[Any, threading.Event, threading.Thread | None]:
    """In an actor: build the target (torch on one thread), and run its serving loop on a thread when it has one.
    Returns the target, the event that stops the loop, and the loop's thread."""
    import torch

    torch.set_num_threads(1)
    target, stop = factory(), threading.Event()
    serving = None
    if getattr(target, "serve", None) is not None:
        serving = threading.Thread(target=run_serving_loop, args=(target, stop), name="serve", daemon=True)
        serving.start()
    return target, stop, serving


def close_target(target: Any) -> None:
    """Call the target's ``close()`` where it has one: what it holds is released where it lives."""
    close = getattr(target, "close", None)
    if close is not None:
        close()
