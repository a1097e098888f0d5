"""What a plan holds on the node that runs it, estimated from the plan before anything starts, and the checks of it
against what the node offers (:func:`launcher.checks.check_here` runs them; a dry run does not: it may plan for
another node).

- **Shared memory** (:func:`check_shared_memory`): the segments that the owners and collector workers placed on this
  node make, against the room left in the segment directory (:mod:`transports.segment_dir`: ``/dev/shm`` unless
  ``RLSVC_SHM_DIR`` names another). Counted: a shared-memory weight sync's copy of the policy's state; a slot
  transport's request and response banks (:meth:`~transports.base.RequestReplyTransport.shared_memory_bytes`); a
  replay buffer whose storage is shared (its rows, its ring of frames, the rows of one write staged by its client);
  the rollout slots of each collector worker that hands rollouts over through shared memory (``prefetch`` rollouts of
  its share of a batch). Left out: blocks of a few bytes (status words, doorbells).

Sizes come from the plan: one env step as a collector's rollout holds it (:attr:`LaunchPlan.step`), the policy's state
(:attr:`LaunchPlan.policy_bytes`), the inference server's layouts, each component's options. A replay row is one step,
or ``replay_row_steps`` of them where the recipe's config says so (IMPALA stores whole unrolls); its frame-stack keys
(``components.replay.frames``) are stored as frame serial numbers beside a ring of single frames
(:mod:`components.replay.frames`). The estimates are the bytes the segments take, to within their alignment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from components import compat
from transports.errors import ConfigurationError, NotImplementedYetError
from transports.segment_dir import VARIABLE, remedy, room, room_text, segment_dir, size_text


@dataclass(frozen=True)
class Part:
    """Bytes one component holds on the node.

    Attributes:
        component: the component (``replay``...).
        what: what they are, in words (``storage: 16 rows of 1.7 MiB``).
        nbytes: how many.
        shared: a segment in the segment directory (else the memory of the process it lives in).
    """

    component: str
    what: str
    nbytes: int
    shared: bool = True


def _binding(c):
    return compat.declaration(c.name).binding(c.transport)


def _weight_sync(plan, c) -> list[Part]:
    if not _binding(c).shared_state:
        return []
    return [Part(c.name, "the policy's state", plan.policy_bytes)]


def _inference(plan, c) -> list[Part]:
    from transports.registry import transport_class

    request, response = c.layouts.get("request"), c.layouts.get("response")
    if request is None or response is None:
        return []
    nbytes = transport_class(c.transport).shared_memory_bytes(request, response, dict(c.transport_options))
    return [Part(c.name, "request and response slots", nbytes)] if nbytes else []


def _collector(plan, c) -> list[Part]:
    host = c.host
    if not (host.shares_memory or host.may_share_memory) or plan.step is None:
        return []
    o = c.options
    workers, prefetch = int(o["num_collectors"]), int(o.get("prefetch") or 1)
    steps = int(o["frames_per_batch"] or 0) // max(1, workers)  # a worker's share of a batch, steps of one env
    rollout = steps * plan.step.nbytes
    return [Part(c.name, f"{workers * prefetch} rollout slot(s) of {size_text(rollout)}", workers * prefetch * rollout)]


def replay_row(plan, c) -> tuple[int, int, int]:
    """A replay row's bytes as stored, and the ring of frames a buffer of frame-stack keys keeps beside its rows:
    ``(row bytes, frame slots, bytes per frame slot)`` (no ring: 0 slots)."""
    from components.replay.frames import pool_slots

    steps = int(getattr(plan.recipe_config, "replay_row_steps", 1))
    frames = {tuple(str(key).split(".")) for key in c.options.get("frames") or ()}
    per_step, stack, frame = 0, 0, 0
    for leaf in plan.step:
        if leaf.key in frames and len(leaf.shape) >= 2:  # [stack, *frame]: the frames' serial numbers (int64)
            stack, frame = max(stack, leaf.shape[0]), leaf.nbytes // leaf.shape[0]
            per_step += 8 * leaf.shape[0]
        else:
            per_step += leaf.nbytes
    if not stack:
        return steps * per_step, 0, 0
    return steps * (per_step + 8), pool_slots(int(c.options["capacity"]), stack), frame + 8  # + the oldest's serial


def _rows_per_write(plan, steps: int) -> int:
    """Rows of one ``extend``: one collector batch (a worker's share of it where workers hand over on their own)."""
    try:
        collector = plan["collector"].options
    except KeyError:
        return 0
    frames = int(collector["frames_per_batch"] or 0)
    if not collector.get("sync", True):
        frames //= max(1, int(collector["num_collectors"]))
    return math.ceil(frames / max(1, steps))


def _replay(plan, c) -> list[Part]:
    if plan.step is None:
        return []
    o = c.options
    capacity, shared = int(o["capacity"]), _binding(c).shared_state
    row, slots, slot = replay_row(plan, c)
    parts = []
    if o["storage"] == "memory":
        parts.append(Part(c.name, f"storage of {capacity:,} rows of {size_text(row)}", capacity * row, shared))
        if shared:
            parts.append(Part(c.name, "write generations", 8 * capacity))
    if slots:
        parts.append(Part(c.name, f"a ring of {slots:,} frames", slots * slot, shared))
    if shared:
        rows = _rows_per_write(plan, int(getattr(plan.recipe_config, "replay_row_steps", 1)))
        parts.append(Part(c.name, f"a staged write of {rows:,} rows", rows * row))
    return parts


ESTIMATES: Mapping[str, Callable[[Any, Any], list[Part]]] = {
    "weight_sync": _weight_sync, "inference": _inference, "replay": _replay, "collector": _collector,
}
"""What each component holds on the node, from the plan and its resolution."""


def on_this_node(plan) -> list:
    """The components whose owners (and workers) the plan places on the node of the run that starts them."""
    here = []
    for c in plan.components:
        try:
            host = c.host
        except NotImplementedYetError:  # a placement without a host cannot run: nothing to count
            continue
        if host.on_run_machine(plan.sessions.get(c.placement, {})):
            here.append(c)
    return here


def parts(plan) -> list[Part]:
    """What the plan holds on the node that runs it (see the module's docstring), component by component."""
    return [part for c in on_this_node(plan) for part in ESTIMATES.get(c.name, lambda p, c: [])(plan, c)]


def check_shared_memory(plan) -> None:
    """Refuse a plan whose segments do not fit in the segment directory's room, naming what needs how much, the room
    there and what to do.

    Raises:
        ConfigurationError: with ``path`` ``RLSVC_SHM_DIR`` (the setting that moves the segments).
    """
    shared = [p for p in parts(plan) if p.shared and p.nbytes]
    if not shared:
        return
    directory, need = segment_dir(), sum(p.nbytes for p in shared)
    space = room(directory)
    if space is None:
        raise ConfigurationError(f"the segment directory {directory!r} cannot be read: the plan makes "
                                 f"{size_text(need)} of shared-memory segments there; set {VARIABLE} to a directory "
                                 "that exists (on a tmpfs), or unset it for /dev/shm", path=VARIABLE)
    if need > space[0]:
        raise ConfigurationError(f"the plan needs {size_text(need)} of shared memory in {directory}, which has "
                                 f"{room_text(directory)} ({_by_component(shared)}): {remedy(directory, need)}",
                                 path=VARIABLE)


def _by_component(found: list[Part]) -> str:
    """``replay 41.4 MiB: storage of 16 rows of 1.7 MiB, ...; collector 13.8 MiB: ...``, the largest first; parts
    under a hundredth of the whole are left out."""
    total = sum(p.nbytes for p in found)
    groups: dict[str, list[Part]] = {}
    for p in found:
        groups.setdefault(p.component, []).append(p)
    said = []
    for name, group in sorted(groups.items(), key=lambda item: -sum(p.nbytes for p in item[1])):
        shown = [p.what for p in sorted(group, key=lambda p: -p.nbytes) if p.nbytes * 100 >= total]
        said.append(f"{name} {size_text(sum(p.nbytes for p in group))}" + (f": {', '.join(shown)}" if shown else ""))
    return "; ".join(said)
