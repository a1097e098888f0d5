"""A transport written outside the project, the way a user adds one: its module (the descriptor and the class) in a
folder of its own, registered with :func:`transports.register`, plus cells that take it. Nothing of the project is
edited; :func:`toy_transport` writes the module, imports it, registers it, adds it to the ``thread`` cells of
inference and replay, and takes all of that back afterwards."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import sys

TOY_MODULE = '''
"""``toy``: a bounded in-process queue and one future per request (a transport written outside the project)."""

from __future__ import annotations

import dataclasses
import queue
import time

from transports import local
from transports.base import Batch, RequestReplyTransport, ServerEndpoint, drain
from transports.descriptor import TransportDescriptor
from transports.kernel.placements import Reach
from transports.kernel.errors import PeerFailureError
from transports.kernel.options import bounded


@dataclasses.dataclass(frozen=True)
class ToyOptions:
    capacity: int = bounded(64, ge=1)  # most requests waiting for the server


DESCRIPTOR = TransportDescriptor("toy", __name__ + ":ToyTransport", Reach.PROCESS, ToyOptions,
                                 summary="a bounded queue in the owner's process")


class ToyTransport(RequestReplyTransport):
    descriptor = DESCRIPTOR

    def __init__(self, capacity: int = ToyOptions.capacity, name: str = "service"):
        super().__init__()
        self.options, self.name = ToyOptions(capacity), name
        self.queue = queue.Queue(capacity)
        self.dead = "the server has not started"
        self.id = local.register(self)

    def client(self):
        return ToyClient(self.id)

    def server(self):
        return ToyServer(self)

    def mark_serving(self, pid):
        self.dead = None

    def mark_dead(self, *, stopped):
        self.dead = "the toy server was shut down" if stopped else "the toy server died"
        while True:
            try:
                _, future, _ = self.queue.get_nowait()
            except queue.Empty:
                return
            future.set_exception(PeerFailureError(self.dead))

    def _close(self):
        self.mark_dead(stopped=True)


class ToyClient:
    def __init__(self, transport_id):
        self.id = transport_id
        self.transport = local.lookup(*transport_id, "toy")

    def __reduce__(self):
        return (ToyClient, (self.id,))

    def submit(self, td):
        if self.transport.dead is not None:
            raise PeerFailureError(self.transport.dead)
        future = local.LocalFuture()
        self.transport.queue.put((td, future, time.monotonic()))
        return future


class ToyServer(ServerEndpoint):
    def __init__(self, transport):
        self.transport = transport

    def collect(self, max_n, min_n, timeout, poll):
        items = drain(self.transport.queue, max_n, min_n, timeout, poll)
        if not items:
            return None
        return Batch(handles=[f for _, f, _ in items], requests=[td for td, _, _ in items],
                     enqueued=[t for _, _, t in items])

    def reply(self, batch, out):
        for i, future in enumerate(batch.handles):
            future.set_result(out[i])

    def fail(self, batch, error):
        for future in batch.handles:
            future.set_exception(error)

    def close(self, reason="the server was shut down"):
        self.transport.mark_dead(stopped=True)
'''

TAKES_TOY = {"inference": "thread", "replay": "thread"}
"""The cells the toy is added to: component -> placement."""


@contextlib.contextmanager
def toy_transport(folder: str):
    """Write the toy's module into ``folder``, import and register it, and add it to :data:`TAKES_TOY`'s cells; on
    exit, everything is as it was. Yields the module."""
    from components import compat
    from components.declaration import SUPPORTED
    from transports import registry

    name = f"toy_transport_{os.getpid()}"
    with open(os.path.join(folder, f"{name}.py"), "w") as f:
        f.write(TOY_MODULE)
    sys.path.insert(0, folder)
    saved = {component: compat.DECLARATIONS[component] for component in TAKES_TOY}
    try:
        module = importlib.import_module(name)
        registry.register(module.DESCRIPTOR)
        for component, placement in TAKES_TOY.items():
            declared = compat.DECLARATIONS[component]
            cells = tuple(dataclasses.replace(c, transports={**c.transports, "toy": SUPPORTED})
                          if c.placement == placement else c for c in declared.cells)
            compat.DECLARATIONS[component] = dataclasses.replace(declared, cells=cells)
        yield module
    finally:
        compat.DECLARATIONS.update(saved)
        registry.unregister("toy")
        sys.path.remove(folder)
        sys.modules.pop(name, None)
