"""The ``queue`` transport: pickled TensorDicts over one local stream socket per client process. The transport and
its clients (`transports.queue.transport`), the serving side that polls every channel at once
(`transports.queue.server`), and the wire format of a payload and of one message (`transports.queue.wire`)."""

from .transport import QueueTransport

__all__ = ["QueueTransport"]
