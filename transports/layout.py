"""Wire layouts: the fixed shape of the TensorDicts an endpoint moves.

Fixed-layout transports (shared_memory, process_slot, distributed) preallocate from a `Layout` taken
from a representative TensorDict. A layout is plain, picklable data: sorted nested keys, and per leaf the
shape, dtype and device. Validation selects exactly the declared keys (extra keys are dropped, never sent)
and raises `LayoutError` naming the key, what was expected and what came.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator

import torch
from tensordict import TensorDict, TensorDictBase

from .kernel.errors import LayoutError

Key = tuple[str, ...]


@dataclass(frozen=True)
class LeafSpec:
    """One tensor leaf of a layout."""

    key: Key
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str

    def describe(self) -> str:
        """The leaf's shape, dtype and device, as error messages print them."""
        return f"shape {list(self.shape)} dtype {_dtype_name(self.dtype)} device {self.device}"

    @property
    def nbytes(self) -> int:
        """Bytes one tensor of this leaf occupies."""
        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _as_key(key) -> Key:
    return (key,) if isinstance(key, str) else tuple(key)


@dataclass(frozen=True)
class Layout:
    """The wire layout of one endpoint direction (a request, a response, a replay sample...).

    Args:
        leaves: the tensor leaves, sorted by nested key.
        batch_size: the TensorDict batch size the layout was taken from.

    Examples:
        >>> td = TensorDict({"observation": torch.zeros(4)})
        >>> layout = Layout.from_tensordict(td)
        >>> layout.keys
        [('observation',)]
        >>> layout.validate(TensorDict({"observation": torch.ones(4), "extra": torch.ones(1)})).keys()
        _StringKeys(dict_keys(['observation']))
    """

    leaves: tuple[LeafSpec, ...]
    batch_size: tuple[int, ...] = ()

    @classmethod
    def from_tensordict(cls, td: TensorDictBase) -> "Layout":
        """Take the layout of a representative TensorDict.

        Raises:
            LayoutError: a leaf is not a tensor (fixed layouts move tensors only).
        """
        leaves = []
        for key in td.keys(include_nested=True, leaves_only=True, is_leaf=_any_leaf):
            key = _as_key(key)
            value = td.get(key)
            if not isinstance(value, torch.Tensor):
                raise LayoutError(
                    key,
                    "a tensor leaf",
                    f"{type(value).__name__}",
                    hint="fixed-layout transports move tensors only; use transport 'queue' for non-tensor data",
                )
            leaves.append(LeafSpec(key, tuple(value.shape), value.dtype, str(value.device)))
        leaves.sort(key=lambda leaf: leaf.key)
        return cls(tuple(leaves), tuple(td.batch_size))

    @property
    def keys(self) -> list[Key]:
        """The nested keys of the leaves, in layout order."""
        return [leaf.key for leaf in self.leaves]

    @property
    def nbytes(self) -> int:
        """Bytes one payload of this layout occupies."""
        return sum(leaf.nbytes for leaf in self.leaves)

    def __iter__(self) -> Iterator[LeafSpec]:
        return iter(self.leaves)

    def validate(self, td: TensorDictBase) -> TensorDictBase:
        """Check ``td`` against the layout and return a TensorDict holding exactly the declared keys.

        Raises:
            LayoutError: a declared key is missing, or its value has another type, shape, dtype or device.
        """
        if not isinstance(td, TensorDictBase):
            raise LayoutError((), "a TensorDict", type(td).__name__)
        out = {}
        for leaf in self.leaves:
            value = td.get(leaf.key, None)
            if value is None:
                raise LayoutError(leaf.key, leaf.describe(), "a missing key")
            if not isinstance(value, torch.Tensor):
                raise LayoutError(
                    leaf.key,
                    leaf.describe(),
                    type(value).__name__,
                    hint="fixed-layout transports move tensors only; use transport 'queue' for non-tensor data",
                )
            if tuple(value.shape) != leaf.shape:
                raise LayoutError(leaf.key, f"shape {list(leaf.shape)}", f"shape {list(value.shape)}")
            if value.dtype != leaf.dtype:
                raise LayoutError(leaf.key, f"dtype {_dtype_name(leaf.dtype)}", f"dtype {_dtype_name(value.dtype)}")
            if str(value.device) != leaf.device:
                raise LayoutError(leaf.key, f"device {leaf.device}", f"device {value.device}")
            out[leaf.key] = value
        result = TensorDict(batch_size=self.batch_size)
        for key, value in out.items():
            result.set(key, value)
        return result

    def validate_stacked(self, td: TensorDictBase, n: int) -> TensorDictBase:
        """Like `validate` for ``n`` payloads stacked along a new leading dimension."""
        if not isinstance(td, TensorDictBase):
            raise LayoutError((), "a TensorDict", type(td).__name__)
        out = TensorDict(batch_size=(n, *self.batch_size))
        for leaf in self.leaves:
            value = td.get(leaf.key, None)
            if value is None:
                raise LayoutError(leaf.key, leaf.describe(), "a missing key")
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != (n, *leaf.shape) or value.dtype != leaf.dtype:
                got = (f"shape {list(value.shape)[1:]} dtype {_dtype_name(value.dtype)}"
                       if isinstance(value, torch.Tensor) else type(value).__name__)
                raise LayoutError(leaf.key, f"shape {list(leaf.shape)} dtype {_dtype_name(leaf.dtype)}", got)
            out.set(leaf.key, value)
        return out

    def zeros(self, *leading: int) -> TensorDict:
        """A zero TensorDict of this layout, with optional extra leading dimensions (a slot bank)."""
        td = TensorDict(batch_size=tuple(leading) + self.batch_size)
        for leaf in self.leaves:
            td.set(leaf.key, torch.zeros(tuple(leading) + leaf.shape, dtype=leaf.dtype, device=leaf.device))
        return td

    def to_text(self) -> str:
        """The layout as JSON text (what a connecting client announces; read back with `from_text`)."""
        return json.dumps({"batch_size": list(self.batch_size),
                           "leaves": [[list(l.key), list(l.shape), _dtype_name(l.dtype), l.device] for l in self.leaves]})

    @classmethod
    def from_text(cls, text: str | bytes, *, max_bytes: int = 1 << 30) -> "Layout":
        """Read a layout written by `to_text` from an untrusted peer: only plain JSON is parsed (nothing is
        executed or unpickled), dtypes come from a fixed list, and a payload over ``max_bytes`` is refused.

        Raises:
            LayoutError: the text is not a valid layout.
        """
        try:
            record = json.loads(text)
            batch_size = tuple(_count(n) for n in record["batch_size"])
            leaves = []
            for key, shape, dtype, device in record["leaves"]:
                if not key or not all(isinstance(k, str) and k for k in key) or not isinstance(device, str):
                    raise ValueError(f"bad key or device {key!r} {device!r}")
                if dtype not in _DTYPES:
                    raise ValueError(f"dtype {dtype!r} is not one a layout may hold")
                torch.device(device)
                leaves.append(LeafSpec(tuple(key), tuple(_count(n) for n in shape), _DTYPES[dtype], device))
        except (ValueError, KeyError, TypeError, RuntimeError) as exc:
            raise LayoutError((), "a layout (JSON: batch_size and leaves)", f"unreadable text ({exc})") from None
        layout = cls(tuple(sorted(leaves, key=lambda leaf: leaf.key)), batch_size)
        if len({leaf.key for leaf in leaves}) != len(leaves) or layout.nbytes > max_bytes:
            raise LayoutError((), f"distinct keys and at most {max_bytes} bytes", f"{layout.nbytes} bytes, "
                              f"{len(leaves)} leaves")
        return layout

    def describe(self) -> str:
        """One line per leaf: ``key shape dtype``."""
        return "; ".join(f"{'.'.join(leaf.key)} {list(leaf.shape)} {_dtype_name(leaf.dtype)}" for leaf in self.leaves)


_DTYPES = {_dtype_name(d): d for d in (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                                       torch.float16, torch.bfloat16, torch.float32, torch.float64)}


def _count(n) -> int:
    if type(n) is not int or not 0 <= n < 1 << 40:
        raise ValueError(f"{n!r} is not a size")
    return n


def _any_leaf(cls) -> bool:
    # Treat anything that is not a TensorDict as a leaf, so non-tensor values are seen (and refused).
    return not issubclass(cls, TensorDictBase)
