"""``AsyncBatchedCollector``: a pool of environments, each stepping on its own against one inference server.

Every env worker (a thread, or a process) observes, asks the policy server for an action, steps, and hands
the transition over; the server batches the requests of all workers into one forward pass. Nothing waits for
the slowest env. The server is created from a policy factory (placed with the envs' backend: a thread server
for env threads, a process server over ``process_slot`` for env processes, its layouts taken from the env
spec and a probe of the policy), or given as a running owner. Iteration yields flat batches of
``frames_per_batch`` transitions, each carrying ``env_id`` and the ``policy_version`` that chose its action.
"""

from __future__ import annotations

import pickle
import queue
import threading
from typing import Any, Callable, Iterator

import torch
from tensordict import TensorDict

from transports.errors import ConfigurationError, PeerFailureError

from .envs import VectorEnvStepper, spec_from_spaces
from .inference import InferenceServer, InferenceServerConfig
from .process import ChildProcess, context, stop_all
from .service import Owner

BACKENDS = ("thread", "process")


def _env_loop(create_env_fn, policy, seed: int, env_id: int, out, stop) -> None:
    """Step one env forever: observation -> policy -> step -> transition into ``out``."""
    stepper = VectorEnvStepper(create_env_fn(), seed)
    try:
        while not stop.is_set():
            td = stepper.step(policy(stepper.observation()))
            td.set("env_id", torch.full(td.batch_size, env_id, dtype=torch.long))
            item = pickle.dumps(td.to_dict(), protocol=pickle.HIGHEST_PROTOCOL)
            while not stop.is_set():  # a full queue must not keep a worker from stopping
                try:
                    out.put(item, timeout=0.1)
                    break
                except queue.Full:
                    pass
    finally:
        stepper.close()


class _EnvProcess:
    def __init__(self, create_env_fn, policy, seed, env_id, out):
        torch.set_num_threads(1)
        self.args = (create_env_fn, policy, seed, env_id, out)

    def run(self, stop: threading.Event) -> None:
        _env_loop(*self.args, stop)

    def handle(self, command: str, payload: Any) -> Any:
        raise ValueError(f"unknown command {command!r}")

    def close(self) -> None:
        # at shutdown nobody reads the transitions still buffered: exit without waiting to flush them
        self.args[4].cancel_join_thread()


def _env_process(*args) -> _EnvProcess:
    return _EnvProcess(*args)


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
        env_backend: ``thread`` or ``process`` (env workers; a server created here is placed alike).
        server_config: batching settings of a server created here.
        seed: base seed; env ``i`` gets ``seed + i``.
    """

    component = "collector"

    def __init__(self, create_env_fn: Callable, num_envs: int, frames_per_batch: int, total_frames: int = -1, *,
                 policy_factory: Callable | None = None, server: InferenceServer | None = None,
                 env_backend: str = "thread", server_config: InferenceServerConfig | None = None, seed: int = 0):
        if env_backend not in BACKENDS:
            raise ConfigurationError(f"unknown env_backend {env_backend!r}", alternatives=BACKENDS)
        if (policy_factory is None) == (server is None):
            raise ConfigurationError("AsyncBatchedCollector needs exactly one of policy_factory or server")
        super().__init__(placement=env_backend)
        self.create_env_fn, self.num_envs = create_env_fn, num_envs
        self.frames_per_batch, self.total_frames, self.seed = frames_per_batch, total_frames, seed
        self.policy_factory, self.server, self.env_backend = policy_factory, server, env_backend
        self.server_config = server_config or InferenceServerConfig(max_batch_size=num_envs)
        self.frames = 0
        self._own_server: InferenceServer | None = None
        self._workers: list = []
        self._stop = None
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
        response = out.exclude(*request.keys)
        config = InferenceServerConfig(**{**self.server_config.__dict__, "placement": self.env_backend})
        transport = "process_slot" if self.env_backend == "process" else "thread"  # chosen from the env spec
        return InferenceServer(policy_factory=self.policy_factory, config=config, transport=transport,
                               request_layout=request.zeros(), response_layout=response)

    def _start(self) -> None:
        if self.server is None:
            self._own_server = self._make_server().start()
        server = self.server or self._own_server
        if self.env_backend == "thread":
            self._out, self._stop = queue.Queue(maxsize=4 * self.frames_per_batch), threading.Event()
            for i in range(self.num_envs):
                t = threading.Thread(target=self._thread_env, args=(server.client(), i), name=f"env-{i}", daemon=True)
                self._workers.append(t)
                t.start()
            return
        ctx = context()
        self._out = ctx.Queue(maxsize=4 * self.frames_per_batch)
        for i in range(self.num_envs):
            worker = ChildProcess(f"env-{i}", _env_process,
                                  (self.create_env_fn, server.client(), self.seed + i, i, self._out))
            self._workers.append(worker)
            worker.start()

    def _thread_env(self, client, i: int) -> None:
        try:
            _env_loop(self.create_env_fn, client, self.seed + i, i, self._out, self._stop)
        except PeerFailureError:
            if not self._stop.is_set():
                raise

    def _shutdown(self, timeout: float | None) -> None:
        if self._stop is not None:
            self._stop.set()
        _drain(self._out)
        threads = [w for w in self._workers if isinstance(w, threading.Thread)]
        for thread in threads:
            thread.join(timeout if timeout is not None else 10.0)
        stop_all([w for w in self._workers if not isinstance(w, threading.Thread)], timeout)
        self._workers = []
        if self._own_server is not None:
            self._own_server.shutdown(timeout)
        if self._out is not None and not isinstance(self._out, queue.Queue):
            self._out.close()
            self._out.cancel_join_thread()

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
            for worker in self._workers:
                alive = worker.is_alive() if isinstance(worker, threading.Thread) else worker.is_alive
                if not alive:
                    name = worker.name
                    raise PeerFailureError(f"env worker {name} stopped" + (f": {worker.death}" if getattr(worker, "death", None) else ""))

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


