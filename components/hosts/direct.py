"""``direct``: the target lives in the caller's thread. No serving loop and no transport: the owner is its
own client and every call is a plain method call."""

from __future__ import annotations

from typing import Any


from transports.kernel.placements import Placement, Reach, register

from .base import Done, Host, Pending, close_target


class DirectHost(Host):
    """Builds the target in the caller; calls run at once, in the caller's thread."""

    placement = "direct"
    inline = True
    same_process = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.target: Any = None
        self._stopped = False

    def _launch(self) -> None:
        self.target = self.factory()  # the builder's own exception surfaces here, unchanged

    def wait_ready(self) -> None:
        pass

    def submit(self, method: str, *args: Any) -> Pending:
        try:
            return Done(getattr(self.target, method)(*args))
        except Exception as exc:  # noqa: BLE001 - raised again by result()
            return Done(error=exc)

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        return getattr(self.target, method)(*args)

    def shutdown(self, timeout: float | None = None) -> None:
        if self.target is not None and not self._stopped:
            self._stopped = True
            close_target(self.target)

    @property
    def is_alive(self) -> bool:
        return self.target is not None and not self._stopped


PLACEMENT = register(Placement("direct", DirectHost, Reach.PROCESS,
                                summary="in the caller's thread: plain calls, nothing started"))
