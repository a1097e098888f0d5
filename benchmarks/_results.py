"""What every benchmark writes beside the tables it prints, and how the documentation renders it.

A run is recorded with `Results`: the tables the script printed (title, columns, rows), the plots worth
drawing (a round trip against payload size per transport beside its floor, frames/s per placement...), the target
verdicts, and where it ran (machine, command, commit, date). `Results.save` appends the run to
``benchmarks/results/<benchmark>.json``: the file keeps the history, newest last; the documentation's page for the
benchmark (``docs/hooks.py``) renders the newest run with `page` and draws its plots with `plot_png`.

    results = Results("inference")
    results.table("1 client, p50", ["transport", "16 B us"], [["queue", 80.1]])
    results.plot("round_trip", "Round trip against payload", x=[16, 28672], series={"queue": [80, 90]}, kind="line",
                 xlabel="payload bytes", ylabel="p50 us", log=True)
    results.verdict("PASS process/shared_memory within 2x of direct")
    results.save()                          # benchmarks/results/inference.json

Helpers keep a script's printout and its record one: `say` prints a line and records it (a verdict or a
note), `show` a table; `with_floors` splits a bar plot's series so that the floor rows among its x draw dashed. Values are
stored as JSON's own types (`_plain`: numpy scalars become numbers, NaN and infinities ``None``).
"""

from __future__ import annotations

import datetime
import io
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from typing import Any, Iterable, Mapping, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_DIR = os.path.join(HERE, "results")
ROOT = os.path.dirname(HERE)
KEEP_RUNS = 40
"""Runs a results file keeps (the oldest go first)."""


def machine() -> dict[str, Any]:
    """Where a run ran: CPU model, cores, memory, Python, torch, OS."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    memory = None
    try:
        with open("/proc/meminfo") as f:
            memory = round(int(next(line.split()[1] for line in f if line.startswith("MemTotal"))) / 2**20, 1)
    except (OSError, StopIteration):
        pass
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:  # pragma: no cover - every benchmark here imports torch
        torch_version = None
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": memory, "python": platform.python_version(),
            "torch": torch_version, "os": f"{platform.system()} {platform.release()}"}


def commit() -> tuple[str | None, bool]:
    """The checkout's commit and whether it had uncommitted changes to tracked files."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10,
                                  check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    head = git("rev-parse", "--short", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return head, dirty


class Results:
    """One run of one benchmark: its tables, plots and verdicts, saved as JSON beside the printed tables.

    Args:
        benchmark: the script's name (``inference`` for ``benchmarks/inference.py``): names the results file.
        argv: the command line after the script (default: this process's).
        record: the results file's name where one script keeps several (``learning_minatar``); default
            ``benchmark``.
    """

    def __init__(self, benchmark: str, argv: Sequence[str] | None = None, record: str | None = None):
        self.benchmark, self.record = benchmark, record or benchmark
        args = list(sys.argv[1:] if argv is None else argv)
        self.command = shlex.join(["python", f"benchmarks/{benchmark}.py", *args])
        self.started = datetime.datetime.now(datetime.timezone.utc)
        self.tables: list[dict] = []
        self.plots: list[dict] = []
        self.verdicts: list[str] = []
        self.notes: list[str] = []

    def table(self, title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], note: str = "") -> None:
        """A table as printed: ``rows`` hold the values (numbers stay numbers)."""
        self.tables.append({"title": title, "columns": list(columns), "rows": [list(r) for r in rows], "note": note})

    def plot(self, name: str, title: str, *, x: Sequence[Any], series: Mapping[str, Sequence[float | None]],
             kind: str = "line", xlabel: str = "", ylabel: str = "", log: bool = False,
             floors: Iterable[str] = (),
             bands: Mapping[str, tuple[Sequence[float | None], Sequence[float | None]]] | None = None) -> None:
        """A plot of ``series`` (label -> one value per ``x``; ``None`` where a series has none) against ``x``:
        ``kind`` ``line`` (numbers on x; ``log``: both axes logarithmic) or ``bar`` (labels on x; ``log``: the
        values' axis logarithmic). Series named in ``floors`` are drawn dashed: what the others are compared with.
        ``bands`` (line plots): label -> (low, high) per ``x``, shaded around that series (a spread over seeds)."""
        if kind not in ("line", "bar"):
            raise ValueError(f"kind must be line or bar, got {kind!r}")
        if bands and (kind != "line" or set(bands) - set(series)):
            raise ValueError(f"bands belong to line plots and name their series; got {sorted(bands)} for "
                             f"{kind} series {sorted(series)}")
        self.plots.append({"name": name, "title": title, "kind": kind, "x": list(x),
                           "series": {label: list(values) for label, values in series.items()},
                           "xlabel": xlabel, "ylabel": ylabel, "log": log, "floors": list(floors),
                           "bands": {label: [list(low), list(high)] for label, (low, high) in (bands or {}).items()}})

    def verdict(self, line: str) -> None:
        """A target's verdict as printed (``PASS ...`` / ``MISS ...``)."""
        self.verdicts.append(line)

    def note(self, line: str) -> None:
        """A sentence the page shows under the tables (what a row means, what was not measured)."""
        self.notes.append(line)

    def as_dict(self) -> dict:
        head, dirty = commit()
        return _plain({"date": self.started.strftime("%Y-%m-%dT%H:%M:%SZ"), "commit": head, "dirty": dirty,
                       "command": self.command, "machine": machine(), "tables": self.tables, "plots": self.plots,
                       "verdicts": self.verdicts, "notes": self.notes})

    def save(self, directory: str = RESULTS_DIR) -> str:
        """Append this run to ``<directory>/<benchmark>.json`` (keeping the last `KEEP_RUNS`); returns the path."""
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"{self.record}.json")
        runs = load(path)
        runs.append(self.as_dict())
        with open(path + ".tmp", "w") as f:
            json.dump({"benchmark": self.record, "runs": runs[-KEEP_RUNS:]}, f, indent=1, allow_nan=False)
            f.write("\n")
        os.replace(path + ".tmp", path)
        print(f"results: {os.path.relpath(path, ROOT)} (run {len(runs[-KEEP_RUNS:])} of the file)", flush=True)
        return path


def say(record, line: str, prefix: str = "- ") -> None:
    """Print ``line`` after ``prefix`` (a list item by default) and record it with ``record`` (``results.verdict``
    or ``results.note``): what is printed and what is recorded stay one string."""
    print(f"{prefix}{line}")
    record(line)


def show(record: "Results", title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], note: str = "") -> None:
    """Record a table with ``record.table`` and print it as the benchmark's page renders it (`markdown_table`):
    what is printed and what is recorded stay one table."""
    record.table(title, columns, rows, note)
    print(f"\n{title}\n\n{markdown_table(record.tables[-1])}" + (f"\n\n{note}" if note else ""))


def _plain(value: Any) -> Any:
    """``value`` in JSON's own types: numpy and torch scalars become Python numbers, tuples lists, and NaN or an
    infinity ``None`` (``json.dump`` would write ``NaN``, which is not JSON: the documentation build, a browser or
    ``jq`` reject the whole file); a path into the checkout (a profile's ``filename:lineno``) is relative to it, so a
    results file names no directory of the machine it ran on."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, str):
        return value.replace(ROOT + os.sep, "")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    item = getattr(value, "item", None)  # numpy.int64, numpy.bool_, a 0-d tensor...
    return _plain(item()) if callable(item) else str(value)


def with_floors(x: Sequence[Any], series: Mapping[str, Sequence[float | None]], is_floor,
                suffix: str = " (floor)") -> tuple[dict[str, list], list[str]]:
    """For a bar plot whose ``x`` holds a table's rows, floors among them: each series split into its rows and,
    as ``<label><suffix>``, its floor rows (``is_floor(x)``), so the floors draw dashed. Returns ``(series, floors)``
    for `Results.plot`."""
    out = {label: [None if is_floor(at) else v for at, v in zip(x, values)] for label, values in series.items()}
    floors = {label + suffix: [v if is_floor(at) else None for at, v in zip(x, values)]
              for label, values in series.items()}
    floors = {label: values for label, values in floors.items() if any(v is not None for v in values)}
    return {**out, **floors}, list(floors)


def load(path: str) -> list[dict]:
    """The runs a results file holds, oldest first (none for a missing file)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        data = json.load(f)
    return list(data.get("runs", []))


# ---------------------------------------------------------------------------------------------- rendering
def _cell(value: Any) -> str:
    if isinstance(value, (list, tuple)):  # a range, low-high (collect.py's min-max)
        return "-".join(_cell(v) for v in value)
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        magnitude = abs(value)
        return f"{value:,.0f}" if magnitude >= 1000 else f"{value:.1f}" if magnitude >= 10 else f"{value:.2f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(table: Mapping[str, Any]) -> str:
    lines = [f"| {' | '.join(_cell(c) for c in table['columns'])} |", "|" + "---|" * len(table["columns"])]
    lines += [f"| {' | '.join(_cell(v) for v in row)} |" for row in table["rows"]]
    return "\n".join(lines)


def page(benchmark: str, runs: list[dict], image_dir: str = "") -> str:
    """The newest run of ``benchmark`` as Markdown: where and how it ran, its tables, plots and verdicts. Plots are
    referenced as ``<image_dir><benchmark>_<plot name>.png`` (see `plot_png`)."""
    if not runs:
        script = benchmark  # or, where one script keeps several files (learning_minatar), the script it names first
        if not os.path.exists(os.path.join(HERE, f"{script}.py")):
            script = benchmark.split("_")[0]
        return (f"No results recorded yet: run `python benchmarks/{script}.py` (it writes "
                f"`benchmarks/results/{benchmark}.json`).\n")
    run = runs[-1]
    m = run.get("machine", {})
    commit_text = f"`{run.get('commit')}`" + (" (with uncommitted changes)" if run.get("dirty") else "")
    lines = [
        "| run | |", "|---|---|",
        f"| command | `{run['command']}` |",
        f"| commit | {commit_text} |",
        f"| date | {run['date']} |",
        f"| machine | {m.get('cpu')}, {m.get('cores')} cores, {m.get('memory_gb')} GiB, {m.get('os')} |",
        f"| software | Python {m.get('python')}, torch {m.get('torch')} |",
        f"| runs in the file | {len(runs)} (`benchmarks/results/{benchmark}.json` keeps the history) |",
        "",
    ]
    if run.get("verdicts"):
        lines += ["**Targets**", ""] + [f"- {v}" for v in run["verdicts"]] + [""]
    for plot in run.get("plots", []):
        lines += [f"![{plot['title']}]({image_dir}{benchmark}_{plot['name']}.png)", ""]
    for table in run.get("tables", []):
        lines += [f"### {table['title']}", "", markdown_table(table), ""]
        if table.get("note"):
            lines += [table["note"], ""]
    lines += [f"- {note}" for note in run.get("notes", [])]
    return "\n".join(lines) + "\n"


def plot_png(plot: Mapping[str, Any]) -> bytes:
    """One recorded plot drawn as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = plot["x"]
    many = plot["kind"] == "bar" and len(labels) > 8  # long row labels: wider, and written steeply
    fig, ax = plt.subplots(figsize=(max(7.5, 0.42 * len(labels)) if many else 7.5, 6.0 if many else 4.2), dpi=110)
    floors = set(plot.get("floors", []))
    names = list(plot["series"])
    # one colour per series: the default cycle repeats after 10, past which two series would read as one
    palette = [plt.get_cmap("tab20")(i % 20) for i in range(len(names))] if len(names) > 10 else \
        [f"C{i}" for i in range(len(names))]
    colors = dict(zip(names, palette))
    for name in floors & set(names):  # a floor split off a series by with_floors keeps that series' colour
        colors[name] = next((colors[n] for n in names if n not in floors and name.startswith(n + " ")), colors[name])
    if plot["kind"] == "bar":
        # A series without a value at an x draws no bar there (not a bar of 0, which reads as measured, and which a
        # log axis cannot draw); the bars present at an x share its slot, centred on its tick.
        present = [[name for name in names if plot["series"][name][j] is not None] for j in range(len(labels))]
        width = 0.8 / max([1, *map(len, present)])
        drawn = set()
        for j, here in enumerate(present):
            for k, name in enumerate(here):
                ax.bar(j + (k - (len(here) - 1) / 2) * width, plot["series"][name][j], width, color=colors[name],
                       label=None if name in drawn else name, hatch="//" if name in floors else None,
                       alpha=0.55 if name in floors else 1.0, edgecolor="black" if name in floors else None,
                       linestyle="--" if name in floors else "-", linewidth=0.8 if name in floors else 0)
                drawn.add(name)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=60 if many else 20, ha="right", fontsize=7 if many else 8)
        if plot.get("log"):
            ax.set_yscale("log")
    else:
        for name, values in plot["series"].items():
            points = [(x, y) for x, y in zip(plot["x"], values) if y is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=name, linestyle="--" if name in floors else "-",
                        color=colors[name])
            low, high = plot.get("bands", {}).get(name, ([], []))
            spread = [(x, lo, hi) for x, lo, hi in zip(plot["x"], low, high) if lo is not None and hi is not None]
            if spread:
                xs, los, his = zip(*spread)
                ax.fill_between(xs, los, his, color=colors[name], alpha=0.2, linewidth=0)
        if plot.get("log"):
            ax.set_xscale("log")
            ax.set_yscale("log")
    ax.set_title(plot["title"], fontsize=10)
    ax.set_xlabel(plot.get("xlabel", ""))
    ax.set_ylabel(plot.get("ylabel", ""))
    ax.grid(True, alpha=0.3)
    handles, legend = ax.get_legend_handles_labels()
    if len(names) > 1 and handles:
        order = sorted(range(len(legend)), key=lambda i: names.index(legend[i]))  # the series' order, not the bars'
        where = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)} if len(names) > 5 else {}  # beside the data
        ax.legend([handles[i] for i in order], [legend[i] for i in order], fontsize=7, **where)
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", bbox_inches="tight")
    plt.close(fig)
    return out.getvalue()


HISTORY_ROWS = 15
"""Runs the generated history table shows (the newest); the results file keeps up to `KEEP_RUNS`."""


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def _targets(verdicts: Sequence[str]) -> str:
    """How many of a run's targets were met: the verdicts that start with `PASS` against those with `MISS`."""
    met = sum(1 for v in verdicts if v.startswith("PASS"))
    missed = sum(1 for v in verdicts if v.startswith("MISS"))
    if not met + missed:
        return "-"
    return f"{met} of {met + missed} met"


def history(benchmark: str, runs: list[dict], rows: int = HISTORY_ROWS) -> str:
    """Every recorded run of `benchmark` as a Markdown table, newest first: the date, the commit, the command (its
    script and arguments), the machine, how many targets the run met and what it measured (its first table's title).

    Args:
        benchmark: the results file's name (`learning_minatar` for `benchmarks/results/learning_minatar.json`).
        runs: the file's runs, oldest first, as `load` returns them.
        rows: the newest runs shown; a line under the table counts the older ones the file keeps.

    Returns:
        The table, or a sentence saying that no run is recorded.
    """
    path = f"benchmarks/results/{benchmark}.json"
    if not runs:
        return f"No runs recorded yet in `{path}`.\n"
    lines = ["| date | commit | command | machine | targets | measured |", "|---|---|---|---|---|---|"]
    for run in list(reversed(runs))[:rows]:
        m = run.get("machine", {})
        words = shlex.split(run.get("command", ""))
        script = next((w for w in words if w.endswith(".py")), "")
        arguments = shlex.join(words[words.index(script) + 1:]) if script else run.get("command", "")
        command = f"`{os.path.basename(script)} {arguments}`".replace("|", "\\|")
        commit_text = f"`{run.get('commit')}`" + (" + changes" if run.get("dirty") else "")
        cpu = f"{m.get('cpu')}, {m.get('cores')} cores" if m else "-"
        title = next((t["title"] for t in run.get("tables", [])), "")
        measured = _shorten(title.split(": ", 1)[0], 90) if title else "-"
        lines.append(f"| {str(run.get('date', '-'))[:10]} | {commit_text} | {command} | {_cell(cpu)} | "
                     f"{_targets(run.get('verdicts', []))} | {_cell(measured)} |")
    older = len(runs) - rows
    lines.append("")
    lines.append(f"{len(runs)} run{'s' if len(runs) > 1 else ''} recorded in `{path}`, newest first" +
                 (f"; the {older} older ones are in the file." if older > 0 else "."))
    return "\n".join(lines) + "\n"
