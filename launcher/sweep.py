"""The sweep summary: at the end of a ``--multirun``, one row per job, written into the sweep directory.

Every job writes its run directory under Hydra's ``hydra.sweep.dir`` (``<sweep dir>/<hydra.sweep.subdir>``), with
the basic launcher as with ``hydra/launcher=local`` or ``slurm``, whose jobs run elsewhere. So the summary reads
the directories, not the launcher's job returns: a job directory is one holding ``.hydra/overrides.yaml`` (what
Hydra saves for every job) or ``summary.json``. It writes ``sweep_summary.csv`` (one row per job),
``sweep_summary.md`` (the same as a Markdown table, plus medians over seeds when ``seed`` is swept) and
``sweep_curves.png`` (every job's mean return against frames), and prints the Markdown.

``SweepSummary`` is the Hydra callback (``hydra.callbacks`` in ``conf/config.yaml``). A job that fails or is
interrupted stops Hydra's sweep before ``on_multirun_end``; the callback then writes the summary of the jobs that
ran when the command exits. Any sweep directory can be summarized again: ``python -m launcher.sweep <sweep dir>``.

An Optuna sweep (``hydra/sweeper=optuna``, or an option extending it such as ``hydra/sweeper=ppo_cartpole_optuna``)
runs one job per trial. What each job returns to the sweeper is its `objective`; the summary adds that column
and names the best trial: the one of Optuna's ``optimization_results.yaml`` (written at the end of the sweep), or
the best so far when the sweep ended early.
"""

from __future__ import annotations

import atexit
import csv
import json
import logging
import math
import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Mapping, TextIO

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

CSV_NAME, MARKDOWN_NAME, CURVES_NAME = "sweep_summary.csv", "sweep_summary.md", "sweep_curves.png"
COLUMNS = ("job", "overrides", "status", "solved", "solved_at_frames", "frames", "wall_seconds", "fps",
           "final_mean_return", "objective", "detail", "run_dir")
CURVE_TAG = "train/mean_return"
NO_RESULT = "no result"
OPTUNA_SWEEPER = "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
"""The ``_target_`` of hydra-optuna-sweeper's sweeper (``hydra.sweeper._target_`` of an Optuna sweep)."""
OPTUNA_RESULTS = "optimization_results.yaml"
"""What Optuna's sweeper writes in the sweep directory once every trial ran: ``best_params`` and ``best_value``."""


def objective(summary: Mapping) -> float:
    """The figure a hyperparameter search maximizes for one run: what ``python -m launcher`` returns to Hydra's sweeper
    (Optuna's takes it as the trial's value).

    Args:
        summary: the run's result, as ``summary.json`` holds it.

    Returns:
        ``eval_mean_return`` where the evaluator ran (``components.evaluator.eval_every``: the deterministic policy's
        whole games, unclipped), else ``final_mean_return`` (the training return over the recipe's last ``window``
        episodes); NaN where the run failed or was interrupted, or has neither as a finite number (no episode ended):
        the launcher then returns ``None``, and Optuna's sweeper marks the trial failed and goes on.
    """
    if summary.get("failed") or summary.get("interrupted"):
        return math.nan
    for key in ("eval_mean_return", "final_mean_return"):
        if _finite(summary.get(key)):
            return float(summary[key])
    return math.nan


@dataclass
class Job:
    """What one job's run directory says.

    Attributes:
        run_dir: the job's run directory.
        num: Hydra's job number (``hydra.job.num``), where recorded.
        overrides: the job's command-line overrides (``.hydra/overrides.yaml``).
        status: ``finished``, ``interrupted``, ``failed`` or ``no result`` (no readable ``summary.json``).
        detail: why it failed, which signal interrupted it, or why there is no result.
        summary: its ``summary.json``.
        curve: ``(frames, mean return)`` points, from ``metrics.csv`` or the summary's ``curve``.
        sweeper: the ``_target_`` of the Hydra sweeper that ran it (``.hydra/hydra.yaml``), where recorded.
    """

    run_dir: str
    num: int | None = None
    overrides: list[str] = field(default_factory=list)
    status: str = NO_RESULT
    detail: str = ""
    summary: dict = field(default_factory=dict)
    curve: list[tuple[float, float]] = field(default_factory=list)
    sweeper: str | None = None

    @property
    def objective(self) -> float | None:
        """What the job returned to the sweeper (`objective`): ``None`` unless it finished with a finite one."""
        value = objective(self.summary) if self.status == "finished" else math.nan
        return value if math.isfinite(value) else None

    @property
    def final_return(self) -> float | None:
        for key in ("final_mean_return", "mean_return"):  # an interrupted run saved its last progress figures
            if _finite(self.summary.get(key)):
                return float(self.summary[key])
        return self.curve[-1][1] if self.curve else None


# ---------------------------------------------------------------------------------------------- reading
def find_job_dirs(sweep_dir: str) -> list[str]:
    """The job directories under ``sweep_dir`` (any depth; submitit's ``.submitit`` and a job's insides skipped)."""
    found = []
    for parent, dirs, files in os.walk(sweep_dir):
        if os.path.isfile(os.path.join(parent, ".hydra", "overrides.yaml")) or "summary.json" in files:
            if os.path.abspath(parent) != os.path.abspath(sweep_dir):
                found.append(parent)
                dirs[:] = []
                continue
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return found


def read_job(run_dir: str) -> Job:
    """Read one job's run directory; what is missing or unreadable becomes its status, never an exception."""
    import yaml

    job = Job(run_dir)
    hydra_dir = os.path.join(run_dir, ".hydra")
    try:
        with open(os.path.join(hydra_dir, "overrides.yaml")) as f:
            job.overrides = [str(o) for o in yaml.safe_load(f) or []]
    except (OSError, yaml.YAMLError, TypeError):
        pass
    try:
        with open(os.path.join(hydra_dir, "hydra.yaml")) as f:
            hydra = yaml.safe_load(f)["hydra"]
        job.num = int(hydra["job"]["num"])
        job.sweeper = str(hydra["sweeper"]["_target_"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        pass
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            job.summary = json.load(f)
    except OSError:
        job.detail = "no summary.json: the job has not ended, or ended before its run began"
    except ValueError as exc:
        job.detail = f"summary.json is not readable JSON ({exc})"
    if not isinstance(job.summary, dict):
        job.summary, job.detail = {}, "summary.json holds no JSON object"
    if job.summary:
        if job.summary.get("failed"):
            job.status, job.detail = "failed", str(job.summary["failed"])
        elif job.summary.get("interrupted"):
            job.status, job.detail = "interrupted", str(job.summary.get("signal") or "")
        else:
            job.status = "finished"
    job.curve = _metrics_curve(os.path.join(run_dir, "metrics.csv")) or [
        (float(x), float(y)) for x, y in job.summary.get("curve") or [] if _finite(y)]
    return job


def _metrics_curve(path: str) -> list[tuple[float, float]]:
    points: dict[float, float] = {}
    try:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                try:
                    if row.get("tag") == CURVE_TAG and _finite(float(row["value"])):
                        points[float(row["step"])] = float(row["value"])  # a step logged twice: the later value
                except (TypeError, ValueError):
                    continue
    except OSError:
        return []
    return sorted(points.items())


def read_sweep(sweep_dir: str) -> list[Job]:
    """Every job of the sweep, in job order."""
    jobs = [read_job(d) for d in find_job_dirs(sweep_dir)]
    return sorted(jobs, key=lambda j: (j.num is None, j.num or 0, j.run_dir))


# ---------------------------------------------------------------------------------------------- the rows
def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _median(values) -> float | None:
    values = [v for v in values if _finite(v)]
    return statistics.median(values) if values else None


def _key(override: str) -> str:
    return override.split("=", 1)[0]


def labels(jobs: list[Job]) -> tuple[list[str], list[str]]:
    """Each job's distinguishing overrides (those not every job shares), and the overrides every job shares."""
    known = [j for j in jobs if j.overrides]
    shared = [o for o in known[0].overrides if all(o in j.overrides for j in known)] if len(known) > 1 else []
    out = [" ".join(o for o in job.overrides if o not in shared) if job.overrides else os.path.basename(job.run_dir)
           for job in jobs]
    return out, shared


def rows(jobs: list[Job], sweep_dir: str | None = None) -> list[dict]:
    """One dict per job, keyed by `COLUMNS` (``None`` where a figure is unknown; ``run_dir`` relative to
    ``sweep_dir`` when given)."""
    names, _ = labels(jobs)
    out = []
    for job, name in zip(jobs, names):
        s = job.summary
        solved = bool(s["solved"]) if "solved" in s else None
        out.append({
            "job": job.num, "overrides": name, "status": job.status, "solved": solved,
            "solved_at_frames": s.get("solved_at_frames") if solved else None,
            "frames": s.get("frames"), "wall_seconds": s.get("wall_seconds"), "fps": s.get("fps"),
            "final_mean_return": job.final_return, "objective": job.objective, "detail": job.detail,
            "run_dir": os.path.relpath(job.run_dir, sweep_dir) if sweep_dir else job.run_dir,
        })
    return out


def seed_medians(jobs: list[Job]) -> list[dict]:
    """Medians of the finished jobs that differ only in ``seed``, one dict per group of two or more."""
    groups: dict[tuple, list[Job]] = {}
    for job in jobs:
        if any(_key(o).lstrip("+~") == "seed" for o in job.overrides):
            others = tuple(o for o in job.overrides if _key(o).lstrip("+~") != "seed")
            groups.setdefault(others, []).append(job)
    shared = set(labels(jobs)[1])
    out = []
    for others, group in groups.items():
        done = [j for j in group if j.status == "finished"]
        if len(group) < 2 or not done:
            continue
        solved = [j for j in done if j.summary.get("solved")]
        out.append({
            "overrides": " ".join(o for o in others if o not in shared) or "all",
            "seeds": len(group), "finished": len(done), "solved": len(solved),
            "solved_at_frames": _median(j.summary.get("solved_at_frames") for j in solved),
            **{k: _median(j.summary.get(k) for j in done) for k in ("frames", "wall_seconds", "fps")},
            "final_mean_return": _median(j.final_return for j in done),
        })
    return out


@dataclass(frozen=True)
class Best:
    """The best trial of an Optuna sweep.

    Attributes:
        job: its job (``None`` where no job of the sweep directory has Optuna's best parameters).
        value: its objective.
        params: the values Optuna chose for it, by key (those of Optuna's results file; ``{}`` for the best so far).
        final: ``True``: Optuna's own choice, from `OPTUNA_RESULTS`; ``False``: the sweep ended before Optuna
            wrote it, and this is the finished job with the highest objective so far.
    """

    job: Job | None
    value: float
    params: dict
    final: bool


def _same(chosen, written: str | None) -> bool:
    """Whether an override's value (as Hydra wrote it) is the value Optuna chose (as its results file holds it)."""
    if written is None:
        return False
    if str(chosen) == written:
        return True
    try:
        return float(chosen) == float(written)
    except (TypeError, ValueError):
        return False


def _has_params(job: Job, params: Mapping) -> bool:
    given = {o.split("=", 1)[0].lstrip("+~"): o.split("=", 1)[1] for o in job.overrides if "=" in o}
    return all(_same(value, given.get(str(key).lstrip("+~"))) for key, value in params.items())


def optuna_best(sweep_dir: str, jobs: list[Job]) -> Best | None:
    """The best trial of an Optuna sweep: the one Optuna's sweeper wrote in `OPTUNA_RESULTS` (matched to the job
    whose overrides hold its parameters), else the finished job with the highest objective so far.

    Returns:
        ``None`` for a sweep that is not Optuna's, or one without a finished trial.
    """
    import yaml

    results = os.path.join(sweep_dir, OPTUNA_RESULTS)
    if not (os.path.isfile(results) or any(job.sweeper == OPTUNA_SWEEPER for job in jobs)):
        return None
    try:
        with open(results) as f:
            written = yaml.safe_load(f) or {}
        params, value = dict(written["best_params"] or {}), float(written["best_value"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError):
        pass  # not written yet (the sweep ended early), or not one objective's
    else:
        matches = [job for job in jobs if job.status == "finished" and _has_params(job, params)]
        job = next((j for j in matches if j.objective == value), matches[0] if matches else None)
        return Best(job, value, params, True)
    done = [job for job in jobs if job.objective is not None]
    if not done:
        return None
    job = max(done, key=lambda j: j.objective)
    return Best(job, job.objective, {}, False)


# ---------------------------------------------------------------------------------------------- writing
def _fmt(value, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:,.{digits}f}" if isinstance(value, (int, float)) else str(value).replace("|", "\\|")


_FIGURES = "frames to solve | frames | wall s | frames/s | final return |"


def markdown(sweep_dir: str, jobs: list[Job], *, ended_early: bool = False) -> str:
    """The summary as Markdown: a line on the sweep, the job table, medians over seeds, what went wrong."""
    table, shared = rows(jobs, sweep_dir), labels(jobs)[1]
    best = optuna_best(sweep_dir, jobs)
    optuna = best is not None or any(job.sweeper == OPTUNA_SWEEPER for job in jobs)
    head = f"Sweep {sweep_dir}: {len(jobs)} job{'s' * (len(jobs) != 1)}"
    head += f"; every job: {' '.join(shared)}" if shared else ""
    lines = [head + (" (the sweep ended early)" if ended_early else ""), "",
             f"| job | overrides | status | solved | {_FIGURES}" + (" objective |" if optuna else ""),
             "|---:|---|---|---|" + "---:|" * (5 + optuna)]
    for r in table:
        status = r["status"] + (f" ({r['detail']})" if r["status"] == "interrupted" and r["detail"] else "")
        lines.append(f"| {_fmt(r['job'])} | {_fmt(r['overrides'])} | {status} | {_fmt(r['solved'])} | "
                     f"{_fmt(r['solved_at_frames'])} | {_fmt(r['frames'])} | {_fmt(r['wall_seconds'], 1)} | "
                     f"{_fmt(r['fps'])} | {_fmt(r['final_mean_return'], 1)} |"
                     + (f" {_fmt(r['objective'], 1)} |" if optuna else ""))
    if best is not None:
        lines += ["", _best_line(best, jobs)]
    medians = seed_medians(jobs)
    if medians:
        lines += ["", "Medians over seeds (finished jobs):", "",
                  f"| overrides | seeds | finished | solved | {_FIGURES}", "|---|" + "---:|" * 8]
        for m in medians:
            lines.append(f"| {_fmt(m['overrides'])} | {m['seeds']} | {m['finished']} | {m['solved']} | "
                         f"{_fmt(m['solved_at_frames'])} | {_fmt(m['frames'])} | {_fmt(m['wall_seconds'], 1)} | "
                         f"{_fmt(m['fps'])} | {_fmt(m['final_mean_return'], 1)} |")
    notes = [f"- job {_fmt(r['job'])} {r['status']}: {r['detail']} ({r['run_dir']})"
             for r in table if r["status"] in ("failed", NO_RESULT)]
    notes += [f"- job {_fmt(r['job'])}: no finite return to maximize (no episode ended): Optuna marked the trial "
              f"failed ({r['run_dir']})"
              for r in table if optuna and r["status"] == "finished" and r["objective"] is None]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def _best_line(best: Best, jobs: list[Job]) -> str:
    names = dict(zip((id(job) for job in jobs), labels(jobs)[0]))
    which = f"job {_fmt(best.job.num)}" if best.job is not None else "no job directory here"
    chosen = " ".join(f"{k}={v}" for k, v in best.params.items()) or (names.get(id(best.job)) if best.job else "")
    if best.final:
        return f"Optuna's best trial ({OPTUNA_RESULTS}): {which}, objective {_fmt(best.value, 2)}: {chosen}"
    return (f"Best trial so far (the sweep ended before Optuna wrote {OPTUNA_RESULTS}): {which}, objective "
            f"{_fmt(best.value, 2)}: {chosen}")


def _tail(path: str) -> str:
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    return "/".join(parts[-2:])


def write_csv(path: str, table: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in r.items()} for r in table)


def plot_curves(jobs: list[Job], path: str, *, title: str) -> str | None:
    """Overlay the jobs' learning curves, each labelled by its overrides. ``None`` (no file) if none has points."""
    names = labels(jobs)[0]
    curves = [(name or f"job {job.num}", job.curve) for job, name in zip(jobs, names) if job.curve]
    if not curves:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for name, curve in curves:
        frames, returns = zip(*curve)
        ax.plot(frames, returns, label=name, linewidth=1.2)
    ax.set_xlabel("frames")
    ax.set_ylabel("mean episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if len(curves) <= 12:
        ax.legend(loc="lower right", fontsize="small")
    else:  # a long legend goes beside the axes, not over the curves
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="x-small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_sweep_summary(sweep_dir: str, *, file: TextIO | None = None, ended_early: bool = False) -> list[dict] | None:
    """Summarize the sweep in ``sweep_dir``: write the CSV, the Markdown and the PNG there, print the Markdown.

    Args:
        sweep_dir: the sweep directory (Hydra's ``hydra.sweep.dir``).
        file: where to print (standard output by default).
        ended_early: the sweep stopped before its last job (said in the summary's first line).

    Returns:
        The rows written to ``sweep_summary.csv``, or ``None`` when no job wrote a ``summary.json`` (a dry run):
        then one line says so and nothing is written.
    """
    file = file or sys.stdout
    jobs = read_sweep(sweep_dir) if os.path.isdir(sweep_dir) else []
    if not any(job.summary for job in jobs):
        print(f"sweep summary: no job in {sweep_dir} wrote a summary.json (a dry run writes none); nothing written",
              file=file, flush=True)
        return None
    table = rows(jobs, sweep_dir)
    write_csv(os.path.join(sweep_dir, CSV_NAME), table)
    text = markdown(sweep_dir, jobs, ended_early=ended_early)
    with open(os.path.join(sweep_dir, MARKDOWN_NAME), "w") as f:
        f.write(text)
    title = f"mean return per job, sweep {_tail(sweep_dir)}"
    png = plot_curves(jobs, os.path.join(sweep_dir, CURVES_NAME), title=title)
    written = ", ".join(name for name in (CSV_NAME, MARKDOWN_NAME, png and CURVES_NAME) if name)
    print(f"\n{text}\n(written in {sweep_dir}: {written})", file=file, flush=True)
    return table


# ---------------------------------------------------------------------------------------------- the callback
class SweepSummary(Callback):
    """Hydra callback: the sweep summary at the end of every ``--multirun``.

    Registered in ``conf/config.yaml``:

        hydra:
          callbacks:
            sweep_summary:
              _target_: launcher.sweep.SweepSummary
    """

    def __init__(self) -> None:
        self._pending: str | None = None  # the sweep directory, until its summary is written

    def on_multirun_start(self, config, **kwargs) -> None:
        self._pending = str(config.hydra.sweep.dir)
        if OmegaConf.select(config, "hydra.sweeper._target_") == OPTUNA_SWEEPER:
            # Optuna imports alembic as the sweeper starts, whose registrations would each print an INFO line
            logging.getLogger("alembic").setLevel(logging.WARNING)
        # A failed or interrupted job ends Hydra's sweep with an exception, and on_multirun_end never comes: the
        # summary of the jobs that ran is written as the command exits instead.
        atexit.register(self._at_exit)

    def on_multirun_end(self, config, **kwargs) -> None:
        self._pending = None
        write_sweep_summary(str(config.hydra.sweep.dir))

    def _at_exit(self) -> None:
        sweep_dir, self._pending = self._pending, None
        if sweep_dir and os.path.isdir(sweep_dir) and find_job_dirs(sweep_dir):  # else the error is the story
            write_sweep_summary(sweep_dir, ended_early=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m launcher.sweep <sweep dir>")
    sys.exit(0 if write_sweep_summary(sys.argv[1]) is not None else 1)
