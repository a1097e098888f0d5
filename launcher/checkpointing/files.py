"""A checkpoint file: its format, how a state becomes tensors and plain data, and how the file is written and read.

A file is complete or absent: it is written to a temporary file beside ``checkpoint.pt``, synced, then renamed
over it, so a write that fails (a full disk, a second Ctrl-C) leaves the previous checkpoint as it was. What is
written is tensors and plain data only (a TensorDict or a numpy array is stored as tensors and rebuilt), so
loading it never runs pickled code (``torch.load(weights_only=True)``); a state holding anything else is refused
before a byte is written, naming where in the state it sits.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from typing import Any, Mapping

FORMAT = 1
"""The layout of a checkpoint file; a file of another layout is refused when loaded."""

_TENSORDICT, _NDARRAY = "__tensordict__", "__ndarray__"


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
    """Read a checkpoint written by `Checkpoint` (tensors on the CPU; no pickled code
    runs).

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
def copy_state(obj: Any) -> Any:
    """A copy of encoded state that shares no storage with it: tensors cloned, containers rebuilt."""
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: copy_state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(copy_state(v) for v in obj)
    return obj  # numbers, strings, dtypes: immutable


def encode(obj: Any, where: str = "recipe") -> Any:
    """``obj`` as tensors and plain data (TensorDicts and numpy arrays marked, to be rebuilt by `decode`).

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
    """Undo `encode`: rebuild the TensorDicts and numpy arrays."""
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
