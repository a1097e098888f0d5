"""Fresh copies of slot rows, built for the hot path: a copier per leaf view, and a TensorDict of copies made
without the checks that a TensorDict of fresh CPU copies does not need."""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from ..layout import Layout


def lookup_key(key: tuple):
    """The cheapest TensorDict key for a layout key: a string for a top-level key."""
    return key[0] if len(key) == 1 else key


def flat(layout: Layout) -> bool:
    """Whether every leaf of ``layout`` is a top-level key."""
    return all(len(leaf.key) == 1 for leaf in layout)


def copier(view: torch.Tensor):
    """A function returning a fresh copy of ``view`` (a slot's leaf in shared memory). Through numpy where the dtype
    allows: ``Tensor.clone`` of a small tensor costs about twice a numpy copy wrapped by ``torch.from_numpy``.
    Such a copy owns its memory and pickles and shares like any tensor, but cannot be resized in place."""
    try:
        array = view.numpy()
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16...): the torch copy
        return view.clone
    from_numpy = torch.from_numpy
    return lambda: from_numpy(array.copy())


def leaves(pairs) -> list:
    """``(key, copier)`` for ``(key, view)`` pairs: the input of `clones`."""
    return [(key, copier(view)) for key, view in pairs]


def clones(leaves: list, batch_size: torch.Size, device) -> TensorDictBase:
    """A TensorDict of fresh copies of a flat layout's leaves (``(key, copier)`` pairs, see `leaves`),
    built directly: TensorDict.clone costs several times the copies of a small payload. tensordict is pinned;
    ``_new_unsafe`` skips the checks a TensorDict of fresh CPU copies does not need."""
    return TensorDict._new_unsafe({key: copy() for key, copy in leaves}, batch_size=batch_size, device=device,
                                  nested=False)
