"""How a learner's update step runs as its recipe's config says: on ``device``, its forward pass and loss under bf16
autocast (``amp``) and compiled (``compile``), the backward pass and the optimizer step outside both.

Every recipe's update goes through `UpdateStep`; `learner_device` checks what the device can do when the
recipe starts. Nothing here reads a value back to the host: the losses an update returns stay tensors on the device,
read once per batch where they are logged (`recipes.base.Loop.end_batch`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from components.errors import ConfigurationError


def learner_device(cfg: Any) -> torch.device:
    """The learner's device (``cfg.device``), where what the config asks of it can run.

    Args:
        cfg: the recipe's config (``device``, ``amp``).

    Returns:
        The device.

    Raises:
        ConfigurationError: naming ``recipe.amp``, where ``amp`` is set for a CUDA device without bf16.
    """
    device = torch.device(cfg.device)
    if cfg.amp and device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        name = torch.cuda.get_device_name(device)
        raise ConfigurationError(f"recipe.amp=true needs bf16 on the learner's device, and {cfg.device} ({name}) has "
                                 "none (bf16 came with Ampere, compute capability 8.0): set recipe.amp=false",
                                 path="recipe.amp")
    return device


class UpdateStep:
    """A learner's forward pass and loss as its config asks: under bf16 autocast where ``amp`` is set, compiled by
    ``torch.compile`` (fixed shapes: ``dynamic=False``) where ``compile`` is set; called as ``loss`` would be.

    Args:
        loss: ``loss(*args) -> (loss, metrics)``: the forward pass and the loss, whose tensors it returns.
        cfg: the recipe's config (``amp``, ``compile``).
        device: the learner's device (`learner_device`).

    Attributes:
        amp: whether the forward pass and the loss run under bf16 autocast.
        compiled: whether ``torch.compile`` compiled them.
    """

    def __init__(self, loss: Callable[..., Any], cfg: Any, device: torch.device):
        self.amp, self.compiled = bool(cfg.amp), bool(cfg.compile)
        self._device_type = device.type
        # compiled apart, each loss its own code (the autocast state is part of what the compiled graph assumes)
        self._loss = torch.compile(loss, dynamic=False) if self.compiled else loss

    def __call__(self, *args: Any) -> Any:
        """``loss(*args)``, under autocast and compiled as configured."""
        with torch.autocast(self._device_type, dtype=torch.bfloat16, enabled=self.amp):
            return self._loss(*args)


def to_device(data: Any, device: torch.device) -> Any:
    """Host data (a tensor, a TensorDict, or a tuple of them) on ``device`` without waiting for the device: through
    pinned memory, copied without blocking (a copy from pageable memory would first wait for the work queued on the
    device). On the CPU, or already on ``device``: itself.

    Args:
        data: tensors or TensorDicts, on the host.
        device: the learner's device.
    """
    if device.type == "cpu":
        return data

    def move(tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.device == device else tensor.pin_memory().to(device, non_blocking=True)

    if isinstance(data, tuple):
        return tuple(to_device(part, device) for part in data)
    return move(data) if isinstance(data, torch.Tensor) else data.apply(move, device=device)
