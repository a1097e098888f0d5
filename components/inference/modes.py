"""Interaction modes: whether a policy samples its actions (``random``, what collection does) or takes its most
likely ones (``deterministic``, what evaluation does).

The mode is tensordict's process-wide interaction type (`tensordict.nn.set_interaction_type`), which the
built-in policies read (`acts_deterministically`) as TorchRL's probabilistic modules do. The inference server
runs every forward under a mode: its ``interaction_mode``, or the mode a request is stamped with. A client stamps its
requests (``MODE_KEY``, one ``uint8`` code per row) when it is given a mode or called inside a
``set_interaction_type`` block; an unstamped request is served in the server's mode.
"""

from __future__ import annotations

import torch
from tensordict.nn import InteractionType, interaction_type, set_interaction_type

MODES = ("random", "deterministic")
"""The modes a server serves in (``components.inference.interaction_mode``) and a client stamps."""

MODE_KEY = "interaction_mode"
"""The request key of a row's stamped mode (``uint8``; `CODES`)."""

CODES = {"random": 1, "deterministic": 2}
"""Each mode's stamp (0: none)."""

_NAMES = {code: name for name, code in CODES.items()}
_TYPES = {"random": InteractionType.RANDOM, "deterministic": InteractionType.DETERMINISTIC}
_OF_TYPE = {InteractionType.RANDOM: "random", InteractionType.DETERMINISTIC: "deterministic",
            InteractionType.MODE: "deterministic", InteractionType.MEAN: "deterministic"}


def check_mode(mode: str) -> str:
    """``mode`` if it is one of `MODES`.

    Raises:
        ValueError: naming the modes there are.
    """
    if mode not in CODES:
        raise ValueError(f"interaction mode must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def ambient_mode() -> str | None:
    """The mode of the caller's active ``set_interaction_type`` block (``mode`` and ``mean`` count as
    ``deterministic``), or ``None`` outside one."""
    kind = interaction_type()
    return None if kind is None else _OF_TYPE[kind]


def acts_deterministically() -> bool:
    """Whether a policy should take its most likely action now (the mode in force is not ``random``; none in force
    means sampling, as collection does)."""
    kind = interaction_type()
    return kind is not None and kind is not InteractionType.RANDOM


def serving(mode: str) -> set_interaction_type:
    """A context that runs forwards in ``mode``."""
    return set_interaction_type(_TYPES[mode])


def stamp(td, mode: str):
    """``td`` with every row stamped ``mode`` (in place; returned)."""
    td.set(MODE_KEY, torch.full(td.batch_size, CODES[check_mode(mode)], dtype=torch.uint8, device=td.device))
    return td


def modes_of(codes: torch.Tensor) -> list[tuple[str | None, torch.Tensor | None]]:
    """The rows of a batch by stamped mode, as ``(mode, row indices)``; ``[(mode, None)]`` when every row has the same
    (``None``: unstamped rows, served in the server's mode).

    Raises:
        ValueError: a code that names no mode.
    """
    flat = codes.reshape(codes.shape[0], -1)[:, 0] if codes.dim() > 1 else codes
    values = flat.unique().tolist()
    unknown = [v for v in values if v and v not in _NAMES]
    if unknown:
        raise ValueError(f"{MODE_KEY} codes {unknown} name no mode (0: none, "
                         + ", ".join(f"{c}: {n}" for n, c in CODES.items()) + ")")
    if len(values) == 1:
        return [(_NAMES.get(values[0]), None)]
    return [(_NAMES.get(v), (flat == v).nonzero().squeeze(-1)) for v in values]
