"""A run's checkpoint as a recipe sees it: hand back what was saved, keep a snapshot at each batch boundary.

A recipe calls :meth:`Checkpoint.restore` once (``None``: a fresh start) and :meth:`Checkpoint.step` after each
batch with a function that returns its state. ``step`` copies that state at once (tensors cloned), so the snapshot
is consistent at that boundary however training goes on, and writes it every ``every`` frames; whoever runs the
recipe calls :meth:`Checkpoint.save` at the end or when the run stops early, which writes the last snapshot.

A file is complete or absent: it is written to a temporary file beside ``checkpoint.pt``, synced, then renamed
over it, so a write that fails (a full disk, a second Ctrl-C) leaves the previous checkpoint as it was. What is
written is tensors and plain data only (a TensorDict or a numpy array is stored as tensors and rebuilt), so
loading it never runs pickled code (``torch.load(weights_only=True)``); a state holding anything else is refused
before a byte is written, naming where in the state it sits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
from typing import Any, Callable, Mapping

log = logging.getLogger(__name__)

FORMAT = 1
"""The layout of a checkpoint file; a file of another layout is refused when loaded."""

_TENSORDICT, _NDARRAY = "__tensordict__", "__ndarray__"


class Checkpoint:
    """Saves a recipe's state at batch boundaries and hands it back when the run resumes.

    The default (no ``path``) never writes, and ``restore`` returns ``None``: recipes and tests that build
    :class:`~recipes.base.Clients` themselves keep working.

    Args:
        path: the checkpoint file (``None``: never write).
        every: frames between writes (``0``: only when :meth:`save` is called).
        restored: the checkpoint this run continues from (what :func:`load` returned), or ``None``.
        extras: more state read when a checkpoint is written, by name (``{"replay": replay.state_dict}``); an
            extra that cannot be read stops that write (the previous checkpoint stays).
        before_write: called before each write (the launcher flushes the logger there, so every value logged up to
            the checkpoint's frame is on disk when the checkpoint is).

    Example:
        >>> state = clients.checkpoint.restore()
        >>> if state is not None:
        ...     net.load_state_dict(state["net"])
        >>> for batch in clients.collector:
        ...     ...
        ...     clients.checkpoint.step(frames, lambda: {"net": net.state_dict()}, policy_version=version)
    """

    def __init__(self, path: str | None = None, every: int = 0, *, restored: Mapping[str, Any] | None = None,
                 extras: Mapping[str, Callable[[], Any]] | None = None, before_write: Callable[[], None] | None = None):
        if every < 0:
            raise ValueError(f"every must be >= 0 frames, got {every!r}")
        self.path, self.every = path, every
        self.restored = dict(restored) if restored is not None else None
        self.extras = dict(extras or {})
        self.before_write = before_write
        self._last: tuple[int, int, Any] | None = None  # (frames, policy version, state) of the last step()
        start = int(self.restored["frames"]) if self.restored else 0
        self._next = self._after(start)

    @property
    def enabled(self) -> bool:
        """Whether this checkpoint writes files."""
        return self.path is not None

    def restore(self) -> Any | None:
        """The recipe's state as it was saved, or ``None`` for a fresh start."""
        return None if self.restored is None else self.restored.get("recipe")

    def step(self, frames: int, state: Callable[[], Any], *, policy_version: int | None = None) -> bool:
        """A batch boundary: keep a copy of ``state()`` and write it if ``every`` frames have passed.

        Args:
            frames: frames collected so far (the logger's step of this batch's values).
            state: returns the recipe's state (module and optimizer state dicts, counters, RNG state...).
            policy_version: the weight-sync version of the weights in ``state`` (a resumed run's pushes continue
                from it).

        Returns:
            Whether a checkpoint was written.

        Raises:
            TypeError: the state holds something other than tensors and plain data (see :func:`encode`).
        """
        if not self.enabled:
            return False
        # one assignment, once the copy is complete: an interrupt before it keeps the previous snapshot whole
        version = policy_version if policy_version is not None else (self._last[1] if self._last else self._version())
        self._last = (int(frames), int(version), _copy(encode(state())))
        if self.every and self._last[0] >= self._next:
            self._next = self._after(self._last[0])
            return self.save()
        return False

    def save(self, *, finished: Mapping[str, Any] | None = None) -> bool:
        """Write the last snapshot to ``path`` (atomically); nothing is written before the first :meth:`step`.

        Args:
            finished: how the run ended when it ended on its own (``{"solved": ..., "frames": ...}``); a resumed
                run that had finished does not train again.

        Returns:
            Whether a checkpoint was written.

        Raises:
            TypeError: an extra holds something other than tensors and plain data (nothing is written).
            OSError: the file could not be written (the previous checkpoint is intact).
        """
        last = self._last
        if not self.enabled or last is None:
            return False
        frames, version, state = last
        payload = {"format": FORMAT, "frames": frames, "policy_version": version,
                   "finished": dict(finished) if finished is not None else None, "recipe": state}
        if self.before_write is not None:
            self.before_write()
        for name, read in self.extras.items():
            payload[name] = encode(read(), name)
        write_atomically(payload, self.path)
        log.info("checkpoint at %d frames written to %s", frames, self.path)
        return True

    @property
    def frames(self) -> int:
        """The frame count of the last snapshot (of the restored checkpoint before the first :meth:`step`)."""
        if self._last is not None:
            return self._last[0]
        return int(self.restored["frames"]) if self.restored else 0

    def _version(self) -> int:
        return int(self.restored.get("policy_version") or 0) if self.restored else 0

    def _after(self, frames: int) -> int:
        return (frames // self.every + 1) * self.every if self.every else 0


# ---------------------------------------------------------------------------------------------- files
def _temporary_name(path: str) -> str:
    return f".{os.path.basename(path)}.{os.getpid()}-{secrets.token_hex(4)}.tmp"


def remove_leftovers(path: str) -> list[str]:
    """Remove the temporary files that writes of ``path`` by processes other than this one left beside it (a run
    killed outright while writing its checkpoint). Call it only while no other process writes ``path``: the launcher
    does once it holds the run directory's lock. Returns the names removed."""
    folder, name = os.path.split(os.path.abspath(path))
    pattern = re.compile(rf"\.{re.escape(name)}\.(\d+)-[0-9a-f]+\.tmp")
    removed = []
    try:
        entries = os.listdir(folder)
    except FileNotFoundError:
        return removed
    for entry in entries:
        match = pattern.fullmatch(entry)
        if match and int(match[1]) != os.getpid():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, entry))
                removed.append(entry)
    return removed


def write_atomically(payload: Mapping[str, Any], path: str) -> None:
    """``torch.save`` ``payload`` to a temporary file beside ``path``, sync it, rename it over ``path``."""
    import torch

    folder = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(folder, _temporary_name(path))
    try:
        with open(tmp, "xb") as f:  # a new file of our own, with the permissions the umask gives
            try:
                torch.save(dict(payload), f)
            except RuntimeError as exc:  # torch's writer reports a failed write (a full disk...) as its own error
                cause = exc.__context__ if isinstance(exc.__context__, OSError) else exc
                raise OSError(getattr(cause, "errno", None), f"writing {path} failed: {cause}") from exc
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:  # the last checkpoint stays as it was
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename is None:  # the disk's names no file
            raise OSError(exc.errno, os.strerror(exc.errno), path) from exc
        raise
    try:  # the rename itself survives a crash once the directory is synced
        dir_fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def load(path: str) -> dict:
    """Read a checkpoint written by :class:`Checkpoint` (tensors on the CPU; no pickled code runs).

    Raises:
        ValueError: the file is not a checkpoint of this layout.
    """
    import torch

    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - unreadable for any reason: say which file
        raise ValueError(f"{path} is not a readable checkpoint: {exc}") from exc
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not a checkpoint of format {FORMAT}")
    return {k: decode(v) for k, v in payload.items()}


# ---------------------------------------------------------------------------------------------- state as plain data
def _copy(obj: Any) -> Any:
    """A copy of encoded state that shares no storage with it: tensors cloned, containers rebuilt."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: _copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_copy(v) for v in obj)
    return obj  # numbers, strings, dtypes: immutable


def encode(obj: Any, where: str = "recipe") -> Any:
    """``obj`` as tensors and plain data (TensorDicts and numpy arrays marked, to be rebuilt by :func:`decode`).

    Raises:
        TypeError: a value of another kind, named by its place in ``obj`` (e.g. ``recipe['opt']``).
    """
    import numpy as np
    import torch
    from tensordict import TensorDictBase

    if obj is None or isinstance(obj, (bool, int, float, str, torch.dtype, torch.Size)):
        return obj
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, TensorDictBase):
        return {_TENSORDICT: encode(obj.to_dict(), where), "batch_size": list(obj.batch_size)}
    if isinstance(obj, np.ndarray):
        return {_NDARRAY: torch.from_numpy(np.ascontiguousarray(obj))}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Mapping):
        return {k: encode(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        out = [encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        return tuple(out) if isinstance(obj, tuple) else out
    raise TypeError(f"{where} is a {type(obj).__name__}: a checkpoint holds tensors, TensorDicts, numpy arrays, "
                    "numbers, strings and lists or dicts of them")


def decode(obj: Any) -> Any:
    """Undo :func:`encode`: rebuild the TensorDicts and numpy arrays."""
    if isinstance(obj, dict):
        if _TENSORDICT in obj:
            from tensordict import TensorDict

            return TensorDict(decode(obj[_TENSORDICT]), batch_size=obj["batch_size"])
        if _NDARRAY in obj:
            return obj[_NDARRAY].numpy()
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(decode(v) for v in obj)
    return obj
