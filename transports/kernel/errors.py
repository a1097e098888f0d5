"""The project's error hierarchy.

It lives in the kernel, under every package, so that transports and components raise the same errors;
``components.errors`` and ``transports`` re-export it. Backend exceptions (``multiprocessing``, Ray,
torch.distributed) are mapped into these at the boundary with ``raise OurError(...) from exc``.

    ServiceError
    ├── ConfigurationError (also ValueError)        a configuration mistake, raised before anything starts
    │   ├── IncompatibleCombinationError            a (component, placement, transport) outside the table
    │   └── NotImplementedYetError                  a cell of the target table that is not built yet
    ├── TransportError                              communication failed
    │   ├── PeerFailureError                        the owner or peer died; never a silent hang
    │   ├── ServiceTimeoutError (also TimeoutError) no answer in time; the peer may still be alive
    │   └── LayoutError (also ValueError)           a payload does not match its endpoint's wire layout
    └── RemoteError                                 the owner raised; carries remote type, message, traceback
    SharedMemoryFull (an OSError, errno ENOSPC)     a shared-memory segment does not fit where segments live
"""

from __future__ import annotations

import errno

import traceback as _traceback


class ServiceError(Exception):
    """Base class of every error this project raises on purpose."""


class ConfigurationError(ServiceError, ValueError):
    """A configuration mistake, found before any thread, process, actor or job starts.

    Args:
        message: what is wrong, with the offending value shown.
        path: the config path that holds the value (``components.inference.transport``), if known.
        alternatives: the values that would have been accepted there.
    """

    def __init__(self, message: str, *, path: str | None = None, alternatives: tuple[str, ...] = ()):
        self.message = message
        self.path = path
        self.alternatives = tuple(alternatives)
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [self.message]
        if self.alternatives:
            parts.append("supported: " + ", ".join(self.alternatives))
        if self.path:
            parts.append(f"full_key: {self.path}")
        return "\n    ".join(parts)

    def __reduce__(self):
        return (_rebuild_config_error, (type(self), self.message, self.path, self.alternatives))


def _rebuild_config_error(cls, message, path, alternatives):
    return cls(message, path=path, alternatives=alternatives)


class IncompatibleCombinationError(ConfigurationError):
    """A (component, placement, transport) combination that the compatibility table rejects."""


class NotImplementedYetError(ConfigurationError, NotImplementedError):
    """A combination inside the target table whose implementation is not built yet.

    The dry run prints such plans (marking the cells); running one fails before anything starts.
    """


class TransportError(ServiceError):
    """Communication with an owner or peer failed."""


class PeerFailureError(TransportError):
    """The owner or peer died (or is unreachable) while a caller was waiting on it."""


class ServiceTimeoutError(TransportError, TimeoutError):
    """No answer within the deadline. Distinct from `PeerFailureError`: the peer may be alive."""


class LayoutError(TransportError, ValueError):
    """A payload does not match the wire layout bound to its endpoint.

    Args:
        key: the nested key (as a tuple) that mismatched.
        expected: what the layout declares for it.
        got: what the payload carried.
    """

    def __init__(self, key: tuple[str, ...] | str, expected: str, got: str, *, hint: str = ""):
        self.key = key if isinstance(key, tuple) else (key,)
        self.expected = expected
        self.got = got
        self.hint = hint
        shown = ".".join(self.key)
        msg = f"payload key {shown!r}: expected {expected}, got {got}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)

    def __reduce__(self):
        return (LayoutError, (self.key, self.expected, self.got), {"hint": self.hint})

    def __setstate__(self, state):
        self.__dict__.update(state)


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
"""The ``errno`` of a write that failed because the disk (or the user's quota) is full."""


class SharedMemoryFull(OSError):
    """A shared-memory segment does not fit in the segment directory (`transports.segment_dir`), found where
    the segment is made, before any of its pages is touched (a page that could not be backed later would end the
    process with SIGBUS). An ``OSError`` with ``errno`` ENOSPC; its message names the directory, the room left there
    and what to do.

    Args:
        message: the whole message (``str()`` of the error is exactly this).
    """

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return self.strerror

    def __reduce__(self):
        return (SharedMemoryFull, (self.strerror,))


class RemoteError(ServiceError):
    """The owner raised while serving a call; raised again at the call site.

    Attributes:
        remote_type: the qualified name of the exception type raised by the owner.
        remote_message: ``str()`` of that exception.
        remote_traceback: the owner-side traceback, as text (never a pickled object).
    """

    def __init__(self, remote_type: str, remote_message: str, remote_traceback: str = ""):
        self.remote_type = remote_type
        self.remote_message = remote_message
        self.remote_traceback = remote_traceback
        text = f"{remote_type}: {remote_message}"
        if remote_traceback:
            text += "\n--- remote traceback ---\n" + remote_traceback.rstrip()
        super().__init__(text)

    @classmethod
    def from_exception(cls, exc: BaseException) -> "RemoteError":
        """Capture ``exc`` (with its traceback) as text, ready to travel to the caller."""
        tb = "".join(_traceback.format_exception(type(exc), exc, exc.__traceback__))
        return cls(qualified_name(type(exc)), str(exc), tb)

    def __reduce__(self):
        return (RemoteError, (self.remote_type, self.remote_message, self.remote_traceback))


def qualified_name(kind: type) -> str:
    """``KeyError`` for a builtin, ``module.Class`` otherwise: how a remote error names its type."""
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def error_to_text(error: BaseException, limit: int = 8192) -> str:
    """``error`` as JSON text that travels between processes without pickling (at most ``limit`` UTF-8 bytes: the
    head of a huge traceback is dropped first). `error_from_text` rebuilds it."""
    import json

    if isinstance(error, LayoutError):
        record = {"layout": [list(error.key), error.expected, error.got]}
    elif isinstance(error, PeerFailureError):
        record = {"peer": str(error)}
    else:
        remote = error if isinstance(error, RemoteError) else RemoteError.from_exception(error)
        record = {"remote": [remote.remote_type, remote.remote_message, remote.remote_traceback]}
    text = json.dumps(record)
    if len(text.encode()) > limit and "remote" in record:
        record["remote"][2] = record["remote"][2][-(limit // 2):]
        record["remote"][1] = record["remote"][1][: limit // 4]
        text = json.dumps(record)
    return text


def error_from_text(text: str | bytes) -> BaseException:
    """The error `error_to_text` wrote; text that is not such a record becomes a `RemoteError` saying
    so (nothing in it is executed)."""
    import json

    try:
        record = json.loads(text)
        if "layout" in record:
            key, expected, got = record["layout"]
            return LayoutError(tuple(str(k) for k in key), str(expected), str(got))
        if "peer" in record:
            return PeerFailureError(str(record["peer"]))
        kind, message, tb = record["remote"]
        return RemoteError(str(kind), str(message), str(tb))
    except (ValueError, KeyError, TypeError):
        return RemoteError("unknown", "the peer's error text could not be read (cut off or malformed)")
