"""Replay operations over a payload transport (``distributed``): the tensors of ``extend``, ``sample`` and
``update_priority`` travel over fixed-layout channels while every other operation stays a command.

Each operation's layout is bound by its first call, which goes over the command channel (and is applied
there, once); its request and answer fix the layouts of that operation's channel for this client in this
process. Later calls with another layout raise `LayoutError` in the caller (other keys,
shapes or dtypes; a ``sample`` of another size): never a silent fallback to commands. ``extend`` batches of a
new length (a learner's first, shorter n-step batch) bind one more channel each, up to `MAX_EXTEND_SIZES`.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Mapping, Sequence

import torch
from tensordict import TensorDict, TensorDictBase

from transports.kernel.errors import LayoutError
from transports.layout import Layout


def _extend(storage: Any, request: TensorDictBase) -> TensorDict:
    index = storage.extend(request)
    answer = extend_answer(request.batch_size)
    answer["index"][: len(index)] = index
    return answer


def extend_answer(batch_size: Sequence[int]) -> TensorDict:
    """The answer of an ``extend`` of ``batch_size`` rows: one position per row, in row order, ``-1`` padding the
    end where an extend-time filter dropped rows (the client keeps only the positions, see `positions`)."""
    return TensorDict({"index": torch.full((math.prod(batch_size),), -1, dtype=torch.int64)})


def positions(answer: TensorDictBase) -> torch.Tensor:
    """What ``extend`` returns from its channel answer: the positions written, without the padding."""
    index = answer["index"]
    return index[index >= 0]


def _sample(storage: Any, request: TensorDictBase) -> TensorDictBase:
    return storage.sample(int(request["batch_size"]))


def _update_priority(storage: Any, request: TensorDictBase) -> TensorDict:
    storage.update_priority(request["index"], request["priority"])
    return TensorDict()


MAX_EXTEND_SIZES = 8
"""Distinct ``extend`` lengths one client binds a channel for; another length then raises LayoutError."""

SERVER_OPS: dict[str, Callable] = {"extend": _extend, "sample": _sample, "update_priority": _update_priority}
"""What the owner runs for each payload operation (see `components.commands.PayloadLoop`)."""


def explicit_operations(layouts: Mapping[str, Any]) -> dict[str, tuple[Layout, Layout]]:
    """The ``{operation: (request layout, response layout)}`` of explicit replay layouts: ``extend`` (a batch as
    written), ``sample`` (a sample as returned: its batch size fixes the sample size) and ``update_priority``
    (``index`` and ``priority``; seeded from the sample size when not given).

    Raises:
        ConfigurationError: an operation that is not one of these.
    """
    from transports.kernel.errors import ConfigurationError

    def layout(value: Any) -> Layout:
        return value if isinstance(value, Layout) else Layout.from_tensordict(value)

    unknown = set(layouts) - set(SERVER_OPS)
    if unknown:
        raise ConfigurationError(f"no replay operation {sorted(unknown)[0]!r} takes a layout",
                                 path="components.replay.layouts", alternatives=tuple(SERVER_OPS))
    ops = {}
    if "extend" in layouts:
        request = layout(layouts["extend"])
        ops["extend"] = (request, Layout.from_tensordict(extend_answer(request.batch_size)))
    if "sample" in layouts:
        sample = layout(layouts["sample"])
        n = sample.batch_size[0]
        ops["sample"] = (Layout.from_tensordict(TensorDict({"batch_size": torch.tensor(0)})), sample)
        ops["update_priority"] = (Layout.from_tensordict(TensorDict(
            {"index": torch.zeros(n, dtype=torch.int64), "priority": torch.zeros(n)})), Layout.from_tensordict(TensorDict()))
    if "update_priority" in layouts:
        ops["update_priority"] = (layout(layouts["update_priority"]), Layout.from_tensordict(TensorDict()))
    return ops


class PayloadChannels:
    """The per-operation channels of one replay client, bound by each operation's first call (or up front, for
    operations with explicit layouts: their first call goes over gloo too).

    Args:
        endpoint: an unbound client of the owner's payload transport.
        call: ``call(method, *args)``: one command over the command channel.
        operations: explicit ``{operation: (request layout, response layout)}`` (see `explicit_operations`).
    """

    def __init__(self, endpoint: Any, call: Callable, operations: Mapping[str, tuple] | None = None):
        self.endpoint, self._call = endpoint, call
        self._bound: dict[Any, Any] = {}
        self._sample_size: int | None = None
        self._explicit_extend = operations["extend"][0].batch_size if operations and "extend" in operations else None
        self._lock = threading.Lock()
        for op, (request, response) in (operations or {}).items():
            key = ("extend", request.batch_size) if op == "extend" else op
            self._bound[key] = endpoint.bind(op, request, response)
            if op == "sample":
                self._sample_size = response.batch_size[0]

    def extend(self, batch: TensorDictBase) -> torch.Tensor:
        """Write the rows of ``batch``; the storage positions written, in row order.

        The first extend of a row count goes as a command and binds a channel for that count; later ones of the same
        count go over the channel.

        Raises:
            LayoutError: the rows differ from those of the first extend, or a new row count is one too many.
        """
        rows = tuple(batch.batch_size)
        channel = self._bound.get(("extend", rows))
        if channel is not None:
            return positions(channel.submit(batch).result())
        if self._explicit_extend is not None:
            raise LayoutError(("batch_size",), f"{list(self._explicit_extend)} (the explicit extend layout)",
                              str(list(rows)))
        request = Layout.from_tensordict(batch)  # a layout that cannot travel fails here, before anything is written
        row = _row_layout(request)
        bound = [key for key in self._bound if key[0] == "extend"]
        if bound:
            first = _row_layout(self._bound[bound[0]].request_layout)
            if row != first:
                raise LayoutError((), f"rows of {first.describe()} (fixed by this endpoint's first extend)",
                                  row.describe())
            if len(bound) >= MAX_EXTEND_SIZES:
                raise LayoutError(("batch_size",), f"one of the lengths bound already {sorted(k[1] for k in bound)}",
                                  str(list(rows)), hint=f"at most {MAX_EXTEND_SIZES} extend lengths per endpoint")
        index = self._call("extend", batch)
        self._bind(("extend", rows), request, extend_answer(rows))
        return index

    def sample(self, n: int) -> TensorDictBase:
        """Sample ``n`` transitions: the first as a command (which binds the sample channel), then over the channel.

        Raises:
            LayoutError: ``n`` differs from the first sample's size.
        """
        channel = self._bound.get("sample")
        if channel is not None:
            if n != self._sample_size:
                raise LayoutError(("batch_size",), f"{self._sample_size} (fixed by this endpoint's first sample)",
                                  str(n), hint="the sample layout of a distributed replay endpoint is fixed")
            return channel.submit(TensorDict({"batch_size": torch.tensor(n)})).result()
        out = self._call("sample", n)
        self._sample_size = n
        self._bind("sample", TensorDict({"batch_size": torch.tensor(n)}), out)
        return out

    def update_priority(self, index: Any, priority: Any) -> None:
        """Set the priorities of the transitions at ``index`` (over the channel once one is bound)."""
        request = TensorDict({"index": torch.as_tensor(index), "priority": torch.as_tensor(priority)})
        channel = self._bound.get("update_priority")
        if channel is not None:
            channel.submit(request).result()
            return
        Layout.from_tensordict(request)
        self._call("update_priority", request["index"], request["priority"])
        self._bind("update_priority", request, TensorDict())

    def _bind(self, key: Any, request: Any, response: Any) -> None:
        op = key[0] if isinstance(key, tuple) else key
        with self._lock:
            self._bound.setdefault(key, self.endpoint.bind(op, request, response))


def _row_layout(layout: Layout) -> Layout:
    """The layout of one row of a batch layout (its first batch dimension dropped)."""
    from transports.layout import LeafSpec

    return Layout(tuple(LeafSpec(leaf.key, leaf.shape[1:], leaf.dtype, leaf.device) for leaf in layout),
                  layout.batch_size[1:])
