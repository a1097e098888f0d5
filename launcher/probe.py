"""``launcher.probe=true``: what each edge of the resolved plan costs, measured once the owners run and before
training starts.

From the driver, a few round trips on every edge a recipe uses: a policy request of the plan's request layout to
the inference server (the call every collector worker makes), a replay command (``len``, the round trip under
every replay call), and a weight push of the recipe's policy (what the learner does after each update). The
medians and 95th percentiles are printed beside the plan and written into ``plan.json`` under ``probe``. The
pushes publish fresh weights of the recipe's own policy; the recipe publishes its own right after.

There is no ``collector -> replay`` row: in the plans the launcher builds, collector workers hand their rollouts
to the learner, which writes them to the buffer (the ``learner -> replay`` edge); nothing is written to the
buffer before training, so the probe leaves its contents and its sampling as the recipe finds them.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from transports.kinds import transport_label

ROUNDS = 20
WARMUP = 3


def _timed(call: Callable[[], Any], rounds: int) -> dict:
    for _ in range(WARMUP):  # connections are made on first use: not what a steady call costs
        call()
    lat = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        lat.append((time.perf_counter() - start) * 1e6)
    return {"rounds": rounds, "p50_us": float(np.percentile(lat, 50)), "p95_us": float(np.percentile(lat, 95))}


def probe(plan: Any, clients: dict, policy: Any, rounds: int = ROUNDS) -> list[dict]:
    """Round trips on the plan's edges; one record per edge (``edge``, ``transport``, ``placement``, figures)."""
    out = []
    replay, weights = plan["replay"], plan["weight_sync"]
    inference = next((c for c in plan.components if c.name == "inference"), None)  # none with local_policy
    request = inference.layouts.get("request") if inference is not None else None
    if request is not None:
        td, client = request.zeros(), clients["inference"]
        out.append({"edge": "collector -> inference", **_where(inference),
                    **_timed(lambda: client.submit(td).result(30), rounds)})
    buffer = clients["replay"]
    out.append({"edge": "learner -> replay (command)", **_where(replay), **_timed(lambda: len(buffer), rounds)})
    sync = clients["weight_sync"]
    out.append({"edge": "learner -> weight push", **_where(weights),
                **_timed(lambda: sync.push(policy), max(3, rounds // 4))})
    return out


def _where(component: Any) -> dict:
    return {"transport": transport_label(component.transport, component.transport_options),
            "placement": component.placement}


def render(records: list[dict]) -> str:
    lines = ["probe (round trips from the driver; us):",
             f"  {'edge':<28} {'placement':<10} {'transport':<20} {'p50':>9} {'p95':>9}"]
    for r in records:
        lines.append(f"  {r['edge']:<28} {r['placement']:<10} {r['transport']:<20} {r['p50_us']:>9.1f} "
                     f"{r['p95_us']:>9.1f}")
    return "\n".join(lines)
