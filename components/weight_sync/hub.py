"""Weight sync over ``distributed``: versions fan out from the owner over point-to-point gloo channels.

The owner (a Ray actor, or a worker rank) holds the latest version. A ``push`` is one fixed-layout request from
the learner (the state dict, flattened to tensor leaves). Each receiver keeps one *subscription* in flight
(``since`` its latest version) on a thread of its own; the owner answers it as soon as a newer version exists,
so the new weights are already on the receiver's side when it polls: a ``poll`` between batches is a local
check and an in-place copy, never a round trip. Versions are monotonic; a receiver that falls behind gets the
latest one, not every one in between. Layouts are the receivers' and the learner's own state dicts (announced
when their channels connect); ``version`` and ``pull`` stay commands over the owner's control channel.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn

from transports.base import Batch
from transports.kernel.errors import PeerFailureError, RemoteError

from ..commands import Allowed, CommandClient, CommandLoop
from .channels import StateDict, copy_into, on_host, state_of

VERSION = "__version__"
POLL = 0.05


def to_tensordict(state: StateDict, version: int | None = None) -> TensorDict:
    """A state dict as a TensorDict of nested keys (``"0.weight"`` -> ``("0", "weight")``), on the host
    (`on_host`: what goes on the wire)."""
    td = TensorDict()
    for name, tensor in on_host(state).items():
        td.set(tuple(name.split(".")), tensor)
    if version is not None:
        td.set(VERSION, torch.tensor(version, dtype=torch.int64))
    return td


def from_tensordict(td: TensorDict) -> dict[str, torch.Tensor]:
    """The state dict inside a TensorDict of `to_tensordict` (its version left out)."""
    out = {}
    for key, value in td.items(include_nested=True, leaves_only=True):
        name = key if isinstance(key, str) else ".".join(key)
        if name != VERSION:
            out[name] = value
    return out


class WeightHub:
    """What the owner's host runs: the latest version, pushes in, held subscriptions answered on each push.

    Args:
        server_side: the serving side of the command transport (``version``, ``pull``).
        payload_side: the serving side of the ``distributed`` transport (``push``, ``subscribe``).
        first_version: the version before the first push.
    """

    def __init__(self, server_side: Any, payload_side: Any, allowed: Allowed, first_version: int = 0):
        self.version, self.state = first_version, None
        self.lock = threading.Lock()
        self.commands = CommandLoop(self, server_side.server(), allowed, self.lock)
        self.payload = payload_side.server()
        self.waiting: list = []  # (handle, since, enqueued) of subscriptions not answered yet

    def serve(self, stop: threading.Event) -> None:
        """Serve commands and weight requests until ``stop`` is set; then fail what is still held."""
        thread = threading.Thread(target=self.commands.run, args=(stop,), name="weight-commands", daemon=True)
        thread.start()
        try:
            while not stop.is_set():
                batch = self.payload.collect(64, 1, 0.0, POLL)
                for handle, request, enqueued in zip(*(batch.handles, batch.requests, batch.enqueued)) if batch else ():
                    self._serve_one(handle, request, enqueued)
        finally:
            self.payload.close("the weight sync was shut down")
            stop.set()
            thread.join()

    def _serve_one(self, handle, request, enqueued) -> None:
        op = handle[0].op
        if op == "push":
            with self.lock:
                self.version += 1
                self.state = request.exclude(VERSION)
                version, waiting, self.waiting = self.version, self.waiting, []
            self.payload.reply(Batch([handle], enqueued=[enqueued]), [TensorDict({VERSION: torch.tensor(version)})])
            for held in waiting:
                self._answer(*held)
        elif op == "subscribe":
            self._answer(handle, int(request["since"]), enqueued)
        else:
            self.payload.fail(Batch([handle], enqueued=[enqueued]), RemoteError("PermissionError",
                                                                                  f"{op!r} is not a weight operation"))

    def _answer(self, handle, since: int, enqueued) -> None:
        with self.lock:
            version, state = self.version, self.state
            if version <= since or state is None:
                self.waiting.append((handle, since, enqueued))
                return
        answer = state.clone(False)
        answer.set(VERSION, torch.tensor(version, dtype=torch.int64))
        self.payload.reply(Batch([handle], enqueued=[enqueued]), [answer])  # a layout mismatch fails only this one

    # ------------------------------------------------------------------ commands
    def _current_version(self) -> int:
        return self.version

    def pull(self) -> tuple[int, StateDict | None]:
        """The latest ``(version, state_dict)``; the state is ``None`` before the first push."""
        return self.version, None if self.state is None else from_tensordict(self.state)

    def close(self) -> None:
        """Drop the held state and subscriptions (the host calls it after serving ends)."""
        self.state, self.waiting = None, []


class DistributedWeights:
    """The client of a ``distributed`` weight sync: ``push``, ``poll``, ``pull`` and ``version``; picklable to any
    process that reaches the owner (each process connects its own channels on first use)."""

    def __init__(self, endpoint: Any, payload: Any):
        self._endpoint, self._payload = endpoint, payload
        self._calls = CommandClient(endpoint)
        self._push = None
        self._latest: tuple[int, TensorDict] | None = None
        self._problem: BaseException | None = None
        self._lock = threading.Lock()
        self._subscriber: threading.Thread | None = None

    def __reduce__(self):
        return (DistributedWeights, (self._endpoint, self._payload))

    def attached(self) -> "DistributedWeights":
        """Another client of the same owner, with channels of its own (connected on first use)."""
        return DistributedWeights(self._endpoint, self._payload)

    @property
    def version(self) -> int:
        """The latest published version (the owner's ``first_version`` before the first push).

        One command round trip to the owner.
        """
        return self._calls._call("_current_version")

    def push(self, weights: nn.Module | StateDict) -> int:
        """Publish ``weights`` (a module or a state dict) as a new version; returns that version.

        Waits until the owner holds the version.
        """
        td = to_tensordict(state_of(weights))
        if self._push is None:
            self._push = self._payload.bind("push", td, TensorDict({VERSION: torch.tensor(0)}))
        return int(self._push.submit(td).result()[VERSION])

    def poll(self, since: int, into: nn.Module) -> int | None:
        """The newest version already received, copied into ``into`` if newer than ``since`` (no round trip)."""
        if self._subscriber is None:
            self._subscribe(into)
        with self._lock:
            latest, problem = self._latest, self._problem
        if latest is None or latest[0] <= since:
            if problem is not None:  # nothing newer will come: the owner stopped or the layouts differ
                raise problem
            return None
        version, state = latest
        copy_into(into, from_tensordict(state))
        return version

    def pull(self) -> tuple[int, StateDict | None]:
        """The latest ``(version, state_dict)``; the state is ``None`` before the first push.

        One command round trip to the owner.
        """
        return self._calls._call("pull")

    def _subscribe(self, into: nn.Module) -> None:
        with self._lock:
            if self._subscriber is not None:
                return
            template = to_tensordict(state_of(into), version=0)
            channel = self._payload.bind("subscribe", TensorDict({"since": torch.tensor(0)}), template)
            self._subscriber = threading.Thread(target=self._follow, args=(channel,), name="weight-subscriber",
                                                daemon=True)
            self._subscriber.start()

    def _follow(self, channel: Any) -> None:
        since = 0
        while True:
            try:
                answer = channel.submit(TensorDict({"since": torch.tensor(since)})).result()
            except PeerFailureError as exc:  # the owner stopped: polls keep the last version, then report it
                with self._lock:
                    self._problem = exc
                return
            except Exception as exc:  # noqa: BLE001 - a layout mismatch: reported at the next poll
                with self._lock:
                    self._problem = exc
                return
            since = int(answer[VERSION])
            with self._lock:
                self._latest = (since, answer)


