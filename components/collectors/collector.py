"""Collectors: environment instances and the rollout loop.

A collector steps vector environments against a policy (usually an inference client) and yields batches
shaped ``[time, env]``. Collectors take no transport of their own: policy calls go over the inference
endpoint's transport and, with a replay buffer attached, writes go over the replay endpoint's transport
(each worker writes its rollout straight into replay and only a completion count comes back).

Each worker (`Worker`) runs on the host of the collector's placement:
in the caller's thread (``direct``, one worker), on threads, in child processes (rollouts are written in place into
shared memory and handed over by index, see `handoff`; a crash surfaces in the driver
within 2 s with the worker's traceback text) or in Ray actors (rollouts return through the object store). With
``resources.max_restarts`` a worker whose process or actor died is restarted (Ray restarts its actors itself; other
hosts are rebuilt here, with fresh endpoints of the owners they were given) and the interrupted rollout retried;
a rollout that raised an error is never retried. Workers collect on
request, so with ``sync=True`` every batch is collected after the weights the learner pushed before asking.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Iterator

import gymnasium as gym
import torch
from tensordict import TensorDict, TensorDictBase

from transports.kernel.errors import ConfigurationError, PeerFailureError

from ..hosts import Done, shutdown_all
from ..resolution import Resolved
from ..service import Owner
from .config import CollectorConfig
from .handoff import Received, SameMachine
from .worker import Worker

log = logging.getLogger(__name__)

SEED_STRIDE = 10_000
"""Worker ``w`` seeds its envs from ``seed + w * SEED_STRIDE``: every worker (and env) differs."""


class Collector(Owner["Collector"]):
    """Steps vector envs with a policy and yields ``[time, env]`` batches of ``frames_per_batch`` frames.

    Args:
        config: where the workers run and what they collect (`CollectorConfig`:
            ``placement``, ``frames_per_batch`` (environment steps over all envs of all workers per yielded batch),
            ``total_frames`` (``-1``: until shut down), ``num_collectors`` (each worker collects an equal share),
            ``sync`` (``True``: each iteration gathers one rollout from every worker, concatenated along the env
            dimension; ``False``: each worker's rollout as soon as it is ready), ``env_groups`` (vector envs per
            worker, each from ``create_env_fn``, stepped in turn: with 2 one group's policy request is in flight while
            the other steps; an inference owner gives each group a client of its own)); ``None``: its defaults,
            which leave ``frames_per_batch`` unset (an error).
        create_env_fn: a picklable callable returning a vector env with same-step autoreset
            (see `components.envs.make_vector_env`); called where each worker lives, once per env group.
        policy: an inference owner (each worker then gets a client of its own, as ``process_slot`` needs) or
            a callable TensorDict policy (an inference client, a ``PolicyClientModule``...) shared by the
            workers; for ``process`` placement it must travel to worker processes (process clients do).
        replay_buffer: a replay owner (each worker gets its own client) or client; workers write their rollouts
            there and iteration yields frame counts. Process workers need the owner or one client each.
        seed: base seed (worker ``w`` uses ``seed + w * 10000``, env ``i`` of it ``+ i``).
        start_frames: frames collected before this collector started (a resumed run): they count toward
            ``total_frames``, and each env's sampling stream continues where it stopped (its episodes restart).
        resolved: the plan's resolution of this collector (it holds the config).

    Examples:
        >>> collector = Collector(CollectorConfig(frames_per_batch=256, total_frames=10_000),
        ...                       create_env_fn=partial(make_vector_env, "CartPole-v1", 8), policy=policy).start()
        >>> for batch in collector:
        ...     batch.batch_size
        torch.Size([32, 8])
    """

    component = "collector"

    def __init__(
        self,
        config: CollectorConfig | None = None,
        *,
        create_env_fn: Callable[[], gym.vector.VectorEnv],
        policy: Callable[[TensorDictBase], TensorDictBase],
        replay_buffer: Any = None,
        seed: int = 0,
        start_frames: int = 0,
        resolved: Resolved | None = None,
    ):
        super().__init__(config, resolved=resolved)
        c = self.config
        if c.frames_per_batch is None:
            raise ConfigurationError(f"{c.path}.frames_per_batch is not set: say how many frames each batch holds "
                                     "(a recipe sets it)", path=f"{c.path}.frames_per_batch")
        self.create_env_fn, self.policy = create_env_fn, policy
        self.frames_per_batch, self.total_frames, self.num_collectors = c.frames_per_batch, c.total_frames, \
            c.num_collectors
        self.replay_buffer, self.sync, self.seed, self.env_groups = replay_buffer, c.sync, seed, c.env_groups
        self.frames = start_frames
        self.hosts: list = []
        self._restarts: list[int] = []  # restarts done, per worker
        self._received = Received()  # rollouts handed over through shared memory (workers in other processes)
        self._same_machine: SameMachine | None = None  # the probe of workers that may share this machine
        self._spec = None

    def _worker(self, w: int) -> functools.partial:
        # an owner gives each worker its own endpoint; a client is shared (fine for threads; a cross-process
        # client copied into several worker processes is refused at its first call, see EndpointClaims)
        policy = [self.policy.client() for _ in range(self.env_groups)] if isinstance(self.policy, Owner) else self.policy
        replay = self.replay_buffer.client() if isinstance(self.replay_buffer, Owner) else self.replay_buffer
        # a worker made later (a restart) continues its sampling streams where the run is
        return functools.partial(Worker, self.create_env_fn, policy, self.frames_per_batch // self.num_collectors,
                                 self.seed + w * SEED_STRIDE, replay, self.frames // self.frames_per_batch,
                                 self.env_groups, self._handoff(), self.config.prefetch)

    def _handoff(self) -> bool | SameMachine:
        """What tells a worker to hand its rollouts over through shared memory: always where its placement keeps
        it on this machine, after a probe where it may be (a Ray actor on the local node)."""
        if self.host_type.shares_memory or not self.host_type.may_share_memory:
            return self.host_type.shares_memory
        if self._same_machine is None:
            self._same_machine = SameMachine()
        return self._same_machine

    @classmethod
    def hosts_of(cls, resolved: Resolved) -> tuple[int, ...]:
        return (1,) * resolved.config.num_collectors  # one host per worker

    def _launch(self) -> None:
        for w in range(self.num_collectors):  # launched together, then waited for: their start-ups overlap
            host = self._make_host(f"collector-{w}", self._worker(w), index=(w, self.num_collectors))
            self.hosts.append(host)
            self._restarts.append(0)
            host.launch()

    def _collect(self, w: int, pending) -> Any:
        """Worker ``w``'s rollout: the answer to ``pending``, or, when the worker died and may restart, the answer
        of a restarted worker asked again."""
        while True:
            try:
                return self._received.read(w, pending.result())
            except PeerFailureError as exc:
                host = self.hosts[w]
                if host.restarts_itself or self._restarts[w] >= self.resources.max_restarts:
                    raise
                self._restarts[w] += 1
                log.warning("collector-%d: %s; restarting it (%d of %d) and retrying its rollout", w, exc,
                            self._restarts[w], self.resources.max_restarts)
                host.shutdown(1.0)
                host = self.hosts[w] = self._make_host(f"collector-{w}", self._worker(w), index=(w, self.num_collectors))
                host.start()
                pending = self._ask(w)

    def _ask(self, w: int):
        """Ask worker ``w`` for a rollout (a worker found dead already answers with its death)."""
        try:
            return self.hosts[w].submit("collect")
        except PeerFailureError as exc:
            return Done(error=exc)

    def _finish(self) -> None:
        for host in self.hosts:
            host.wait_ready()
        self._spec = self.hosts[0].call("spec")

    def _shutdown(self, timeout: float | None) -> None:
        shutdown_all(self.hosts, timeout)  # the workers wind down together
        self._received.close()
        if self._same_machine is not None:
            self._same_machine.close()
            self._same_machine = None
        self.hosts = []

    def _alive(self) -> bool:
        return all(h.is_alive for h in self.hosts)

    def all_hosts(self) -> list:
        return list(self.hosts)

    def _client(self) -> "CollectorClient":
        return CollectorClient(self)

    @property
    def env_spec(self):
        """The environment's `EnvSpec`."""
        self._require_running()
        return self._spec

    # ------------------------------------------------------------------ domain operations
    def rollout(self) -> TensorDict | int:
        """Collect one batch (from every worker) and return it (or the frames written to replay)."""
        self._require_running()
        outs = [self._collect(w, pending) for w, pending in enumerate([self._ask(w) for w in range(len(self.hosts))])]
        out = sum(outs) if self.replay_buffer is not None else (outs[0] if len(outs) == 1 else torch.cat(outs, dim=1))
        self.frames += self.frames_per_batch
        return out

    def __iter__(self) -> Iterator[TensorDict | int]:
        if self.sync or self.inline:  # overlap needs workers that run apart from the caller
            while self.total_frames < 0 or self.frames < self.total_frames:
                yield self.rollout()
            return
        pending = [self._ask(w) for w in range(len(self.hosts))]
        per_worker = self.frames_per_batch // self.num_collectors
        w = -1
        while self.total_frames < 0 or self.frames < self.total_frames:
            w = _first_ready(pending, w)
            out = self._collect(w, pending[w])
            self.frames += per_worker
            pending[w] = self._ask(w)
            yield out
        for w, p in enumerate(pending):  # let the workers finish before shutdown
            self._collect(w, p)


class CollectorClient:
    """What a recipe iterates: batches (or replay write counts) from the collector's workers.

    Iteration is coordinated in the driver, so this view stays there: it refuses to be pickled (hand workers
    the inference and replay clients instead). It has no lifecycle methods.
    """

    def __init__(self, owner: Collector):
        self._owner = owner

    def __iter__(self):
        return iter(self._owner)

    def rollout(self):
        """Collect one batch from every worker (or, with a replay buffer, the frames written to it)."""
        return self._owner.rollout()

    @property
    def frames(self) -> int:
        """Frames collected so far."""
        return self._owner.frames

    @property
    def env_spec(self):
        """The environment's `EnvSpec`."""
        return self._owner.env_spec

    def __reduce__(self):
        raise TypeError("a collector client is iterated in the driver and cannot be pickled; "
                        "hand workers the inference and replay clients instead")


def _first_ready(pending: list, after: int) -> int:
    """The index of an answer that is ready (or failed), looking first at those after ``after``: every worker's
    answer is taken in turn, so a fast worker never hides a slow (or dead) one."""
    n = len(pending)
    order = [(after + 1 + i) % n for i in range(n)]
    while True:
        for w in order:
            if pending[w].ready(0.0):
                return w
        pending[order[0]].ready(0.005)
