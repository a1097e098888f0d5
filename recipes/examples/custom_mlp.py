"""An example of your own network, chosen in YAML by ``_target_`` instead of a recipe's built-in MLP.

``conf/recipe/ppo_custom_mlp.yaml`` selects it for PPO (``python -m launcher +recipe=ppo_custom_mlp``):

    network:
      _target_: recipes.examples.custom_mlp.CustomMLP
      hidden: [64, 64]
      activation: Tanh

Any callable ``(in_features: int, out_features: int, **kwargs) -> nn.Module`` works the same way, from any
module that is importable where the policy is built: the recipe passes ``in_features`` (the flattened
observation size) and ``out_features`` (the number of actions, or 1 for PPO's critic); the node's other keys
are the keyword arguments.
"""

from __future__ import annotations

from typing import Sequence

from torch import nn


class CustomMLP(nn.Sequential):
    """A multilayer perceptron of any depth, with a chosen activation and optional layer normalisation.

    Args:
        in_features: input size (given by the recipe).
        out_features: output size (given by the recipe).
        hidden: width of each hidden layer, in order.
        activation: the name of a ``torch.nn`` activation module (``Tanh``, ``ReLU``, ``ELU``, ...).
        layer_norm: normalise each hidden layer's pre-activations.

    Examples:
        >>> import torch
        >>> CustomMLP(4, 2, hidden=[32], activation="ReLU")(torch.zeros(8, 4)).shape
        torch.Size([8, 2])
    """

    def __init__(self, in_features: int, out_features: int, hidden: Sequence[int] = (64, 64),
                 activation: str = "Tanh", layer_norm: bool = False):
        act = getattr(nn, activation, None)
        if not (isinstance(act, type) and issubclass(act, nn.Module)):
            raise ValueError(f"activation={activation!r} is not a torch.nn module; try Tanh, ReLU or ELU")
        layers: list[nn.Module] = []
        width = in_features
        for size in hidden:
            layers += [nn.Linear(width, int(size)), *([nn.LayerNorm(int(size))] if layer_norm else []), act()]
            width = int(size)
        layers.append(nn.Linear(width, out_features))
        super().__init__(*layers)
