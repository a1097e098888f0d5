"""The ``distributed`` transport: fixed-layout TensorDict payloads over standalone torch.distributed point-to-point
groups. The transport, its clients and its server (`transports.distributed.transport`), the rendezvous store and the
groups (`transports.distributed.gloo`), and the framing of one message on a pair of groups with a client's connected
endpoint (`transports.distributed.framing`)."""

from .transport import DistributedTransport

__all__ = ["DistributedTransport"]
