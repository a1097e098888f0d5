"""The clients of a weight sync, one per transport kind: an in-process board (``direct``), a shared-memory
state dict (``shared_memory``) and an actor's versions (``ray``). Each has ``push``, ``poll``, ``pull`` and
``version``, and no lifecycle methods."""

from __future__ import annotations

import math
import time
from typing import Mapping

import numpy as np
import torch
from torch import nn

from transports import local as _local
from transports.kernel.errors import LayoutError
from transports.segments import Segment

from ..commands import CommandClient

StateDict = Mapping[str, torch.Tensor]


def state_of(weights: nn.Module | StateDict) -> dict[str, torch.Tensor]:
    """The named tensors of ``weights``: a module's ``state_dict`` or the mapping itself."""
    return dict(weights.state_dict() if isinstance(weights, nn.Module) else weights)


def on_host(state: StateDict) -> dict[str, torch.Tensor]:
    """``state``'s tensors, detached, on the host: those on the host as they are (not copied), those on a device
    (a CUDA learner's) copied in one pass that waits for each device once, not once per tensor (a copy into pageable
    memory would wait on its own).

    Args:
        state: named tensors anywhere.
    """
    out: dict[str, torch.Tensor] = {}
    devices = set()
    for name, tensor in state.items():
        tensor = tensor.detach()
        if tensor.device.type == "cpu":
            out[name] = tensor
        else:  # into pinned memory, without waiting
            out[name] = tensor.to("cpu", non_blocking=True)
            devices.add(tensor.device)
    for device in devices:
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
    return out


def copy_into(module: nn.Module, state: StateDict) -> None:
    """Copy ``state`` into ``module``'s tensors in place, so views others hold of them see the new values, wherever
    either lives (a CUDA server's tensors take a host state, or a CUDA learner's, without being replaced).

    Raises:
        LayoutError: ``state`` lacks one of the module's parameters.
    """
    with torch.no_grad():
        for name, tensor in module.state_dict().items():
            if name not in state:
                raise LayoutError((name,), "a parameter of the receiving module", "a missing key")
            tensor.copy_(state[name])


class RayWeights:
    """The client of a ``ray`` weight sync: the versions live in an actor; tensors travel through Ray's object
    store. ``push``, ``poll``, ``pull`` and ``version``; picklable to any process connected to the cluster.
    A ``poll`` is one actor call (its state only when a newer version exists)."""

    def __init__(self, endpoint):
        self._endpoint = endpoint
        self._calls = CommandClient(endpoint)

    def __reduce__(self):
        return (RayWeights, (self._endpoint,))

    def attached(self) -> "RayWeights":
        """Another client of the same weight sync, sharing no per-process state with this one."""
        return RayWeights(self._endpoint)

    @property
    def version(self) -> int:
        """The latest published version (the owner's ``first_version`` before the first push)."""
        return self._calls._call("_current_version")

    def push(self, weights: nn.Module | StateDict) -> int:
        """Publish ``weights`` (a module or a state dict) as a new version; returns that version.

        The tensors are copied to the host (`on_host`) and sent to the actor in one call.
        """
        state = on_host(state_of(weights))
        return self._calls._call("push", state)

    def poll(self, since: int, into: nn.Module) -> int | None:
        """If a version newer than ``since`` exists, copy it into ``into`` in place and return it; else ``None``.

        One actor call, which carries the state only when a newer version exists.
        """
        newer = self._calls._call("_newer_than", since)
        if newer is None:
            return None
        version, state = newer
        copy_into(into, state)
        return version

    def pull(self) -> tuple[int, StateDict | None]:
        """The latest ``(version, state_dict)``; the state is ``None`` before the first push."""
        return self._calls._call("pull")


class LocalWeights:
    """The client of a ``thread`` weight sync: ``push``, ``poll``, ``pull`` and ``version`` on the owner's board.

    Picklable inside the owner's process only (like the ``thread`` transport's clients).
    """

    def __init__(self, owner_id: tuple[int, int]):
        self._id = owner_id
        self._owner = _local.lookup(*owner_id, "thread")

    def __reduce__(self):
        return (LocalWeights, (self._id,))

    @property
    def version(self) -> int:
        """The latest published version (the owner's ``first_version`` before the first push)."""
        return self._owner.version

    def push(self, weights: nn.Module | StateDict) -> int:
        """Publish ``weights`` (a module or a state dict) as a new version; returns that version."""
        return self._owner.push(weights)

    def poll(self, since: int, into: nn.Module) -> int | None:
        """If a version newer than ``since`` exists, copy it into ``into`` in place and return it; else ``None``."""
        return self._owner.poll(since, into)

    def pull(self) -> tuple[int, StateDict | None]:
        """The latest ``(version, state_dict)``; the state is ``None`` before the first push."""
        return self._owner.pull()


class SharedWeights:
    """The client of a ``process`` weight sync: a state dict in shared memory plus a sequence counter.

    Picklable by segment name: it attaches wherever it is unpickled. Has ``push``, ``poll``, ``pull`` and
    ``version``, no lifecycle methods.
    """

    def __init__(self, layout: list, header, data):
        self._layout = layout
        self._header, self._data = header, data
        self._counters = np.frombuffer(header.buf, dtype=np.int64, count=2)  # [sequence, version]
        self._views = {
            name: torch.frombuffer(data.buf, dtype=dtype, count=max(math.prod(shape), 1), offset=offset)[: math.prod(shape)].view(shape)
            for name, shape, dtype, offset in layout
        }

    @classmethod
    def create(cls, template: StateDict, first_version: int = 0) -> "SharedWeights":
        """Allocate the shared segments for state dicts shaped like ``template`` (on the owner's side).

        Args:
            template: the names, shapes and dtypes every pushed state dict has.
            first_version: the version before the first push.
        """
        layout, offset = [], 0
        for name in sorted(template):
            t = template[name]
            offset = (offset + 63) // 64 * 64
            layout.append((name, tuple(t.shape), t.dtype, offset))
            offset += max(t.numel(), 1) * t.element_size()
        weights = cls(layout, Segment(16), Segment(offset))
        weights._counters[1] = first_version  # the sequence stays 0 until the first push
        return weights

    def attached(self) -> "SharedWeights":
        """Another client over the same segments, with tensor views of its own."""
        return SharedWeights(self._layout, self._header, self._data)

    def __reduce__(self):
        return (SharedWeights, (self._layout, self._header, self._data))

    @property
    def version(self) -> int:
        """The latest published version (the owner's ``first_version`` before the first push)."""
        return int(self._counters[1])

    def push(self, weights: nn.Module | StateDict) -> int:
        """Write a new version (one writer at a time: the learner); tensors on a device (a CUDA learner's) come to
        the host first (`on_host`), before the version is marked in progress."""
        state = on_host(state_of(weights))
        missing = set(self._views) - set(state)
        if missing:
            raise LayoutError((sorted(missing)[0],), "a parameter of the template", "a missing key")
        counters = self._counters
        counters[0] += 1  # odd: a write is in progress
        with torch.no_grad():
            for name, view in self._views.items():
                view.copy_(state[name])
        counters[1] += 1
        counters[0] += 1  # even: consistent again
        return int(counters[1])

    def _read(self, copy) -> int:
        counters = self._counters
        while True:
            start = int(counters[0])
            if start % 2:
                time.sleep(0)
                continue
            version = int(counters[1])
            copy()
            if int(counters[0]) == start:
                return version

    def poll(self, since: int, into: nn.Module) -> int | None:
        """If a version newer than ``since`` exists, copy it into ``into`` in place and return it."""
        if int(self._counters[0]) == 0 or int(self._counters[1]) <= since:  # nothing pushed yet, or nothing newer
            return None
        return self._read(lambda: copy_into(into, self._views))

    def pull(self) -> tuple[int, StateDict | None]:
        """The latest ``(version, state_dict)``; the state is ``None`` before the first push.

        The tensors are copies, read consistently against a concurrent push.
        """
        if int(self._counters[0]) == 0:  # nothing pushed yet
            return int(self._counters[1]), None
        out: dict[str, torch.Tensor] = {}
        version = self._read(lambda: out.update({k: v.clone() for k, v in self._views.items()}))
        return version, out

    def _release(self) -> None:
        """Detach (the owner's copy also unlinks the segments). Not a client operation: the owner calls it."""
        self._views = {}
        self._counters = None
        self._header.close()
        self._data.close()
