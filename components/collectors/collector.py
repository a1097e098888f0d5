"""Collectors: environment instances and the rollout loop.

A collector steps vector environments against a policy (usually an inference client) and yields batches
shaped ``[time, env]``. Collectors take no transport of their own: policy calls go over the inference
endpoint's transport and, with a replay buffer attached, writes go over the replay endpoint's transport
(each worker writes its rollout straight into replay and only a completion count comes back).

Placements: ``direct`` (one worker, stepped in the caller's thread), ``thread`` (worker threads),
``process`` (worker processes, each with its own envs, started with a ready handshake and watched: a crash
surfaces in the driver within 2 s with the worker's traceback text) and ``ray`` (worker actors; rollouts
return through the object store, or go straight into a Ray replay buffer; with ``max_restarts`` a crashed
worker is restarted and collection resumes). Workers collect on request, so with
``sync=True`` every batch is collected after the weights the learner pushed before asking for it.
"""

from __future__ import annotations

import pickle
import queue
import threading
from typing import Any, Callable, Iterator

import gymnasium as gym
import torch
from tensordict import TensorDict, TensorDictBase

from transports.errors import ConfigurationError, PeerFailureError, RemoteError

from .envs import VectorEnvStepper
from .process import ChildProcess, stop_all
from .ray_support import RayActor
from .service import Owner

SEED_STRIDE = 10_000
"""Worker ``w`` seeds its envs from ``seed + w * SEED_STRIDE``: every worker (and env) differs."""


class _Worker:
    """One rollout loop over one vector env; what runs where a collector worker lives."""

    def __init__(self, create_env_fn, policy, frames: int, seed: int, replay_buffer=None):
        env = create_env_fn()
        if frames % env.num_envs:
            env.close()
            raise ConfigurationError(
                f"frames per worker ({frames}) is not a multiple of num_envs={env.num_envs}",
                path="components.collector",
            )
        self.stepper = VectorEnvStepper(env, seed)
        self.policy, self.steps, self.replay = policy, frames // env.num_envs, replay_buffer

    def rollout(self) -> TensorDict:
        stepper, steps = self.stepper, []
        for _ in range(self.steps):
            steps.append(stepper.step(self.policy(stepper.observation())))
        return torch.stack(steps, dim=0)

    def collect(self) -> TensorDict | int:
        batch = self.rollout()
        return batch if self.replay is None else self.replay.extend(batch.reshape(-1))

    def close(self) -> None:
        self.stepper.close()


class _ChildWorker:
    """A worker in a child process: ``handle("collect")`` runs one rollout and returns it pickled."""

    def __init__(self, *args):
        torch.set_num_threads(1)
        self.worker = _Worker(*args)

    def run(self, stop: threading.Event) -> None:
        stop.wait()

    def handle(self, command: str, payload: Any) -> Any:
        if command == "collect":
            out = self.worker.collect()
            return out if isinstance(out, int) else pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        if command == "spec":
            return self.worker.stepper.spec
        raise ValueError(f"unknown command {command!r}")

    def close(self) -> None:
        self.worker.close()


def _child_worker(*args) -> _ChildWorker:
    return _ChildWorker(*args)


class Collector(Owner["Collector"]):
    """Steps vector envs with a policy and yields ``[time, env]`` batches of ``frames_per_batch`` frames.

    Args:
        create_env_fn: a picklable callable returning a vector env with same-step autoreset
            (see :func:`components.envs.make_vector_env`); called where each worker lives.
        policy: an inference owner (each worker then gets a client of its own, as ``process_slot`` needs) or
            a callable TensorDict policy (an inference client, a ``PolicyClientModule``...) shared by the
            workers; for ``process`` placement it must travel to worker processes (process clients do).
        frames_per_batch: environment steps (summed over all envs of all workers) per yielded batch.
        total_frames: stop after this many frames; ``-1`` iterates until shut down.
        num_collectors: workers; each gets ``frames_per_batch / num_collectors`` frames per batch.
        placement: ``direct``, ``thread`` or ``process``; ``None`` takes the ``service_backend`` context.
        replay_buffer: a replay owner (each worker gets its own client) or client; workers write their rollouts
            there and iteration yields frame counts. Process workers need the owner or one client each.
        sync: ``True``: each iteration gathers one rollout from every worker, concatenated along the env
            dimension. ``False``: yield each worker's rollout as soon as it is ready.
        seed: base seed (worker ``w`` uses ``seed + w * 10000``, env ``i`` of it ``+ i``).

    Example:
        >>> collector = Collector(partial(make_vector_env, "CartPole-v1", 8), policy, 256, 10_000).start()
        >>> for batch in collector:
        ...     batch.batch_size
        torch.Size([32, 8])
    """

    component = "collector"

    def __init__(
        self,
        create_env_fn: Callable[[], gym.vector.VectorEnv],
        policy: Callable[[TensorDictBase], TensorDictBase],
        frames_per_batch: int,
        total_frames: int = -1,
        num_collectors: int = 1,
        *,
        placement: str | None = None,
        replay_buffer: Any = None,
        sync: bool = True,
        seed: int = 0,
    ):
        super().__init__(placement=placement)
        if frames_per_batch < 1:
            raise ConfigurationError(f"frames_per_batch must be >= 1, got {frames_per_batch!r}")
        if num_collectors < 1 or frames_per_batch % num_collectors:
            raise ConfigurationError(
                f"frames_per_batch={frames_per_batch} must split evenly over num_collectors={num_collectors}",
                path="components.collector.num_collectors",
            )
        if self.placement == "direct" and num_collectors != 1:
            raise ConfigurationError("a direct collector has one worker; use placement thread or process for more",
                                     path="components.collector.num_collectors")
        self.create_env_fn, self.policy = create_env_fn, policy
        self.frames_per_batch, self.total_frames, self.num_collectors = frames_per_batch, total_frames, num_collectors
        self.replay_buffer, self.sync, self.seed = replay_buffer, sync, seed
        self.frames = 0
        self._workers: list = []  # _Worker (direct), _ThreadWorker or ChildProcess
        self._spec = None

    def _worker_args(self, w: int) -> tuple:
        # an owner gives each worker its own endpoint; a client is shared (fine for threads; a cross-process
        # client copied into several worker processes is refused at its first call, see EndpointClaims)
        policy = self.policy.client() if isinstance(self.policy, Owner) else self.policy
        replay = self.replay_buffer.client() if isinstance(self.replay_buffer, Owner) else self.replay_buffer
        return (self.create_env_fn, policy, self.frames_per_batch // self.num_collectors,
                self.seed + w * SEED_STRIDE, replay)

    def _start(self) -> None:
        if self.placement == "direct":
            self._workers = [_Worker(*self._worker_args(0))]
            self._spec = self._workers[0].stepper.spec
            return
        if self.placement == "ray":  # launched together, then waited for: their start-ups overlap
            self._workers = [_RayWorker(f"collector-{w}", self._worker_args(w), self.resources)
                             for w in range(self.num_collectors)]
            for worker in self._workers:
                worker.wait_ready()
            self._spec = self._workers[0].call("spec")
            return
        for w in range(self.num_collectors):
            if self.placement == "thread":
                worker = _ThreadWorker(self._worker_args(w), name=f"collector-{w}")
            else:
                worker = ChildProcess(f"collector-{w}", _child_worker, self._worker_args(w))
            self._workers.append(worker)
            worker.start()
        self._spec = self._workers[0].call("spec")

    def _shutdown(self, timeout: float | None) -> None:
        children = [w for w in self._workers if isinstance(w, ChildProcess)]
        for worker in self._workers:
            if isinstance(worker, _Worker):
                worker.close()
            elif not isinstance(worker, ChildProcess):
                worker.stop(timeout)
        stop_all(children, timeout)  # the worker processes wind down together
        self._workers = []

    def _alive(self) -> bool:
        return all(getattr(w, "is_alive", True) for w in self._workers)

    def _client(self) -> "CollectorClient":
        return CollectorClient(self)

    @property
    def env_spec(self):
        """The environment's :class:`~components.envs.EnvSpec`."""
        self._require_running()
        return self._spec

    # ------------------------------------------------------------------ domain operations
    def rollout(self) -> TensorDict | int:
        """Collect one batch (``sync``: from every worker) and return it (or the frames written to replay)."""
        self._require_running()
        if self.placement == "direct":
            out = self._workers[0].collect()
        else:
            outs = _gather([w.submit("collect") for w in self._workers])
            out = sum(outs) if self.replay_buffer is not None else torch.cat(outs, dim=1)
        self.frames += self.frames_per_batch
        return out

    def __iter__(self) -> Iterator[TensorDict | int]:
        if self.sync or self.placement == "direct":
            while self.total_frames < 0 or self.frames < self.total_frames:
                yield self.rollout()
            return
        pending = {w: w.submit("collect") for w in self._workers}
        per_worker = self.frames_per_batch // self.num_collectors
        while self.total_frames < 0 or self.frames < self.total_frames:
            worker, out = _first_ready(pending)
            self.frames += per_worker
            pending[worker] = worker.submit("collect")
            yield out
        _gather(list(pending.values()))  # let the workers finish before shutdown


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
        return self._owner.rollout()

    @property
    def frames(self) -> int:
        return self._owner.frames

    @property
    def env_spec(self):
        return self._owner.env_spec

    def __reduce__(self):
        raise TypeError("a collector client is iterated in the driver and cannot be pickled; "
                        "hand workers the inference and replay clients instead")


def _decode(value):
    return pickle.loads(value) if isinstance(value, bytes) else value


def _gather(handles: list) -> list:
    return [_decode(h.result()) for h in handles]


def _first_ready(pending: dict):
    while True:
        for worker, handle in pending.items():
            if handle.ready(0.01):
                return worker, _decode(handle.result())


class CollectorActor(_ChildWorker):
    """A worker in a Ray actor: the same commands; rollouts return through the object store."""

    def ready(self) -> int:
        import os

        return os.getpid()

    def handle(self, command: str, payload: Any = None) -> Any:
        if command == "collect":
            return self.worker.collect()
        if command == "node":  # the Ray node this worker runs on
            import ray

            return ray.get_runtime_context().get_node_id()
        return super().handle(command, payload)

    def stop(self) -> None:
        self.close()


class _RayWorker(RayActor):
    """A worker actor with the protocol of :class:`ChildProcess` (submit, call, stop, is_alive, pid).

    With ``max_restarts > 0`` Ray restarts a crashed worker (a fresh env, the same arguments) and retries the
    interrupted ``collect`` on it, so collection resumes."""

    def __init__(self, name: str, args: tuple, resources):
        super().__init__(CollectorActor, name, args, resources)

    def submit(self, command: str, payload: Any = None):
        return super().submit("handle", command, payload)

    def call(self, command: str, payload: Any = None) -> Any:
        return self.submit(command, payload).result()


class _ThreadWorker:
    """A worker thread that collects on request (same protocol as a worker process)."""

    def __init__(self, args: tuple, name: str):
        self.args, self.name = args, name
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.worker: _Worker | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        ready = threading.Event()
        self.thread = threading.Thread(target=self._loop, args=(ready,), name=self.name, daemon=True)
        self.thread.start()
        ready.wait()
        if self.error is not None:
            self.thread.join()
            raise self.error

    def _loop(self, ready: threading.Event) -> None:
        try:
            self.worker = _Worker(*self.args)
        except BaseException as exc:  # noqa: BLE001 - raised at start()
            self.error = exc
            ready.set()
            return
        ready.set()
        try:
            while True:
                item = self.requests.get()
                if item is None:
                    return
                command, handle = item
                try:
                    handle.set(self.worker.collect() if command == "collect" else self.worker.stepper.spec)
                except BaseException as exc:  # noqa: BLE001 - raised in the driver
                    handle.fail(RemoteError.from_exception(exc))
        finally:
            self.worker.close()

    @property
    def is_alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def submit(self, command: str) -> "_Handle":
        handle = _Handle(self)
        self.requests.put((command, handle))
        return handle

    def call(self, command: str) -> Any:
        return self.submit(command).result()

    def stop(self, timeout: float | None = None) -> None:
        if self.thread is not None:
            self.requests.put(None)
            self.thread.join(timeout if timeout is not None else 30.0)
            self.thread = None


class _Handle:
    def __init__(self, worker: _ThreadWorker):
        self.worker, self.event, self.value, self.error = worker, threading.Event(), None, None

    def set(self, value) -> None:
        self.value = value
        self.event.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.event.set()

    def ready(self, timeout: float) -> bool:
        return self.event.wait(timeout)

    def result(self) -> Any:
        while not self.event.wait(0.1):
            if not self.worker.is_alive:
                raise PeerFailureError(f"{self.worker.name} stopped")
        if self.error is not None:
            raise self.error
        return self.value


