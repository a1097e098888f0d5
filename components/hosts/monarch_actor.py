"""The actor that hosts a target for `components.hosts.monarch.MonarchHost`: imports Monarch, so it is imported
only where a Monarch owner starts."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading

from transports.kernel.errors import RemoteError
from transports.monarch import import_monarch

from .base import DEFAULT_STOP_TIMEOUT, build_and_serve, close_target

actor_api = import_monarch()
log = logging.getLogger(__name__)


class HostActor(actor_api.Actor):
    """The body of every hosting actor: builds the target, serves it on a thread, runs control calls on another, and
    hands transport requests to their endpoints inside the actor."""

    def __init__(self, factory):
        self.target, self._stop, self._serving = build_and_serve(factory)
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run_calls, name="control", daemon=True).start()

    def _run_calls(self) -> None:
        while (item := self._calls.get()) is not None:
            port, method, args = item
            _reply(port, lambda: getattr(self.target, method)(*args), remote=True)

    @actor_api.endpoint
    def ready(self) -> tuple[int, str]:
        """The actor process's pid and hostname, once the target was built."""
        return os.getpid(), socket.gethostname()

    @actor_api.endpoint(explicit_response_port=True)
    def call(self, port, method: str, args: tuple) -> None:
        """Run ``method(*args)`` on the target, on the actor's control thread; the answer goes to ``port``."""
        self._calls.put((port, method, args))

    @actor_api.endpoint(explicit_response_port=True)
    def deliver(self, port, endpoint_id: str, message: tuple) -> None:
        """Hand a transport request to its endpoint; the answer goes to ``port`` from the thread that sets it. Never
        raises: an error escaping an endpoint that answers through its port ends the actor."""
        from transports.actor_calls import submit_in_order

        try:
            submit_in_order(endpoint_id, message).add_done_callback(lambda done: _reply(port, done.result))
        except BaseException as exc:  # noqa: BLE001 - refused before it was queued: the caller raises it
            port.exception(exc)

    @actor_api.endpoint
    def finish(self) -> None:
        """Stop serving and close the target (``stop`` is a name Monarch's actor meshes keep for themselves)."""
        self._stop.set()
        if self._serving is not None:
            self._serving.join(DEFAULT_STOP_TIMEOUT)
        self._calls.put(None)
        close_target(self.target)


def _reply(port, produce, remote: bool = False) -> None:
    """Answer ``port`` with ``produce()``, or with its error (``remote``: as a `RemoteError` with the traceback
    text; otherwise as raised: the transport's errors are ours already). Never raises: an answer that cannot travel
    (pickled here) becomes the caller's error, and the thread answering (a serving loop's) goes on."""
    try:
        value = produce()
    except BaseException as exc:  # noqa: BLE001 - the caller raises it
        port.exception(RemoteError.from_exception(exc) if remote else exc)
        return
    try:
        port.send(value)
    except BaseException as exc:  # noqa: BLE001 - the answer cannot travel
        try:
            port.exception(RemoteError.from_exception(exc))
        except BaseException:  # noqa: BLE001 - nothing more can be sent: the caller's timeout tells
            log.exception("%s: an answer could not be sent", port)
