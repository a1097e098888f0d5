"""``AsyncBatchedCollector``: a pool of environments, each stepping on its own against one inference server.

Every env worker (on a thread, or in a process: the collector's placement) observes, asks the policy server
for an action, steps, and hands the transition over; the server batches the requests of all workers into one
forward pass. Nothing waits for the slowest env. The server is created from a policy factory (placed with the
envs, its transport resolved by the table's ``auto`` rule for workers with one request in flight, its layouts
taken from the env spec and a probe of the policy), or given as a running owner. Iteration yields flat batches
of ``frames_per_batch`` transitions, each carrying ``env_id`` and the ``policy_version`` that chose its action.
"""

from __future__ import annotations

import dataclasses
import functools
import pickle
import queue
import threading
from typing import Callable, Iterator

import torch
from tensordict import TensorDict

from transports.errors import ConfigurationError, PeerFailureError

from ..envs import VectorEnvStepper, spec_from_spaces
from ..hosts import stop_all
from ..inference import InferenceServer, InferenceServerConfig
from ..inference.sampling import SAMPLE_SEED, env_streams, step_seeds
from ..resolution import resolve_component
from ..service import Owner


class EnvLoop:
    """One env worker: observation -> policy -> step -> transition into ``out``, until stopped."""

    def __init__(self, create_env_fn, policy, seed: int, env_id: int, out):
        self.stepper = VectorEnvStepper(create_env_fn(), seed)
        self.policy, self.env_id, self.out = policy, env_id, out
        self.streams = env_streams(range(seed, seed + self.stepper.num_envs))  # sampling seeds, as Worker sends them

    def serve(self, stop: threading.Event) -> None:
        stepper, out = self.stepper, self.out
        step = 0
        try:
            while not stop.is_set():
                request = stepper.observation()
                request.set(SAMPLE_SEED, step_seeds(self.streams, step)[0])
                step += 1
                td = self.policy(request)
                td.pop(SAMPLE_SEED, None)
                td = stepper.step(td)
                td.set("env_id", torch.full(td.batch_size, self.env_id, dtype=torch.long))
                item = pickle.dumps(td.to_dict(), protocol=pickle.HIGHEST_PROTOCOL)
                while not stop.is_set():  # a full queue must not keep a worker from stopping
                    try:
                        out.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        pass
        except PeerFailureError:
            if not stop.is_set():  # the server stopped first during shutdown: not an error
                raise

    def close(self) -> None:
        self.stepper.close()
        if hasattr(self.out, "cancel_join_thread"):
            # at shutdown nobody reads the transitions still buffered: exit without waiting to flush them
            self.out.cancel_join_thread()


class AsyncBatchedCollector(Owner["AsyncBatchedCollector"]):
    """An env pool stepping asynchronously against an inference server.

    Args:
        create_env_fn: picklable callable returning a one-env vector env (see
            :func:`components.envs.make_vector_env` with ``num_envs=1``).
        num_envs: env workers.
        frames_per_batch: transitions per yielded batch.
        total_frames: stop after this many frames (``-1``: never).
        policy_factory: builds the policy for a server created here (exclusive with ``server``).
        server: a running inference owner to use instead.
        env_backend: the placement of the env workers, ``thread`` or ``process`` (a server created here is
            placed alike).
        server_config: batching settings of a server created here.
        seed: base seed; env ``i`` gets ``seed + i``.
    """

    component = "collector"

    def __init__(self, create_env_fn: Callable, num_envs: int, frames_per_batch: int, total_frames: int = -1, *,
                 policy_factory: Callable | None = None, server: InferenceServer | None = None,
                 env_backend: str = "thread", server_config: InferenceServerConfig | None = None, seed: int = 0):
        if (policy_factory is None) == (server is None):
            raise ConfigurationError("AsyncBatchedCollector needs exactly one of policy_factory or server")
        super().__init__(placement=env_backend)
        if not hasattr(self.host_type, "make_queue") or self.inline:
            raise ConfigurationError(f"env workers cannot run on {env_backend!r}", path="env_backend",
                                     alternatives=("thread", "process"))
        self.create_env_fn, self.num_envs = create_env_fn, num_envs
        self.frames_per_batch, self.total_frames, self.seed = frames_per_batch, total_frames, seed
        self.policy_factory, self.server = policy_factory, server
        self.server_config = server_config or InferenceServerConfig(max_batch_size=num_envs)
        self.frames = 0
        self.hosts: list = []
        self._own_server: InferenceServer | None = None
        self._out = None

    def _make_server(self) -> InferenceServer:
        env = self.create_env_fn()
        try:
            spec = spec_from_spaces(env.spec.id if env.spec else "env", env.single_observation_space, env.single_action_space)
        finally:
            env.close()
        request = spec.request_layout(1)
        probe = self.policy_factory()
        with torch.no_grad():
            out = probe(request.zeros())
        out.set("policy_version", torch.zeros(out.batch_size, dtype=torch.long))
        layouts = {"request": request.zeros(), "response": out.exclude(*request.keys)}
        # the table's auto rule picks the transport for env workers that keep one request in flight each
        resolved = resolve_component("inference", self.placement, "auto", layouts=layouts, one_request_per_worker=True)
        config = dataclasses.replace(self.server_config, placement=self.placement)
        return InferenceServer(policy_factory=self.policy_factory, config=config, resolved=resolved)

    def _launch(self) -> None:
        if self.server is None:
            self._own_server = self._make_server().start()
        server = self.server or self._own_server
        self._out = self.host_type.make_queue(4 * self.frames_per_batch)
        for i in range(self.num_envs):
            host = self._make_host(f"env-{i}", functools.partial(
                EnvLoop, self.create_env_fn, server.client(), self.seed + i, i, self._out))
            self.hosts.append(host)
            host.launch()

    def _finish(self) -> None:
        for host in self.hosts:
            host.wait_ready()

    def _shutdown(self, timeout: float | None) -> None:
        for host in self.hosts:
            host.request_stop()
        _drain(self._out)
        stop_all(self.hosts, timeout)
        self.hosts = []
        if self._own_server is not None:
            self._own_server.shutdown(timeout)
        if hasattr(self._out, "cancel_join_thread"):
            self._out.close()
            self._out.cancel_join_thread()

    def _alive(self) -> bool:
        return all(h.is_alive for h in self.hosts)

    def _client(self):
        return self

    def __reduce__(self):
        raise TypeError("an AsyncBatchedCollector is iterated in the driver and cannot be pickled")

    def _next_transition(self) -> TensorDict:
        while True:
            try:
                return TensorDict(pickle.loads(self._out.get(timeout=0.2)), batch_size=[1])
            except queue.Empty:
                pass
            for host in self.hosts:
                if not host.is_alive:
                    raise PeerFailureError(f"env worker {host.name} stopped" + (f": {host.death}" if host.death else ""))

    def __iter__(self) -> Iterator[TensorDict]:
        self._require_running()
        while self.total_frames < 0 or self.frames < self.total_frames:
            batch = torch.cat([self._next_transition() for _ in range(self.frames_per_batch)])
            self.frames += self.frames_per_batch
            yield batch


def _drain(q) -> None:
    if q is None:
        return
    try:
        while True:
            q.get_nowait()
    except (queue.Empty, OSError, ValueError):
        pass
