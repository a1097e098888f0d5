"""The built-in encoders: observations in, features out, chosen from the observation's shape.

- ``mlp``: flat observations (CartPole, MuJoCo): the recipe's own two-layer MLP, unchanged.
- ``nature_cnn``: Atari frame stacks, ``(stack, 84, 84)`` uint8: the network of Mnih et al. 2015 (three convolutions,
  512 features).
- ``impala_cnn``: the same frames through the IMPALA ResNet (Espeholt et al. 2018: three sections of a convolution,
  a max-pool and two residual blocks; 256 features).
- ``minatar_cnn``: MinAtar's ``(10, 10, channels)`` grids: one 3x3 convolution of 16 filters and 128 features, as
  in Young & Tian 2019.

``auto`` (every recipe's default) picks ``mlp`` for observations of one dimension. For images it asks the env's family
first: the encoder the family declares (`components.envs.family.EnvFamily.encoder`, carried by
``EnvSpec.encoder``: ``nature_cnn`` for Atari, ``minatar_cnn`` for MinAtar) where it takes the images. Otherwise the
image's size decides: ``minatar_cnn`` for images of at most 16x16 cells, ``nature_cnn`` for larger ones it takes
(36x36 and up) and ``impala_cnn``, which takes images of any size, for those between (``env.atari.screen_size=32``): a
smaller frame asks for a run, not for a refusal, and IMPALA's network is the one made for small frames (Procgen's
64x64). The channels are an image's
smallest dimension, first or last. An encoder named outright that cannot take the images (its convolutions would
leave nothing) is refused while planning, naming the setting that sized them. Integer observations travel and are
stored as they come (uint8 frames, byte grids); the encoder turns them into floats, scaled by the environment's
bound (``EnvSpec.observation_scale``: 1/255 for frames), inside the network, wherever the network runs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from components.errors import ConfigurationError

from .configs import ENCODERS


def layer(module: nn.Module, std: float = math.sqrt(2)) -> nn.Module:
    """Orthogonal weights of gain ``std``, zero bias (CleanRL's ``layer_init``)."""
    nn.init.orthogonal_(module.weight, std)
    nn.init.zeros_(module.bias)
    return module


class Scale(nn.Module):
    """Integer observations to floats: ``x.float() * scale`` (floats pass unchanged), channels-last grids moved to
    channels-first, or the last ``flatten`` dimensions made one (for a network that takes flat features)."""

    def __init__(self, scale: float, channels_last: bool = False, flatten: int = 0):
        super().__init__()
        self.scale, self.channels_last, self.flatten = scale, channels_last, flatten

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs if obs.is_floating_point() else obs.float().mul_(self.scale)  # in place: one pass over the frames
        if self.flatten > 1:
            x = x.flatten(-self.flatten)  # whatever the leading batch dimensions
        return x.movedim(-1, -3) if self.channels_last else x


def flat_features(spec, net: nn.Module) -> nn.Module:
    """``net`` fed flat float features of ``prod(observation_shape)`` (an MLP, or a user's network built from
    ``in_features``): integer observations are scaled and multi-dimensional ones flattened first; flat float
    observations go in as they are."""
    if spec.observation_dtype.is_floating_point and len(spec.observation_shape) <= 1:
        return net
    return nn.Sequential(Scale(spec.observation_scale, flatten=len(spec.observation_shape)), net)


class ImageEncoder(nn.Sequential):
    """An encoder of images ``[..., C, H, W]`` (or channels last): any leading batch dimensions (a request of the
    inference server ``[requests, envs]``, a rollout ``[time, env]``) are folded into one for the convolutions."""

    def __init__(self, convs: nn.Module, shape: tuple[int, int, int], scale: float, channels_last: bool,
                 features: int):
        """``convs`` (ending flat) on channels-first images of ``shape``, after `Scale`, then a ``features``-unit
        ReLU layer."""
        super().__init__(Scale(scale, channels_last), convs, layer(nn.Linear(_flat_size(convs, shape), features)),
                         nn.ReLU())
        self.out_features = features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        lead = obs.shape[:-3]
        out = super().forward(obs.reshape(-1, *obs.shape[-3:]))
        return out.reshape(*lead, out.shape[-1])


class NatureCNN(ImageEncoder):
    """Mnih et al. 2015: conv 32x8x8/4, conv 64x4x4/2, conv 64x3x3/1, a 512-unit layer; ReLU throughout."""

    def __init__(self, shape: tuple[int, int, int], scale: float, channels_last: bool = False, features: int = 512):
        convs = nn.Sequential(layer(nn.Conv2d(shape[0], 32, 8, stride=4)), nn.ReLU(),
                              layer(nn.Conv2d(32, 64, 4, stride=2)), nn.ReLU(),
                              layer(nn.Conv2d(64, 64, 3, stride=1)), nn.ReLU(), nn.Flatten())
        super().__init__(convs, shape, scale, channels_last, features)


class _Residual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ImpalaCNN(ImageEncoder):
    """Espeholt et al. 2018: per section a 3x3 convolution, a 3x3 max-pool of stride 2 and two residual blocks
    (channels 16, 32, 32), then ReLU and a 256-unit layer."""

    def __init__(self, shape: tuple[int, int, int], scale: float, channels_last: bool = False, features: int = 256,
                 channels: tuple[int, ...] = (16, 32, 32)):
        sections, before = [], shape[0]
        for out in channels:
            sections += [nn.Conv2d(before, out, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                         _Residual(out), _Residual(out)]
            before = out
        super().__init__(nn.Sequential(*sections, nn.ReLU(), nn.Flatten()), shape, scale, channels_last, features)


class MinAtarCNN(ImageEncoder):
    """Young & Tian 2019: one 3x3 convolution of 16 filters over the grid, then 128 units."""

    def __init__(self, shape: tuple[int, int, int], scale: float, channels_last: bool = True, features: int = 128):
        convs = nn.Sequential(layer(nn.Conv2d(shape[0], 16, 3, stride=1)), nn.ReLU(), nn.Flatten())
        super().__init__(convs, shape, scale, channels_last, features)


def channels_first(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """An image's shape with its channels first: the channels are the smallest dimension (``(10, 10, 4)`` is a
    channels-last grid, ``(4, 84, 84)`` a channels-first stack)."""
    return (shape[2], shape[0], shape[1]) if is_channels_last(shape) else tuple(shape)


def is_channels_last(shape: tuple[int, ...]) -> bool:
    """Whether an image of ``shape`` holds its channels in the last dimension (the smallest one)."""
    return shape[-1] < min(shape[:-1])


SHRINKING: dict[str, tuple[tuple[int, int, int], ...]] = {
    "nature_cnn": ((8, 4, 0), (4, 2, 0), (3, 1, 0)),  # its three convolutions
    "impala_cnn": ((3, 2, 1),) * 3,  # each section's max-pool (its convolutions keep the size)
    "minatar_cnn": ((3, 1, 0),),
}
"""The layers of each image encoder that shrink an image's side, as ``(kernel, stride, padding)``."""


def smallest_side(name: str) -> int:
    """The smallest image side (height and width) image encoder ``name`` takes: the side whose every layer leaves at
    least one pixel (``(side + 2 * padding - kernel) // stride + 1 >= 1``, from the last layer back). The Nature CNN's
    is 36."""
    side = 1
    for kernel, stride, padding in reversed(SHRINKING[name]):
        side = max(1, (side - 1) * stride + kernel - 2 * padding)
    return side


def _flat_size(convs: nn.Module, shape: tuple[int, int, int]) -> int:
    with torch.no_grad():
        return int(convs(torch.zeros(1, *shape)).shape[-1])


def choose(encoder: str, shape: tuple[int, ...], size: tuple[str, Any] | None = None,
           preferred: str | None = None) -> str:
    """The encoder ``auto`` stands for, given one observation's shape and the env family's preference (see the
    module's docstring).

    Args:
        encoder: ``recipe.encoder``.
        shape: one observation's shape.
        size: the setting that sized the images, as ``(config path, value)`` (``("env.atari.screen_size", 32)``):
            a refusal names it. ``None``: the env's own size; a refusal names ``recipe.encoder``.
        preferred: the encoder the env's family declares (``EnvSpec.encoder``), ``auto``'s choice where it takes the
            images; ``None``: the image's size decides.

    Returns:
        The name of an encoder of `SHRINKING`, or ``mlp``.

    Raises:
        ConfigurationError: an encoder that cannot take observations of this shape.
    """
    if encoder not in ENCODERS:
        raise ConfigurationError(f"recipe.encoder={encoder!r} is not an encoder", path="recipe.encoder",
                                 alternatives=ENCODERS)
    image = len(shape) == 3
    if encoder == "mlp" or (encoder == "auto" and not image):
        return "mlp"
    if not image:
        raise ConfigurationError(f"recipe.encoder={encoder} takes images (3 dimensions), and this env's observations "
                                 f"have shape {tuple(shape)}: use mlp or auto", path="recipe.encoder")
    sides = channels_first(shape)[1:]
    fits = [name for name in SHRINKING if min(sides) >= smallest_side(name)]
    if encoder == "auto":
        if preferred in fits:
            return preferred
        if max(sides) <= 16 and "minatar_cnn" in fits:  # a family that declares none: the size decides
            return "minatar_cnn"
        return "nature_cnn" if "nature_cnn" in fits else "impala_cnn"
    if encoder in fits:
        return encoder
    least = smallest_side(encoder)
    others = [*(name for name in fits if name != encoder), "auto"]
    others = " or ".join([", ".join(others[:-1]), others[-1]] if len(others) > 1 else others)
    if size is not None:
        path, value = size
        raise ConfigurationError(f"{path}={value!r} makes images of {tuple(shape)}, smaller than recipe.encoder={encoder} "
                                 f"takes (at least {least}x{least}): set {path} to {least} or more, or recipe.encoder "
                                 f"to {others}", path=path)
    raise ConfigurationError(f"recipe.encoder={encoder} needs images of at least {least}x{least} (channels first); this "
                             f"env's are {tuple(shape)}: use {others}", path="recipe.encoder")


def check_encoder(config: Any, shape: tuple[int, ...], size: tuple[str, Any] | None = None,
                  preferred: str | None = None) -> None:
    """A recipe config's built-in encoder (its ``encoder``, where its ``network`` is unset) against one observation's
    shape: the plan calls it before it builds the policy, with the setting that sized the images and the env family's
    preference (see `choose`).

    Raises:
        ConfigurationError: an encoder that cannot take observations of this shape.
    """
    name = getattr(config, "encoder", None)
    if name in ENCODERS and getattr(config, "network", None) is None:
        choose(name, shape, size, preferred)


def encoder(name: str, shape: tuple[int, ...], scale: float, preferred: str | None = None) -> nn.Module | None:
    """The convolutional encoder ``name`` (after `choose`) for observations of ``shape``; ``None`` for ``mlp``,
    which each recipe builds itself. Every encoder has ``out_features``.

    Args:
        name: ``recipe.encoder``.
        shape: one observation's shape.
        scale: what one step of an integer observation is worth (``EnvSpec.observation_scale``).
        preferred: the encoder the env's family declares (``EnvSpec.encoder``).
    """
    name = choose(name, shape, preferred=preferred)
    if name == "mlp":
        return None
    kind = {"nature_cnn": NatureCNN, "impala_cnn": ImpalaCNN, "minatar_cnn": MinAtarCNN}[name]
    return kind(channels_first(shape), scale, is_channels_last(shape))


class RunningNorm(nn.Module):
    """Observations standardised by their running mean and variance, clipped to ``[-clip, clip]``.

    The statistics are buffers of the policy, so weight sync ships them with the weights: every worker and every
    placement normalises with the learner's figures (a normalising env wrapper in each worker would keep statistics
    of its own, and the placement would change what is learned). The learner calls `update` with each batch
    after learning from it, so a batch is learned with the statistics it was collected with.

    Before anything is seen the module is the identity: integer observations then go on as they are, to be scaled by
    the encoder, on the CPU. Elsewhere (a CUDA learner or server) nothing reads the count back to the host: the
    standardised observations and the unnormalised ones, as floats already scaled by ``scale``, are both computed and
    ``torch.where`` picks (the same figures, and nothing that waits for the device or breaks a compiled or captured
    graph).

    Args:
        shape: the shape of one observation.
        clip: the bound of the standardised values.
        eps: added to the variance before its square root.
        scale: what the encoder multiplies integer observations by (``EnvSpec.observation_scale``): the identity of
            a CUDA module before anything is seen hands integer observations on as floats already scaled.
    """

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8, scale: float = 1.0):
        super().__init__()
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        self.register_buffer("count", torch.tensor(0.0))
        self.clip, self.eps, self.scale = clip, eps, scale

    @torch.no_grad()
    def update(self, obs: torch.Tensor) -> None:
        """Fold a batch of observations ``[..., *shape]`` into the statistics (Chan et al.'s parallel update), on the
        statistics' device, without reading anything back to the host."""
        # the batch's own moments in single precision and two passes over its leading dimensions as they lie (a
        # batch of frames is millions of values: torch.var_mean, or a reshape of a time-major view, takes longer),
        # the second pass in place on a copy of the batch (a new tensor for the deviations would cost a second pass
        # of allocation over every frame; docs/pages/benchmarks/impala_atari.md has the timings), folded in double
        x = (obs if obs.dim() > self.mean.dim() else obs.unsqueeze(0)).to(torch.float32, copy=True)
        lead = tuple(range(x.dim() - self.mean.dim()))
        mean = x.mean(lead)
        var = x.sub_(mean).square_().mean(lead)
        n, count, mean, var = x.numel() // mean.numel(), self.count.double(), mean.double(), var.double()
        delta, total = mean - self.mean.double(), count + n
        self.mean.copy_(self.mean.double() + delta * n / total)
        self.var.copy_((self.var.double() * count + var * n + delta.pow(2) * count * n / total) / total)
        self.count.copy_(total)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if obs.is_cpu and not torch.compiler.is_compiling():  # the count is read where reading it costs nothing
            if float(self.count) == 0:
                return obs  # nothing seen yet: the identity (a fresh policy acts on raw observations)
            return self._standardised(obs)
        raw = obs if obs.is_floating_point() else obs.to(self.mean.dtype) * self.scale
        return torch.where(self.count > 0, self._standardised(obs), raw)

    def _standardised(self, obs: torch.Tensor) -> torch.Tensor:
        # a copy in the statistics' dtype, then in place: an operation mixing integer frames with float statistics
        # takes torch's slow path (docs/pages/benchmarks/impala_atari.md has the timings)
        x = obs.to(self.mean.dtype, copy=True)
        return x.sub_(self.mean).mul_((self.var + self.eps).rsqrt()).clamp_(-self.clip, self.clip)
