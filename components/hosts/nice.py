"""``resources.nice``: an owner's thread or process at a lower scheduling priority (`Niced`), refused where the
owner would run in its caller's own thread."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from transports.kernel.errors import ConfigurationError


def refuse_inline_nice(host_class: type, resources: Any) -> None:
    """Refuse a ``nice`` level for a target that runs in its caller's own thread (``inline`` placements)."""
    if resources.nice and host_class.inline:
        raise ConfigurationError(
            f"resources.nice={resources.nice} would lower the caller's own thread: the {host_class.placement} "
            "placement runs the owner there; use a placement with a thread or process of its own (thread, process, "
            "ray...)", path="resources.nice")


class Niced:
    """A target factory that first lowers the scheduling priority of where it runs (``os.setpriority``, Linux): every
    thread of the process for a target with a process of its own (threads started later inherit it), only the calling
    thread for a target on a thread of the owner's process. Lowering a priority needs no privilege.

    Pickles as its parts, so it travels wherever the factory does.

    Args:
        factory: the target factory.
        nice: the niceness, 1 (a little lower) to 19 (only cycles nobody else wants).
        whole_process: every thread of the process, not only the calling one.
    """

    def __init__(self, factory: Callable[[], Any], nice: int, whole_process: bool):
        self.factory, self.nice, self.whole_process = factory, int(nice), whole_process

    def __call__(self) -> Any:
        threads = [threading.get_native_id()]
        if self.whole_process:
            try:
                threads = [int(tid) for tid in os.listdir("/proc/self/task")]
            except OSError:  # no /proc: the process as the OS names it
                threads = [0]
        for tid in threads:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, max(self.nice, os.getpriority(os.PRIO_PROCESS, tid)))
            except (OSError, AttributeError):  # a thread that ended meanwhile; a system without priorities
                pass
        return self.factory()
