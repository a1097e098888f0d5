"""The layouts a plan derives from the env's spec and the policy (built once, on zeros, while planning): the inference
server's request and response, one env step as a collector's rollout holds it, and the bytes of the policy's state.
`launcher.plan.build_plan` binds the first two to the inference server; `launcher.footprint` sizes rollouts,
replay rows and a shared weight sync from the other two."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PolicyLayouts:
    """What one policy request and one env step look like.

    Attributes:
        request: one request of the inference server (the observations of ``num_envs`` envs, their sampling seeds).
        response: its answer (the actions, whatever else the policy outputs, ``policy_version``).
        step: one env's step as a collector's rollout holds it: the observation, the policy's outputs and the env's
            ``next`` (what a worker allocates per step, see `components.collectors.worker.Worker`).
        state_bytes: bytes of the policy's state dict.
    """

    request: Any
    response: Any
    step: Any
    state_bytes: int


def policy_layouts(recipe, recipe_cfg: Any, spec, num_envs: int) -> PolicyLayouts:
    """Build the recipe's policy and answer one request of ``num_envs`` envs of zeros."""
    import torch

    from components.envs import next_storage
    from transports.layout import Layout

    request = spec.request_layout(num_envs)
    with torch.no_grad():
        policy = recipe.make_policy(recipe_cfg, spec)
        out = policy(request.zeros())
    out.set("policy_version", torch.zeros(out.batch_size, dtype=torch.long))
    outputs = out.exclude(*request.keys)
    step = outputs[(0,) * outputs.batch_dims].clone()
    step.update({"observation": torch.zeros(spec.observation_shape, dtype=spec.observation_dtype),
                 "next": next_storage(spec, ())})
    return PolicyLayouts(request, Layout.from_tensordict(outputs), Layout.from_tensordict(step),
                         sum(t.numel() * t.element_size() for t in policy.state_dict().values()))
