"""Gymnasium's classic control tasks (``CartPole-v1``, ``Pendulum-v1``): no preprocessing, flat float observations.
What sets them apart is CartPole's array-vectorized implementation (``env.backend=vector``), whose own autoreset is
on the next step: the reset of some of its envs at once lets it step with same-step autoreset."""

from __future__ import annotations

from typing import Any

from ..family import EnvFamily, register


def reset_cartpole_rows(env: Any, rows: Any) -> Any:
    """Reset the ``rows`` of gymnasium's ``CartPoleVectorEnv`` as its own next step would (same draw, same bounds),
    now.

    Args:
        env: the unwrapped ``CartPoleVectorEnv``.
        rows: which envs to reset (a boolean array).

    Returns:
        The observations of every env afterwards.
    """
    import numpy as np

    env.state[:, rows] = env.np_random.uniform(low=env.low, high=env.high, size=(4, int(rows.sum())))
    env.steps[rows] = 0
    env.prev_done[rows] = False  # its next step is a real one: no reset, no ignored action
    return env.state.T.astype(np.float32)


class ClassicControl(EnvFamily):
    """Gymnasium's classic control envs, made as gymnasium makes them."""

    name = "classic_control"
    row_resets = {"CartPoleVectorEnv": reset_cartpole_rows}

    def claims(self, env_id: str | None) -> bool:
        """Whether gymnasium registers ``env_id`` with a classic control entry point."""
        import gymnasium as gym

        spec = gym.registry.get(env_id) if env_id is not None else None
        return spec is not None and "classic_control" in str(spec.entry_point)


register(ClassicControl())
