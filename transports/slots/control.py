"""The control block of a slot transport: per slot its state, its submission time and room for an error text (errors
travel as text, never pickled), in one shared segment.

Slot states: FREE -> CLAIMED (a client holds it) -> READY (request written, server notified) -> SERVING
(gathered into a batch) -> ANSWERED / FAILED (response written, client notified) -> FREE.
"""

from __future__ import annotations

import numpy as np

from ..kernel.errors import error_from_text, error_to_text
from ..segments import Segment

FREE, CLAIMED, READY, SERVING, ANSWERED, FAILED = range(6)
ERROR_BYTES = 8192
VERSION_KEY = ("policy_version",)
"""The response key the server stamps with the policy version that answered (see ``SlotServer.stamps_version``)."""


class Control:
    """Per-slot state (int64), submission time (float64) and error text, in one shared segment.

    Args:
        num_slots: the slots it holds.
        segment: the segment to attach to (``None``: create one).
    """

    def __init__(self, num_slots: int, segment: Segment | None = None):
        self.num_slots = num_slots
        self.segment = segment or Segment(num_slots * (16 + ERROR_BYTES))  # SlotTransport.shared_memory_bytes
        buf = self.segment.buf
        self.state = np.frombuffer(buf, dtype=np.int64, count=num_slots)
        self.enqueued = np.frombuffer(buf, dtype=np.float64, count=num_slots, offset=8 * num_slots)
        self.errors = np.frombuffer(buf, dtype=np.uint8, count=num_slots * ERROR_BYTES, offset=16 * num_slots).reshape(
            num_slots, ERROR_BYTES
        )

    def __reduce__(self):
        return (Control, (self.num_slots, self.segment))

    def write_error(self, slot: int, error: BaseException) -> None:
        """Write ``error`` as text into ``slot``'s room (cut to fit)."""
        data = error_to_text(error, ERROR_BYTES - 8).encode()[: ERROR_BYTES - 8]
        self.errors[slot, :8] = np.frombuffer(len(data).to_bytes(8, "little"), dtype=np.uint8)
        self.errors[slot, 8 : 8 + len(data)] = np.frombuffer(data, dtype=np.uint8)

    def read_error(self, slot: int) -> BaseException:
        """The error written into ``slot``."""
        n = int.from_bytes(self.errors[slot, :8].tobytes(), "little")
        return error_from_text(self.errors[slot, 8 : 8 + n].tobytes())

    def close(self) -> None:
        """Drop the views and close the segment."""
        self.state = self.enqueued = self.errors = None
        self.segment.close()
