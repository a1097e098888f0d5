"""``AsyncBatchedCollector``: env workers that never wait for each other, against one batched inference server.

Each env worker (on a thread, or in a process: the collector's placement) holds several env groups (each one
``create_env_fn()`` vector env) and keeps one policy request in flight per group; the one server batches whatever
requests wait, from all workers, into one forward pass. A worker writes its transitions in place into a ring of
shared rollout slots (chunks of ``chunk_steps`` steps of all its envs, see `handoff`)
and announces each full slot by index; the driver copies slots out into flat batches of ``frames_per_batch``
transitions, each carrying ``env_id`` and the ``policy_version`` that chose its action, and frees them. Nothing is
pickled per transition; a worker waits only when all its slots are full (the consumer is behind). The server is
created from a policy factory (placed with the envs, its transport resolved by the table's ``auto`` rule for
workers with one request in flight per endpoint, its layouts taken from the env spec and a probe of the policy),
or given as a running owner.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import queue
import threading
from typing import Callable, Iterator

import torch
from tensordict import TensorDict

from transports.kernel.errors import ConfigurationError, PeerFailureError
from transports.sync import Semaphore

from ..envs import spec_from_spaces
from ..hosts import shutdown_all
from ..inference import InferenceServer, InferenceServerConfig
from ..resolution import Resolved, resolve_component
from ..service import Owner
from .config import CollectorConfig
from .handoff import Handoff, Received, RolloutSlots
from .worker import Worker


class EnvLoop:
    """One env worker: rollouts of ``chunk_steps`` steps into its slots, announced on ``out``, until stopped.

    Args:
        worker: its index (named in what it announces).
        free: counts this worker's free slots (the driver releases one per slot it copied out).
        others: as `Worker` (``frames``: one chunk of all its envs).
    """

    def __init__(self, create_env_fn, policies, frames: int, seed: int, groups: int, worker: int, out, free,
                 num_slots: int):
        self.worker = Worker(create_env_fn, policies, frames, seed, env_groups=groups)
        self.index, self.out, self.free, self.num_slots = worker, out, free, num_slots
        self.slots: RolloutSlots | None = None

    def serve(self, stop: threading.Event) -> None:
        """Collect rollouts into free slots and announce each until ``stop`` is set.

        The first rollout shows the layout, so the shared slots are made after it and travel with its announcement.
        """
        slot = 0
        try:
            while not stop.is_set():
                if not self.free.acquire(timeout=0.1):  # every slot full: the consumer is behind
                    continue
                if self.slots is None:  # the first chunk shows the layout: the slots are made after it
                    first = self.worker.rollout()
                    self.slots = RolloutSlots(first, self.num_slots)
                    self.slots.slot(0).update_(first)
                    self.out.put((self.index, Handoff(0, self.slots)))
                else:
                    self.worker.rollout(into=self.slots.slot(slot))
                    self.out.put((self.index, Handoff(slot)))
                slot = (slot + 1) % self.num_slots
        except PeerFailureError:
            if not stop.is_set():  # the server stopped first during shutdown: not an error
                raise

    def close(self) -> None:
        """Close the worker's environments and this process's view of the slots."""
        self.worker.close()
        if self.slots is not None:
            self.slots.close()
        if hasattr(self.out, "cancel_join_thread"):
            # at shutdown nobody reads the announcements still buffered: exit without waiting to flush them
            self.out.cancel_join_thread()


class AsyncBatchedCollector(Owner["AsyncBatchedCollector"]):
    """An env pool stepping asynchronously against an inference server.

    Args:
        config: where the env workers run and what a batch is (`CollectorConfig`):
            ``placement`` ``thread`` or ``process`` (``None``: ``thread``; a server created here is placed alike),
            ``frames_per_batch`` (transitions per yielded batch, required) and ``total_frames`` (stop after this many
            frames; ``-1``: never).
        create_env_fn: picklable callable returning a vector env with same-step autoreset (one env group; see
            `components.envs.make_vector_env`, e.g. ``num_envs=1``: one request per env).
        num_groups: env groups (``create_env_fn()`` vector envs) in all, split evenly over the workers.
        policy_factory: builds the policy for a server created here (exclusive with ``server``).
        server: a running inference owner to use instead.
        server_config: batching settings of a server created here.
        seed: base seed; env ``i`` (over all groups) gets ``seed + i``.
        num_workers: threads or processes stepping the groups (default: one per core but one, which the server
            takes; at most ``num_groups``).
        chunk_steps: steps of all of a worker's envs per slot (what a worker hands over at once).
        num_slots: slots per worker: how far a worker may run ahead of the consumer.
        resolved: the plan's resolution of the collector (it holds the config).

    Raises:
        ConfigurationError: not exactly one of ``policy_factory`` and ``server``, no ``frames_per_batch``, a
            placement other than ``thread`` or ``process``, or worker counts that do not split the groups.
    """

    component = "collector"

    def __init__(self, config: CollectorConfig | None = None, *, create_env_fn: Callable, num_groups: int,
                 policy_factory: Callable | None = None, server: InferenceServer | None = None,
                 server_config: InferenceServerConfig | None = None, seed: int = 0, num_workers: int | None = None,
                 chunk_steps: int = 16, num_slots: int = 4, resolved: Resolved | None = None):
        if (policy_factory is None) == (server is None):
            raise ConfigurationError("AsyncBatchedCollector needs exactly one of policy_factory or server")
        config = CollectorConfig() if config is None else config
        if resolved is None and config.placement is None:  # env workers step apart from the driver by default
            config = dataclasses.replace(config, placement="thread")
        super().__init__(config, resolved=resolved)
        if not hasattr(self.host_type, "make_queue") or self.inline:
            raise ConfigurationError(f"env workers cannot run on {self.placement!r}",
                                     path=f"{self.config.path}.placement", alternatives=("thread", "process"))
        frames_per_batch, total_frames = self.config.frames_per_batch, self.config.total_frames
        if frames_per_batch is None:
            raise ConfigurationError(f"{self.config.path}.frames_per_batch is not set: say how many transitions each "
                                     "batch holds", path=f"{self.config.path}.frames_per_batch")
        workers = num_workers or max(1, min(num_groups, (os.cpu_count() or 2) - 1))
        while num_groups % workers:  # the default: the most workers (a core each, one core left to the server) that
            # split the groups evenly
            if num_workers is not None:
                raise ConfigurationError(f"num_workers={num_workers} does not divide num_groups={num_groups}",
                                         path="num_workers")
            workers -= 1
        for name, value in (("chunk_steps", chunk_steps), ("num_slots", num_slots)):
            if value < 1:
                raise ConfigurationError(f"{name} must be >= 1, got {value}", path=name)
        self.create_env_fn, self.num_groups, self.num_workers = create_env_fn, num_groups, workers
        self.chunk_steps, self.num_slots = chunk_steps, num_slots
        self.frames_per_batch, self.total_frames, self.seed = frames_per_batch, total_frames, seed
        self.policy_factory, self.server = policy_factory, server
        self.server_config = server_config or InferenceServerConfig(max_batch_size=num_groups)
        self.frames = 0
        self.hosts: list = []
        self._own_server: InferenceServer | None = None
        self._out = None
        self._free: list = []
        self._received = Received()
        self._env_ids: list = []
        self._spare: list = []  # transitions of the last chunk that did not fit the previous batch

    def _spec(self):
        env = self.create_env_fn()
        try:
            spec = spec_from_spaces(env.spec.id if env.spec else "env", env.single_observation_space,
                                    env.single_action_space)
            return spec, env.num_envs
        finally:
            env.close()

    def _make_server(self, spec, group_envs: int) -> InferenceServer:
        request = spec.request_layout(group_envs)
        probe = self.policy_factory()
        with torch.no_grad():
            out = probe(request.zeros())
        out.set("policy_version", torch.zeros(out.batch_size, dtype=torch.long))
        layouts = {"request": request.zeros(), "response": out.exclude(*request.keys)}
        # the table's auto rule picks the transport for env groups that keep one request in flight each
        config = dataclasses.replace(self.server_config, placement=self.placement)
        resolved = resolve_component("inference", self.placement, "auto", layouts=layouts, one_request_per_worker=True,
                                     config=config)
        return InferenceServer(config, policy_factory=self.policy_factory, resolved=resolved)

    def _launch(self) -> None:
        spec, group_envs = self._spec()
        if self.server is None:
            self._own_server = self._make_server(spec, group_envs).start()
        server = self.server or self._own_server
        groups = self.num_groups // self.num_workers
        worker_envs = groups * group_envs
        self._out = self.host_type.make_queue(self.num_workers * (self.num_slots + 1))  # never full
        for w in range(self.num_workers):
            free = Semaphore(self.num_slots)
            self._free.append(free)
            self._env_ids.append(torch.arange(w * worker_envs, (w + 1) * worker_envs).expand(self.chunk_steps, -1))
            host = self._make_host(f"env-{w}", functools.partial(
                EnvLoop, self.create_env_fn, [server.client() for _ in range(groups)], self.chunk_steps * worker_envs,
                self.seed + w * worker_envs, groups, w, self._out, free, self.num_slots), index=(w, self.num_workers))
            self.hosts.append(host)
            host.launch()

    def _finish(self) -> None:
        for host in self.hosts:
            host.wait_ready()

    def _shutdown(self, timeout: float | None) -> None:
        for host in self.hosts:
            host.begin_shutdown()
        for free in self._free:  # a worker waiting for a slot sees the stop within its poll
            free.release()
        _drain(self._out)
        shutdown_all(self.hosts, timeout)
        self.hosts = []
        self._received.close()
        if self._own_server is not None:
            self._own_server.shutdown(timeout)
        if hasattr(self._out, "cancel_join_thread"):
            self._out.close()
            self._out.cancel_join_thread()

    def _alive(self) -> bool:
        return all(h.is_alive for h in self.hosts)

    def all_hosts(self) -> list:
        own = self._own_server.all_hosts() if self._own_server is not None else []
        return list(self.hosts) + own

    def _client(self):
        return self

    def __reduce__(self):
        raise TypeError("an AsyncBatchedCollector is iterated in the driver and cannot be pickled")

    def _next_chunk(self) -> TensorDict:
        """The next full slot of any worker, copied out and freed, flattened to transitions with ``env_id``."""
        while True:
            try:
                w, handoff = self._out.get(timeout=0.2)
                break
            except queue.Empty:
                pass
            for host in self.hosts:
                if not host.is_alive:
                    raise PeerFailureError(f"env worker {host.name} stopped" + (f": {host.death}" if host.death else ""))
        chunk = self._received.read(w, handoff)
        self._free[w].release()
        chunk.set("env_id", self._env_ids[w].clone())
        return chunk.reshape(-1)

    def __iter__(self) -> Iterator[TensorDict]:
        self._require_running()
        while self.total_frames < 0 or self.frames < self.total_frames:
            parts, have = self._spare, sum(len(p) for p in self._spare)
            while have < self.frames_per_batch:
                parts.append(self._next_chunk())
                have += len(parts[-1])
            batch = torch.cat(parts) if len(parts) > 1 else parts[0]
            self._spare = [batch[self.frames_per_batch:]] if have > self.frames_per_batch else []
            self.frames += self.frames_per_batch
            yield batch[: self.frames_per_batch]


def _drain(q) -> None:
    if q is None:
        return
    try:
        while True:
            q.get_nowait()
    except (queue.Empty, OSError, ValueError):
        pass
