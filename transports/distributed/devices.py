"""Where each side of a ``distributed`` endpoint keeps its payload, and what is refused.

- The two sides' layouts agree on keys, shapes and dtypes; each side keeps the payload on the devices its own
  layouts name.
- ``gloo`` moves host memory: a leaf on another device is copied into the message on the way out and onto its
  layout's device on the way in. A server built without layouts of its own (a Ray owner discovering them) keeps what
  it receives on the CPU.
- ``nccl`` moves CUDA tensors, and NCCL needs one device per rank. Each side's payload lives on one CUDA device: the
  one its own layouts name, requests and responses alike (``cuda:<index>``, as a tensor's device reads); the two
  sides' device indexes may differ (the server on ``cuda:0``, a client on ``cuda:1``). A server built without
  layouts of its own keeps what it receives on its process's current CUDA device (``torch.cuda.set_device``, else
  ``cuda:0``).
- Two sides of one ``nccl`` endpoint on the same GPU are refused when the client connects: each announces its GPU's
  UUID, which sees through ``CUDA_VISIBLE_DEVICES`` renumbering (two processes may both call their GPU ``cuda:0``).

The checks are plain functions of layouts and device names, so every refusal is tested on machines without CUDA.
"""

from __future__ import annotations

from typing import Iterable

from ..kernel.errors import ConfigurationError, LayoutError, TransportError
from ..layout import LeafSpec, Layout

PATH = "transport_options.backend"


def side_device(layouts: Iterable[Layout | None], backend: str, side: str = "this side") -> str | None:
    """The one CUDA device a side's nccl payloads live on: ``None`` for gloo (each leaf on its own layout's device,
    through host memory) and for a side without leaves.

    Args:
        layouts: the side's layouts (requests and responses; ``None`` for one not bound yet).
        backend: ``gloo`` or ``nccl``.
        side: names the side in messages (``the server``, ``the client``).

    Raises:
        ConfigurationError: nccl with a leaf that is not on a CUDA device given with its index, or with leaves on two
            devices.
    """
    if backend != "nccl":
        return None
    leaves: list[LeafSpec] = [leaf for layout in layouts if layout is not None for leaf in layout]
    devices = sorted({leaf.device for leaf in leaves})
    for leaf in leaves:
        if not _indexed_cuda(leaf.device):
            raise ConfigurationError(
                f"backend 'nccl' moves CUDA tensors, and {side}'s payload key {'.'.join(leaf.key)!r} is on "
                f"{leaf.device}: give each side's payload one CUDA device (cuda:<index>), or use backend 'gloo' for "
                "CPU tensors", path=PATH, alternatives=("gloo",))
    if len(devices) > 1:
        raise ConfigurationError(
            f"backend 'nccl' needs one device per rank, and {side}'s payloads are on {', '.join(devices)}: put all of "
            "this side's requests and responses on one CUDA device", path=PATH)
    return devices[0] if devices else None


def _indexed_cuda(device: str) -> bool:
    kind, _, index = device.partition(":")
    return kind == "cuda" and index.isdigit()


def on_device(layout: Layout | None, device: str | None) -> Layout | None:
    """``layout`` with every leaf on ``device`` (unchanged where either is ``None``): an announced layout as this side
    keeps it."""
    if layout is None or device is None:
        return layout
    return Layout(tuple(LeafSpec(leaf.key, leaf.shape, leaf.dtype, device) for leaf in layout), layout.batch_size)


def matches(mine: Layout, theirs: Layout) -> bool:
    """Whether a peer's announced layout is the one this side insists on: the same keys, shapes, dtypes and batch
    size (each side keeps the payload on its own devices)."""
    return mine.batch_size == theirs.batch_size and len(mine.leaves) == len(theirs.leaves) and all(
        (a.key, a.shape, a.dtype) == (b.key, b.shape, b.dtype) for a, b in zip(mine, theirs))


def check_layout_device(layout: Layout, backend: str, what: str) -> None:
    """Refuse an announced layout the backend cannot move: with nccl, a leaf off CUDA.

    Raises:
        LayoutError: naming the key and its device.
    """
    for leaf in layout if backend == "nccl" else ():
        if not _indexed_cuda(leaf.device):
            raise LayoutError(leaf.key, f"a CUDA tensor ({what} over nccl)", f"device {leaf.device}")


def gpu_uuid(device: str) -> str:
    """The UUID of the GPU behind ``device`` (``cuda:<index>``) in this process (where torch reports none, its PCI
    address, as unique on a node)."""
    import torch

    props = torch.cuda.get_device_properties(torch.device(device))
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        return str(uuid)
    return "pci " + ":".join(str(getattr(props, f"pci_{part}_id", "?")) for part in ("domain", "bus", "device"))


def check_apart(mine: str | None, theirs: str | None, my_device: str | None, their_device: str | None) -> None:
    """Refuse an nccl endpoint whose two sides would use the same GPU (``mine`` and ``theirs``: the GPUs' UUIDs).

    Raises:
        TransportError: naming both sides' devices.
    """
    if mine is not None and mine == theirs:
        raise TransportError(
            f"backend 'nccl' needs one device per rank, and both sides of this endpoint are on the same GPU (the "
            f"server's {my_device}, the client's {their_device}, GPU {mine}): give the client's payload another CUDA "
            "device, or use backend 'gloo' between processes that share a GPU")
