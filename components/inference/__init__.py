"""The inference service: an auto-batching policy server and its clients."""

from .config import InferenceDeviceConfig, InferenceServerConfig
from .server import InferenceServer

__all__ = ["InferenceDeviceConfig", "InferenceServer", "InferenceServerConfig"]
