"""What a plan holds on the node that runs it, estimated from the plan before anything starts, and the checks of it
against what the node offers (`launcher.checks.check_here` runs them; a dry run does not: it may plan for
another node).

- **Shared memory** (`check_shared_memory`): the segments that the owners and collector workers placed on this
  node make, against the room left in the segment directory (`transports.segment_dir`: ``/dev/shm`` unless
  ``RLSVC_SHM_DIR`` names another). Counted: a shared-memory weight sync's copy of the policy's state; a slot
  transport's request and response banks (`shared_memory_bytes`); a
  replay buffer whose storage is shared (its rows, its ring of frames, the rows of one write staged by its client);
  the rollout slots of each collector worker that hands rollouts over through shared memory (``prefetch`` rollouts of
  its share of a batch). Left out: blocks of a few bytes (status words, doorbells).
- **Memory** (`check_memory`): the replay buffer (its rows, its ring of frames, its sampler's index, shared or
  not) against the memory the node has available (`memory_here`).

Sizes come from the plan: one env step as a collector's rollout holds it (`LaunchPlan.step`), the policy's state
(`LaunchPlan.policy_bytes`), the inference server's layouts, each component's options. A replay row is one step,
or ``replay_row_steps`` of them where the recipe's config says so (IMPALA stores whole unrolls); its frame-stack keys
(``components.replay.frames``) are stored as frame serial numbers beside a ring of single frames
(`components.replay.frames`). The estimates are the bytes the segments take, to within their alignment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from components import compat
from transports.kernel.errors import ConfigurationError, NotImplementedYetError
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
    from components.replay.samplers import sampler_nbytes

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
    sampler = sampler_nbytes(o["sampler"], capacity)
    if sampler:
        parts.append(Part(c.name, f"the {o['sampler']} sampler's index", sampler, shared=False))
    parts.append(Part(c.name, "validity flags", capacity, shared=False))
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


def check_memory(plan) -> None:
    """Refuse a plan whose replay buffer does not fit in the memory this node has available (`memory_here`),
    naming what the buffer holds, the memory there is and the settings that size the buffer.

    Raises:
        ConfigurationError: with ``path`` the first of those settings (``recipe.buffer_size`` for DQN).
    """
    replay = [p for p in parts(plan) if p.component == "replay"]
    need, here = sum(p.nbytes for p in replay), memory_here()
    if not need or here is None or need <= here[0]:
        return
    available, total, source = here
    capacity = int(plan["replay"].options["capacity"])
    keys = [f"recipe.{key}" for key in getattr(type(plan.recipe_config), "replay_keys", ())]
    fits = int(capacity * available / need)
    fits -= fits % 10 ** max(0, len(str(fits)) - 2)  # two significant digits: an estimate
    raise ConfigurationError(
        f"the replay buffer needs {size_text(need)} of memory ({_listed(replay)}) but this "
        f"machine has {size_text(available)} available ({source}; {size_text(total)} in all): lower "
        f"{' or '.join(keys) or 'the replay capacity'} (components.replay.capacity={capacity:,}: about {fits:,} rows "
        "would fit), or run on a machine with more memory", path=(keys or ["components.replay.capacity"])[0])


def _listed(found: list[Part]) -> str:
    """``storage of 16 rows of 1.7 MiB: 27.6 MiB; ...``, the largest first, without those under a hundredth."""
    total = sum(p.nbytes for p in found)
    return "; ".join(f"{p.what}: {size_text(p.nbytes)}" for p in sorted(found, key=lambda p: -p.nbytes)
                     if p.nbytes * 100 >= total)


def memory_here() -> tuple[int, int, str] | None:
    """``(available, total, what the figure is)``: the memory this node can give a run now, in bytes, or ``None``
    where it cannot be read (no ``/proc/meminfo``).

    The figure is ``MemAvailable`` of ``/proc/meminfo``, what the kernel can give without swapping (free memory and
    the cache it can drop), not ``MemTotal``: what other processes hold stays theirs while the buffer fills up, and a
    buffer allocated lazily passes its allocation and is killed when it fills. Under a cgroup memory limit (a
    container's ``--memory``, a batch job's) the room left under it is the figure where that is less.
    """
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.rstrip().endswith("kB")}
        here = (info["MemAvailable"], info["MemTotal"], "MemAvailable of /proc/meminfo")
    except (OSError, KeyError, ValueError, IndexError):
        return None
    limit = _cgroup_limit()
    if limit is not None and limit[1] - limit[0] < here[0]:
        return limit[1] - limit[0], limit[1], "the room under this cgroup's memory.max"
    return here


def _cgroup_limit() -> tuple[int, int] | None:
    """``(used, limit)`` of this process's cgroup (v2) memory, or ``None`` where it has no limit or none is readable."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next((line.strip().split("::", 1)[1] for line in f if line.startswith("0::")), "/")
        for where in (f"/sys/fs/cgroup{path}", "/sys/fs/cgroup"):
            try:
                with open(f"{where}/memory.max") as f:
                    limit = f.read().strip()
                with open(f"{where}/memory.current") as f:
                    used = int(f.read())
            except OSError:
                continue
            return None if limit == "max" else (used, int(limit))
    except (OSError, ValueError):
        return None
    return None
