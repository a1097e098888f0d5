"""The inference service: an auto-batching policy server and its clients."""

from .client import InferenceClient, PolicyClientModule
from .config import InferenceDeviceConfig, InferenceServerConfig
from .server import InferenceServer

__all__ = ["InferenceClient", "InferenceDeviceConfig", "InferenceServer", "InferenceServerConfig", "PolicyClientModule"]
