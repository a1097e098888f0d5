"""The MuJoCo family: gymnasium's MuJoCo tasks (``HalfCheetah-v5``), continuous actions and float observations. No
preprocessing; what sets it apart is where MuJoCo's warnings go."""

from __future__ import annotations

import logging

from ..family import EnvFamily, register

_log = logging.getLogger("components.envs")


class MuJoCo(EnvFamily):
    """Every registered id whose entry point is in gymnasium's MuJoCo envs."""

    name, package, extra = "mujoco", "mujoco", "mujoco"

    def claims(self, env_id: str | None) -> bool:
        """Whether gymnasium registers ``env_id`` with a MuJoCo entry point."""
        import gymnasium as gym

        spec = gym.registry.get(env_id) if env_id is not None else None
        return spec is not None and "mujoco" in str(spec.entry_point)

    def prepare(self, env_id: str) -> None:
        """MuJoCo writes its warnings to ``MUJOCO_LOG.TXT`` in the working directory; they go to the env package's
        logger instead (``launcher.log`` in a run)."""
        try:
            import mujoco
        except ImportError:
            return  # gymnasium says which package is missing when the env is made
        mujoco.set_mju_user_warning(lambda text: _log.warning("MuJoCo: %s", text.strip()))


register(MuJoCo())
