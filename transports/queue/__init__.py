"""The ``queue`` transport: pickled TensorDicts over one local stream socket per client process. The transport and
its clients (:mod:`.transport`), the serving side that polls every channel at once (:mod:`.server`), and the wire
format of a payload and of one message (:mod:`.wire`)."""

from .transport import QueueTransport

__all__ = ["QueueTransport"]
