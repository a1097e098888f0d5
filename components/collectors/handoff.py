"""Rollouts handed from a worker process to the driver through shared memory, by index.

A worker in another process of this machine writes each rollout in place into a slot of a shared segment it made
(`RolloutSlots`: the rollout's layout, ``num_slots`` times) and answers with a `Handoff`: the slot's
index, plus the slots themselves the first time (they pickle by segment name and attach where they are unpickled).
The driver copies the slot out once; nothing else travels per rollout. The worker owns the segment (it unlinks it
when it closes, its resource tracker if it dies); the driver's attachment is closed with the collector, or when a
restarted worker's slots replace it. A worker can also die with its tracker (Ray ends a dead actor's process group,
tracker included, and may do so before the tracker unlinks anything): the driver then unlinks what the ended
worker left.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from tensordict import TensorDict, TensorDictBase

from transports.layout import Layout
from transports.segments import Segment, SlotBank, creator_of, remove_segments_left_by

log = logging.getLogger(__name__)

LEFT_SLOTS_WAIT_S = 2.0
"""How long the driver waits for a worker that left its slots behind as it stopped to end (a killed one has; one
being stopped is killed by its host) before it unlinks them; a worker still running then keeps its own."""


class RolloutSlots:
    """``num_slots`` rollouts shaped like ``template`` in one shared segment.

    Args:
        template: a rollout (``[time, env]`` TensorDict) whose layout the slots take.
        num_slots: how many rollouts the segment holds.
    """

    def __init__(self, template: TensorDictBase | None = None, num_slots: int = 1, bank: SlotBank | None = None):
        self.bank = bank if bank is not None else SlotBank(Layout.from_tensordict(template), num_slots)

    def __reduce__(self):
        return (RolloutSlots, (None, self.bank.num_slots, self.bank))

    @property
    def num_slots(self) -> int:
        """How many rollouts the segment holds."""
        return self.bank.num_slots

    def slot(self, index: int) -> TensorDictBase:
        """Slot ``index`` (its leaves are views of the shared segment)."""
        return self.bank.slots[index]

    def copy(self, index: int) -> TensorDict:
        """A private copy of slot ``index`` (what the driver keeps: the worker writes the slot again later)."""
        return self.bank.slots[index].clone()

    def close(self) -> None:
        """Detach (the process that made the slots also removes the segment)."""
        if self.bank.slots is not None:
            self.bank.close()


@dataclass
class Handoff:
    """A worker's answer: its rollout is in slot ``index``; ``slots`` rides along the first time only."""

    index: int
    slots: RolloutSlots | None = None


class SameMachine:
    """Whether a worker placed where it may or may not share this machine (a Ray actor: the local node or another)
    does: the driver makes a small segment holding a random token, and a worker that attaches to it by name and
    reads the token back shares ``/dev/shm`` with the driver, so it hands rollouts over through shared memory.
    Travels as a `Probe`; the driver closes it with the collector."""

    def __init__(self):
        self.token = os.urandom(16)
        self.segment = Segment(len(self.token))
        self.segment.buf[:] = self.token

    def __reduce__(self):
        return (Probe, (self.segment.name, self.token))

    def here(self) -> bool:
        """Always ``True``: the driver's own copy is on the driver's machine."""
        return True

    def close(self) -> None:
        """Close and remove the token's segment (the driver's copy made it)."""
        self.segment.close()


@dataclass(frozen=True)
class Probe:
    """A `SameMachine` in a worker's process."""

    name: str
    token: bytes

    def here(self) -> bool:
        """Whether the driver's segment is here, with its token."""
        try:
            segment = Segment(len(self.token), self.name)
        except OSError:  # another machine (or another /dev/shm)
            return False
        try:
            return bytes(segment.buf[: len(self.token)]) == self.token
        finally:
            segment.close()


class Received:
    """The driver's side: the slots attached per worker, and rollouts copied out of them."""

    def __init__(self):
        self.slots: dict[int, RolloutSlots] = {}

    def read(self, worker: int, value):
        """The rollout ``value`` stands for (``value`` itself unless it is a `Handoff`)."""
        if not isinstance(value, Handoff):
            return value
        if value.slots is not None:  # a (re)started worker's slots: they replace the previous ones
            old = self.slots.pop(worker, None)
            if old is not None:
                _release([old])
            self.slots[worker] = value.slots
        return self.slots[worker].copy(value.index)

    def close(self) -> None:
        """Detach from every worker's slots (after the workers were stopped)."""
        _release(list(self.slots.values()))
        self.slots = {}


def _release(slots: list[RolloutSlots]) -> None:
    """Detach from ``slots``, and unlink those whose worker ended without unlinking them."""
    for each in slots:
        each.close()
    workers = {creator_of(each.bank.segment.name) for each in slots} - {os.getpid()}
    if removed := remove_segments_left_by(workers, LEFT_SLOTS_WAIT_S):
        log.info("collector: unlinked the slots its ended workers left: %s", ", ".join(removed))
