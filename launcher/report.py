"""What a user sees: the live progress line, the one-line summary, and the learning-curve PNG."""

from __future__ import annotations

import math
import os
import sys
import time


class ProgressLine:
    """A live line with frames, frames/s and the mean return (tqdm on a terminal, periodic lines otherwise).

    Args:
        total: the frame budget (the bar's 100%).
        enabled: when false, nothing is printed.
        every: seconds between lines when stderr is not a terminal.
    """

    def __init__(self, total: int, *, enabled: bool = True, every: float = 10.0):
        self.total = total
        self.enabled = enabled
        self.every = every
        self._start = time.perf_counter()
        self._last_line = 0.0
        self._bar = None
        self.frames, self.metrics = 0, {}  # the last update (what an interrupted run reports)
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="frame", unit_scale=True, dynamic_ncols=True, leave=True)

    def update(self, frames: int, **metrics: float) -> None:
        self.frames, self.metrics = frames, metrics
        if not self.enabled:
            return
        shown = {k: f"{v:.1f}" for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        if self._bar is not None:
            self._bar.update(frames - self._bar.n)
            self._bar.set_postfix(shown, refresh=False)
            return
        now = time.perf_counter()
        if now - self._last_line >= self.every or frames >= self.total:
            self._last_line = now
            rate = frames / max(now - self._start, 1e-9)
            extra = " ".join(f"{k}={v}" for k, v in shown.items())
            print(f"[progress] frames={frames} ({100 * frames / max(self.total, 1):.0f}%) fps={rate:.0f} {extra}",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def strict_json(value):
    """``value`` with every float that is not finite (NaN, infinities) replaced by ``None``: ``summary.json`` and
    the plan's files are read by strict JSON parsers (``jq``, JavaScript, ``json.loads(..., parse_constant=...)``),
    and a run stopped before its first episode ended has no mean return yet."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value


def summary_line(recipe: str, env_id: str, result: dict, run_dir: str) -> str:
    """One line: what was trained, whether it solved, frames, seconds, frames/s, final mean return, and the evaluated
    return where the evaluator ran."""
    state = "solved" if result.get("solved") else "finished"
    final = result.get("final_mean_return")
    final = f"{final:.1f}" if isinstance(final, (int, float)) and math.isfinite(final) else "none yet (no episode ended)"
    evaluated = ""
    if isinstance(result.get("eval_mean_return"), (int, float)):
        episodes = len((result.get("evaluations") or [{}])[-1].get("returns", []))
        evaluated = (f", evaluated {result['eval_mean_return']:.1f} +- {result.get('eval_return_std', 0.0):.1f} over "
                     f"{episodes} episodes")
    return (
        f"{recipe} {env_id} {state}: {result['frames']:,} frames in {result['wall_seconds']:.1f} s "
        f"({result['fps']:,.0f} frames/s), final mean return {final}{evaluated}; results in {run_dir}"
    )


def plot_learning_curve(curve: list, path: str, *, title: str, target: float | None = None) -> str | None:
    """Write the mean-return-versus-frames curve to ``path`` (PNG). Returns the path, or ``None`` if no points."""
    if not curve:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    frames, returns = zip(*curve)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot(frames, returns, label="mean return (recent episodes)")
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", label=f"target {target:g}")
    ax.set_xlabel("frames")
    ax.set_ylabel("mean episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
