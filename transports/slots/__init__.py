"""The slot transports, ``shared_memory`` (:mod:`.shared_memory`) and ``process_slot`` (:mod:`.process_slot`), and
what they share: requests and responses in slot banks in shared memory with semaphore doorbells (:mod:`.transport`,
the client side), the control block of slot states (:mod:`.control`), fast copies of slot rows (:mod:`.rows`) and
the serving side that sweeps ready slots in batches (:mod:`.server`)."""

from .process_slot import ProcessSlotTransport
from .shared_memory import SharedMemoryTransport

__all__ = ["ProcessSlotTransport", "SharedMemoryTransport"]
