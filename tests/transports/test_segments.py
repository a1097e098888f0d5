"""Shared-memory segments: a closed segment's name is gone at once, its memory only when the last tensor viewing it
is (torch.frombuffer keeps the view, not an export of it: unmapping at close would leave such tensors dangling)."""

import gc
import os

import torch
from tensordict import TensorDict

from transports import Layout
from transports.segments import SHM_PREFIX, Segment, SlotBank, creator_of, segments_of


def _mapped(name: str) -> bool:
    with open("/proc/self/maps") as f:
        return any(name in line for line in f)


def test_tensors_viewing_a_closed_bank_stay_valid_until_they_go():
    bank = SlotBank(Layout.from_tensordict(TensorDict({"x": torch.zeros(4, 1000)}, batch_size=[4])), num_slots=2)
    name = bank.segment.name
    view = bank.slots.get("x")
    view.copy_(torch.arange(8000.0).view(2, 4, 1000))
    bank.close()
    assert not os.path.exists(f"/dev/shm/{name}")  # the creator unlinked the name
    assert _mapped(name)  # but the memory stays mapped for the tensor that views it
    assert torch.equal(view, torch.arange(8000.0).view(2, 4, 1000))
    view.add_(1)  # and may still be written
    del view
    gc.collect()
    assert not _mapped(name)  # gone with its last view


def test_a_segment_names_the_process_that_created_it():
    segment = Segment(8)
    try:
        assert creator_of(segment.name) == os.getpid()
        assert segments_of([os.getpid()]) == [segment.name]
    finally:
        segment.close()
    assert segments_of([os.getpid()]) == []
    assert creator_of("psm_1234") is None and creator_of(f"{SHM_PREFIX}x_1") is None  # not a name of this module
