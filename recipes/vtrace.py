"""V-trace (Espeholt et al., 2018, "IMPALA", section 4.1): value targets and policy-gradient advantages for
trajectories that a lagging behaviour policy collected, corrected by truncated importance weights.

For an unroll of ``T`` steps (time-major, ``[T, B]``), behaviour policy ``mu`` and the learner's policy ``pi``:

    rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))        c_t = lambda * min(c_bar, pi(a_t|x_t) / mu(a_t|x_t))
    delta_t = rho_t * (r_t + gamma_t * V(x_{t+1}) - V(x_t))
    v_t = V(x_t) + delta_t + gamma_t * c_t * (v_{t+1} - V(x_{t+1}))           (v_T = V(x_T), the bootstrap value)
    advantage_t = min(pg_rho_bar, pi/mu) * (r_t + gamma_t * v_{t+1} - V(x_t))

``gamma_t`` is the discount after step ``t``: ``0`` where the episode terminated at ``t`` (the next state belongs to
the next episode, and nothing of it flows back), ``gamma`` elsewhere. An episode cut short at ``t`` (a time limit)
still bootstraps, from the value of its last observation (``next_values``), but its trace stops there
(``continues``: whether step ``t + 1`` belongs to step ``t``'s episode). With every ratio 1 (on-policy data) and
``lambda = 1``, ``v_t`` is the n-step return to the end of the unroll (or of the episode), bootstrapped from
``V(x_T)``. ``rho_bar >= c_bar`` is assumed, as in the paper; the defaults are its ``1.0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VTrace:
    """What `vtrace` returns, each ``[T, B]``.

    Attributes:
        vs: the value targets ``v_t``.
        advantages: the policy-gradient advantages, weighted by the clipped ratios.
        rhos: the ratios ``pi / mu`` before clipping (for the learner's metrics).
        q_values: ``r_t + gamma_t * v_{t+1}``: the advantages before the ratios weight them, minus nothing but
            ``V(x_t)`` (a clipped surrogate, APPO's, weights ``q_values - values`` by its own ratio).
    """

    vs: torch.Tensor
    advantages: torch.Tensor
    rhos: torch.Tensor
    q_values: torch.Tensor


@torch.no_grad()
def vtrace(behaviour_log_probs: torch.Tensor, target_log_probs: torch.Tensor, rewards: torch.Tensor,
           values: torch.Tensor, bootstrap_value: torch.Tensor, discounts: torch.Tensor, *, rho_bar: float = 1.0,
           c_bar: float = 1.0, pg_rho_bar: float | None = None, lambda_: float = 1.0,
           next_values: torch.Tensor | None = None, continues: torch.Tensor | None = None) -> VTrace:
    """V-trace targets of one batch of unrolls.

    Args:
        behaviour_log_probs: ``log mu(a_t|x_t)``, ``[T, B]``, as the actors' policy gave them.
        target_log_probs: ``log pi(a_t|x_t)``, ``[T, B]``, under the learner's current policy.
        rewards: ``r_t``, ``[T, B]``.
        values: ``V(x_t)``, ``[T, B]``, under the learner's current value function.
        bootstrap_value: ``V(x_T)``, ``[B]``: the value of the observation after the unroll's last step.
        discounts: ``gamma_t``, ``[T, B]``: ``gamma``, or ``0`` after a step that ended its episode.
        rho_bar: clip of the ratios in the value targets (``rho``, the fixed point's policy).
        c_bar: clip of the traces (how far corrections propagate back).
        pg_rho_bar: clip of the ratios weighting the advantages (default ``rho_bar``).
        lambda_: the traces' discount (``1``: the paper's V-trace).
        next_values: ``V(x_{t+1})`` of each step, ``[T, B]``, where it is not the next step's value: the value of
            the last observation of an episode cut short (default: ``values`` shifted, then ``bootstrap_value``).
        continues: ``[T, B]``, whether step ``t + 1`` continues step ``t``'s episode (default: ``discounts > 0``);
            ``False`` after a cut-short step stops the trace there without stopping the bootstrap.

    Returns:
        `VTrace`: targets, advantages and the raw ratios.

    Raises:
        ValueError: tensors of different shapes, or clips that are not positive.
    """
    shape = behaviour_log_probs.shape
    for name, tensor in (("target_log_probs", target_log_probs), ("rewards", rewards), ("values", values),
                         ("discounts", discounts), ("next_values", next_values), ("continues", continues)):
        if tensor is not None and tensor.shape != shape:
            raise ValueError(f"vtrace: {name} has shape {tuple(tensor.shape)}, behaviour_log_probs {tuple(shape)}")
    if len(shape) < 1 or bootstrap_value.shape != shape[1:]:
        raise ValueError(f"vtrace: bootstrap_value has shape {tuple(bootstrap_value.shape)}, expected {tuple(shape[1:])}")
    if min(rho_bar, c_bar, pg_rho_bar if pg_rho_bar is not None else rho_bar) <= 0:
        raise ValueError("vtrace: rho_bar, c_bar and pg_rho_bar must be > 0")
    rhos = torch.exp(target_log_probs - behaviour_log_probs)
    clipped_rhos = rhos.clamp(max=rho_bar)
    cs = lambda_ * rhos.clamp(max=c_bar)
    if next_values is None:
        next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
    carried = (discounts > 0 if continues is None else continues.bool()).to(values.dtype)
    deltas = clipped_rhos * (rewards + discounts * next_values - values)
    # v_t - V(x_t); none past the end
    corrections = torch.zeros((shape[0] + 1, *shape[1:]), dtype=values.dtype, device=values.device)
    for t in range(shape[0] - 1, -1, -1):
        corrections[t] = deltas[t] + discounts[t] * carried[t] * cs[t] * corrections[t + 1]
    vs = values + corrections[:-1]
    next_vs = next_values + carried * corrections[1:]  # v_{t+1}, or the cut-short episode's own last value
    pg_rhos = rhos.clamp(max=rho_bar if pg_rho_bar is None else pg_rho_bar)
    q_values = rewards + discounts * next_vs
    return VTrace(vs=vs, advantages=pg_rhos * (q_values - values), rhos=rhos, q_values=q_values)
