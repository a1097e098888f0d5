"""The slot transports, ``shared_memory`` (`transports.slots.shared_memory`) and ``process_slot``
(`transports.slots.process_slot`), and what they share: requests and responses in slot banks in shared memory with
semaphore doorbells (`transports.slots.transport`, the client side), the control block of slot states
(`transports.slots.control`), fast copies of slot rows (`transports.slots.rows`) and the serving side that sweeps
ready slots in batches (`transports.slots.server`)."""

from .process_slot import ProcessSlotTransport
from .shared_memory import SharedMemoryTransport

__all__ = ["ProcessSlotTransport", "SharedMemoryTransport"]
