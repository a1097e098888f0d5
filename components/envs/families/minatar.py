"""The MinAtar family (Young & Tian 2019): ``MinAtar/...`` ids, miniature Atari games on 10x10 grids, one boolean
channel per object kind (one byte per cell on the wire). No preprocessing; the grids go to MinAtar's one-convolution
network where ``recipe.encoder=auto``."""

from __future__ import annotations

from typing import Any

from ..family import EnvFamily, register


class MinAtar(EnvFamily):
    """``MinAtar/{Asterix,Breakout,Freeway,Seaquest,SpaceInvaders}-v1``, registered by the MinAtar package."""

    name, namespace, package, extra, encoder = "minatar", "MinAtar", "minatar.gym", "minatar", "minatar_cnn"

    def register_envs(self, module: Any) -> None:
        """Register MinAtar's envs with gymnasium, once."""
        import gymnasium as gym

        if f"{self.namespace}/Breakout-v1" not in gym.registry:
            module.register_envs()


register(MinAtar())
