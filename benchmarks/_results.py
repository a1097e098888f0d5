"""What every benchmark writes beside the tables it prints, and how the documentation renders it.

A run is recorded with `Results`: the tables the script printed (title, columns, rows), the plots worth
drawing (a round trip against payload size per transport beside its floor, frames/s per placement...), the target
verdicts, and where it ran (machine, command, commit, date). `Results.save` appends the run to
`benchmarks/results/<benchmark>.json`: the file keeps the history, newest last. The documentation (`docs/hooks.py`)
renders the newest run with `page`, the file's runs as one table with `history`, and draws the newest run's plots
with `plot_png`: floors and bounds grey and hatched or dashed, many rows as horizontal bars, the legend below the
axes, and the published figures of `QUOTED` as stars on the learning curves they are compared with.

    results = Results("inference")
    results.table("1 client, p50", ["transport", "16 B us"], [["queue", 80.1]])
    results.plot("round_trip", "Round trip against payload", x=[16, 28672], series={"queue": [80, 90]}, kind="line",
                 xlabel="payload bytes", ylabel="p50 us", log=True)
    results.verdict("PASS process/shared_memory within 2x of direct")
    results.save()                          # benchmarks/results/inference.json

Helpers keep a script's printout and its record one: `say` prints a line and records it (a verdict or a
note), `show` a table; `with_floors` splits a bar plot's series so that the floor rows among its x draw as floors.
Values are stored as JSON's own types (`_plain`: numpy scalars become numbers, NaN and infinities `None`).
"""

from __future__ import annotations

import datetime
import html
import io
import json
import math
import os
import platform
import shlex
import subprocess
import re
import sys
import textwrap
from dataclasses import dataclass
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
             bands: Mapping[str, tuple[Sequence[float | None], Sequence[float | None]]] | None = None,
             references: Sequence[str] | None = None) -> None:
        """A plot of ``series`` (label -> one value per ``x``; ``None`` where a series has none) against ``x``:
        ``kind`` ``line`` (numbers on x; ``log``: both axes logarithmic) or ``bar`` (labels on x; ``log``: the
        values' axis logarithmic). Series named in ``floors`` are drawn dashed: what the others are compared with.
        ``bands`` (line plots): label -> (low, high) per ``x``, shaded around that series (a spread over seeds).
        ``references``: env ids of `QUOTED` whose published figures the plot draws (looked up when it is drawn, so a
        corrected figure redraws every plot of it)."""
        if kind not in ("line", "bar"):
            raise ValueError(f"kind must be line or bar, got {kind!r}")
        if bands and (kind != "line" or set(bands) - set(series)):
            raise ValueError(f"bands belong to line plots and name their series; got {sorted(bands)} for "
                             f"{kind} series {sorted(series)}")
        self.plots.append({"name": name, "title": title, "kind": kind, "x": list(x),
                           "series": {label: list(values) for label, values in series.items()},
                           "xlabel": xlabel, "ylabel": ylabel, "log": log, "floors": list(floors),
                           "bands": {label: [list(low), list(high)] for label, (low, high) in (bands or {}).items()},
                           **({} if references is None else {"references": list(references)})})

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
RANGE = re.compile(r"^[-+]?[\d.,]+ ?- ?[-+]?[\d.,]+$")
"""A range recorded as text (`207-217`, `3,795-6,132`)."""
RANGE_AFTER = re.compile(r"^(?P<value>\S+) (?P<range>[(\[][-+\d.,]+ ?- ?[-+\d.,]+[)\]])$")
"""A cell's value with its range after it (`24,576 (24,064-28,672)`, `5.16 [4.86-5.23]`), as the scripts record a
median with the spread over seeds or rounds."""


def _cell(value: Any) -> str:
    """One value as a table cell: numbers with thousands separators and three significant digits or so; a range
    (low-high) kept on one line (`class="range"`, see `docs/pages/stylesheets/extra.css`), so that a narrow column
    breaks between a median and its range, never inside the range."""
    if isinstance(value, (list, tuple)):  # a range, low-high (collect.py's min-max)
        return f'<span class="range">{"-".join(_cell(v) for v in value)}</span>'
    if isinstance(value, str) and (m := RANGE_AFTER.match(value)):
        return f'{_cell(m["value"])} <span class="range">{m["range"]}</span>'
    if isinstance(value, str) and RANGE.match(value):
        return f'<span class="range">{value}</span>'
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


WIDE_COLUMNS = 8
"""A recorded table with this many columns or more does not fit the page column: it is drawn turned (`markdown_table`)
when it has at most `TURNED_ROWS` rows."""
TURNED_ROWS = 6


def _command(text: str) -> str:
    """A command line as inline HTML code for a table cell: each argument kept on one line (`class="nowrap"`), so a
    narrow column breaks between arguments, never after the `--` of an option. Its text is the command's."""
    words = [html.escape(word).replace("|", "&#124;") for word in text.split(" ")]
    return "<code>" + " ".join(f'<span class="nowrap">{word}</span>' for word in words) + "</code>"


def markdown_table(table: Mapping[str, Any]) -> str:
    """A recorded table as Markdown. A wide one of few rows (a column per measured quantity, a row per cell of the
    benchmark) is turned: one column per recorded row, headed by its first cell, and one row per quantity, so that
    it reads down the page instead of running out of the column."""
    columns, rows = list(table["columns"]), [list(row) for row in table["rows"]]
    if len(columns) >= WIDE_COLUMNS and 0 < len(rows) <= TURNED_ROWS:
        columns, rows = ([columns[0]] + [row[0] for row in rows],
                         [[name] + [row[i] if i < len(row) else None for row in rows]
                          for i, name in enumerate(columns) if i])
    lines = [f"| {' | '.join(_cell(c) for c in columns)} |", "|" + "---|" * len(columns)]
    lines += [f"| {' | '.join(_cell(v) for v in row)} |" for row in rows]
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
        f"| command | {_command(run['command'])} |",
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


# ---------------------------------------------------------------------------------------------- quoted figures
CLEANRL_PPO = "https://docs.cleanrl.dev/rl-algorithms/ppo/"


@dataclass(frozen=True)
class Quoted:
    """A published figure set beside our learning curves: not measured here, quoted with its source.

    Attributes:
        source: who measured it, with what and on which env (`CleanRL ppo_atari.py, BreakoutNoFrameskip-v4,
            3 seeds`).
        url: where the figure is published.
        mean: the mean episode return the source gives.
        spread: the +/- the source gives beside it (CleanRL: the standard deviation over its seeds).
        frames: the agent steps it was measured at.
    """

    source: str
    url: str
    mean: float
    spread: float
    frames: int

    def label(self) -> str:
        """The legend's and a page's name for it: `quoted: <source>: <mean> +/- <spread> at <frames> agent steps`."""
        return f"quoted: {self.source}: {self.mean:g} +/- {self.spread:g} at {_count(self.frames)} agent steps"


QUOTED: dict[str, Quoted] = {
    "ALE/Breakout-v5": Quoted("CleanRL ppo_atari.py, BreakoutNoFrameskip-v4, 3 seeds", CLEANRL_PPO,
                              414.66, 28.09, 10_000_000),
    "ALE/Pong-v5": Quoted("CleanRL ppo_atari.py, PongNoFrameskip-v4, 3 seeds", CLEANRL_PPO, 20.36, 0.20, 10_000_000),
    "HalfCheetah-v5": Quoted("CleanRL ppo_continuous_action.py, HalfCheetah-v4, tag pr-424", CLEANRL_PPO,
                             1442.64, 46.03, 1_000_000),
}
"""The published figures the learning pages compare with, by the env id of ours each is set beside: one table, which
`benchmarks/learning.py` prints and verdicts against and `plot_png` draws on the learning curves of that env."""


def quoted_for(plot: Mapping[str, Any]) -> list[Quoted]:
    """The quoted figures a recorded plot is drawn with: those its `references` name (env ids of `QUOTED`), or, for
    a learning-curve plot recorded without them, those of the env its title names (`... on ALE/Breakout-v5: ...`)."""
    if plot.get("references") is not None:
        return [QUOTED[env] for env in plot["references"] if env in QUOTED]
    if plot.get("kind") != "line" or plot.get("name") != "curves":
        return []
    return [quoted for env, quoted in QUOTED.items() if f" on {env}:" in plot.get("title", "")]


def _count(n: float) -> str:
    """`10,000,000` as `10M`, `250,000` as `250k`: a frame count short enough for a tick or a legend."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:g}"


# ---------------------------------------------------------------------------------------------- drawing
MEASURED_COLORS = [f"C{i}" for i in range(10) if i != 7]
"""Measured series' colours: matplotlib's ten without its grey, which is the floors'."""
FLOOR_GREYS = ["0.6", "0.85", "0.4", "0.75", "0.5"]
"""Floor bars' fills (under a black hatch); floor lines take `FLOOR_LINE_GREYS`, darker to read as thin lines."""
FLOOR_LINE_GREYS = ["0.3", "0.5", "0.15", "0.6", "0.4"]
FLOOR_HATCHES = ["//", "xx", "\\\\", "..", "++"]
FLOOR_LINES = ["--", ":", "-.", (0, (6, 2, 1, 2, 1, 2)), (0, (1, 1))]
FLOOR_MARKERS = ["s", "^", "v", "D", "P"]
HORIZONTAL_ROWS = 6
"""A bar plot with more rows than this, or with a row label longer than `HORIZONTAL_LABEL`, draws horizontal bars."""
HORIZONTAL_LABEL = 22
LABEL_WIDTH = 44
"""Characters per line of a horizontal bar plot's row label (longer labels wrap)."""
WIDTH_IN = 7.5
"""Every plot's width in inches (825 pixels at its 110 dpi): what the page column shows without scaling fonts down."""
_FLOOR_WORD = re.compile(r"\b(floor|bound)\b", re.I)


RENAMED = {
    "floor (a) shm + semaphore": "shared-memory floor (shm copy + semaphore)",
    "floor (b) mp.Queue bytes": "queue floor (mp.Queue of bytes)",
    "floor (c) Ray actor call": "Ray floor (bare actor call)",
    "floor (d) gloo send/recv": "gloo floor (send/recv pair)",
    "floor (e) Monarch endpoint call": "Monarch floor (bare endpoint call)",
}
"""Series recorded under a name since replaced (`benchmarks/inference.py`'s floors were lettered): drawn under
the new one, so a plot of an older run names its floors as the pages do."""


def _renamed(plot: Mapping[str, Any]) -> dict:
    plot = dict(plot)
    plot["series"] = {RENAMED.get(name, name): values for name, values in plot["series"].items()}
    plot["floors"] = [RENAMED.get(name, name) for name in plot.get("floors", [])]
    plot["bands"] = {RENAMED.get(name, name): band for name, band in (plot.get("bands") or {}).items()}
    return plot


PEER_ROWS = ("peer: ", "CleanRL-style loop", "Sample Factory ")
"""How a bar plot's row label starts where the row is a peer measured in the same run (another project's code):
drawn as measured, in a colour of its own."""


def _split_rows(plot: Mapping[str, Any]) -> dict:
    """A bar plot whose rows name floors, bounds or peers (`floor: csv row`, `overlap bound`, `Sample Factory 2.1.1
    APPO`) but whose record drew them as its measured series: those rows split off each measured series
    (`with_floors`) into `<series> (floor)`, `<series> (bound)` (`<series> (overlap bound)` where the title or a row
    says so), drawn as floors, and `<series> (peer)`, drawn as measured in a colour of its own."""
    plot = dict(plot)
    if plot["kind"] != "bar":
        return plot
    floors = list(plot.get("floors", []))
    measured = {name: values for name, values in plot["series"].items() if name not in floors}
    text = " ".join([plot.get("title", ""), *map(str, plot["x"])]).lower()

    def kind(row: Any) -> str | None:
        row = str(row)
        if row.startswith(PEER_ROWS):
            return "peer"
        found = _FLOOR_WORD.search(row)
        if found and found.group(1).lower() == "bound":
            return "overlap bound" if "overlap bound" in text else "bound"
        return "floor" if found else None

    base, extra, drawn_as_floors = dict(measured), {}, []
    for what in ("peer", "floor", "bound", "overlap bound"):
        rows = [at for at in plot["x"] if kind(at) == what]
        mixed = {name: values for name, values in base.items()  # a series already of these rows alone stays whole
                 if any(v is not None for at, v in zip(plot["x"], values) if at not in rows)}
        if not rows or all(values[plot["x"].index(row)] is None for values in mixed.values() for row in rows):
            continue
        split, new = with_floors(plot["x"], mixed, lambda at: at in rows, f" ({what})")
        base = {name: split.get(name, values) for name, values in base.items()}
        extra.update({name: split[name] for name in new})
        drawn_as_floors += [] if what == "peer" else new
    if not extra:
        return plot
    plot["series"] = {**base, **extra, **{name: plot["series"][name] for name in floors}}
    plot["floors"] = floors + drawn_as_floors
    return plot


def _styles(names: Sequence[str], floors: set) -> dict[str, dict]:
    """Each series' look: measured ones a colour each (a floor split off a series by `with_floors` is still a floor,
    never that series' colour), floors a grey, hatch, dash and marker each."""
    measured = [name for name in names if name not in floors]
    colors = MEASURED_COLORS if len(measured) <= len(MEASURED_COLORS) else \
        [f"tab20:{i}" for i in range(20) if i not in (14, 15)]
    styles = {}
    for i, name in enumerate(measured):
        styles[name] = {"color": colors[i % len(colors)], "floor": False}
    for i, name in enumerate(name for name in names if name in floors):
        styles[name] = {"color": FLOOR_GREYS[i % len(FLOOR_GREYS)], "line_color": FLOOR_LINE_GREYS[i % 5],
                        "hatch": FLOOR_HATCHES[i % len(FLOOR_HATCHES)],
                        "line": FLOOR_LINES[i % len(FLOOR_LINES)], "marker": FLOOR_MARKERS[i % len(FLOOR_MARKERS)],
                        "floor": True}
    return styles


def _color(name: str):
    if name.startswith("tab20:"):
        import matplotlib

        return matplotlib.colormaps["tab20"](int(name.split(":")[1]))
    return name


def is_horizontal(plot: Mapping[str, Any]) -> bool:
    """Whether `plot_png` draws `plot` with horizontal bars: a bar plot of many rows or long row labels, whose labels
    would otherwise be written steeply across a wide image."""
    return plot["kind"] == "bar" and (len(plot["x"]) > HORIZONTAL_ROWS
                                      or max((len(str(at)) for at in plot["x"]), default=0) > HORIZONTAL_LABEL)


def plot_figure(plot: Mapping[str, Any]):
    """One recorded plot drawn as a matplotlib `Figure` (`plot_png` saves it; a test can look at its artists).

    Measured series take a colour each; floors and bounds (the plot's `floors`, and bar rows whose label names a
    floor or bound) are grey, hatched or dashed, with a dashed black outline on bars; quoted figures (`quoted_for`)
    are black stars with the source's +/- as error bars. A bar plot of many rows or long labels draws horizontal bars,
    its rows top to bottom in the table's order. The legend sits outside the axes, below them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    plot = _split_rows(_renamed(plot))
    names = list(plot["series"])
    floors = set(plot.get("floors", [])) & set(names)
    styles = _styles(names, floors)
    labels = [str(at) for at in plot["x"]]
    horizontal = is_horizontal(plot)
    quoted = quoted_for(plot)
    entries = len(names) + len(quoted)
    legend_lines = 0 if entries < 2 else math.ceil(entries / _legend_columns(plot, quoted))
    if horizontal:
        wrapped = [textwrap.fill(label, LABEL_WIDTH) for label in labels]
        present = max(1, *(sum(plot["series"][n][j] is not None for n in names) for j in range(len(labels))))
        row = max(0.28, 0.15 * max(w.count("\n") + 1 for w in wrapped) + 0.08, 0.12 * present + 0.08)
        height = 1.3 + row * len(labels) + 0.2 * legend_lines
    else:
        height = 4.2 + 0.2 * legend_lines
    fig, ax = plt.subplots(figsize=(WIDTH_IN, height), dpi=110, layout="constrained")
    if plot["kind"] == "bar":
        _bars(ax, plot, names, styles, horizontal, wrapped if horizontal else labels)
        measured = [v for values in plot["series"].values() for v in values if v is not None]
        if measured and max(measured) >= 10_000 and not plot.get("log"):
            (ax.xaxis if horizontal else ax.yaxis).set_major_formatter(FuncFormatter(lambda value, _: _count(value)))
    else:
        _lines(ax, plot, styles, quoted)
        numbers = [at for at in plot["x"] if isinstance(at, (int, float))]
        if numbers and all(isinstance(at, int) for at in numbers) and max(numbers) < 1000 and not plot.get("log"):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        elif numbers and max(numbers) >= 10_000 and not plot.get("log"):
            ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: _count(value)))
    fig.suptitle(textwrap.fill(plot["title"], 90), fontsize=10)
    ax.set_xlabel(plot.get("ylabel", "") if horizontal else plot.get("xlabel", ""))
    ax.set_ylabel("" if horizontal else plot.get("ylabel", ""))
    ax.grid(True, alpha=0.3, axis="x" if horizontal else "both")
    ax.set_axisbelow(True)
    handles, legend = ax.get_legend_handles_labels()
    if entries > 1 and handles:
        order = sorted(range(len(legend)), key=lambda i: (names + [q.label() for q in quoted]).index(legend[i]))
        fig.legend([handles[i] for i in order], [legend[i] for i in order], fontsize=7, frameon=False,
                   loc="outside lower center", ncols=_legend_columns(plot, quoted))
    return fig


def _legend_columns(plot: Mapping[str, Any], quoted: Sequence[Quoted]) -> int:
    longest = max([len(name) for name in plot["series"]] + [len(q.label()) for q in quoted] + [1])
    return 1 if longest > 48 else 2 if longest > 28 else 3


def _bars(ax, plot, names, styles, horizontal, labels) -> None:
    """Bars: a series without a value at a row draws no bar there (not a bar of 0, which reads as measured and which
    a log axis cannot draw); the bars present at a row share its slot, centred on its tick."""
    present = [[name for name in names if plot["series"][name][j] is not None] for j in range(len(labels))]
    width = 0.8 / max([1, *map(len, present)])
    drawn = set()
    draw = ax.barh if horizontal else ax.bar
    for j, here in enumerate(present):
        for k, name in enumerate(here):
            style = styles[name]
            look = {"color": _color(style["color"]), "label": None if name in drawn else name, "gid": name}
            if style["floor"]:
                look.update(hatch=style["hatch"], edgecolor="black", linestyle="--", linewidth=0.9)
            else:
                look.update(linewidth=0)
            draw(j + (k - (len(here) - 1) / 2) * width, plot["series"][name][j], width, **look)
            drawn.add(name)
    if horizontal:
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylim(len(labels) - 0.5, -0.5)  # the table's first row on top
        if plot.get("log"):
            ax.set_xscale("log")
    else:
        ax.set_xticks(range(len(labels)), labels, rotation=20 if len(labels) > 3 else 0,
                      ha="right" if len(labels) > 3 else "center", fontsize=8)
        if plot.get("log"):
            ax.set_yscale("log")


def _lines(ax, plot, styles, quoted) -> None:
    """Lines (floors dashed grey with open markers), each band shaded around its series, and the quoted figures as
    stars: where one lies far past the run's frames or returns, the axes turn logarithmic so both stay readable."""
    values = []
    for name, ys in plot["series"].items():
        style = styles[name]
        points = [(x, y) for x, y in zip(plot["x"], ys) if y is not None]
        values += [y for _, y in points]
        if points:
            if style["floor"]:
                ax.plot(*zip(*points), marker=style["marker"], markerfacecolor="white", markersize=5, label=name,
                        linestyle=style["line"], color=style["line_color"], linewidth=1.6)
            else:
                ax.plot(*zip(*points), marker="o", markersize=4, label=name, color=_color(style["color"]))
        low, high = plot.get("bands", {}).get(name, ([], []))
        spread = [(x, lo, hi) for x, lo, hi in zip(plot["x"], low, high) if lo is not None and hi is not None]
        if spread:
            xs, los, his = zip(*spread)
            ax.fill_between(xs, los, his, color=_color(style["color"]), alpha=0.2, linewidth=0)
    for q in quoted:
        ax.errorbar([q.frames], [q.mean], yerr=[q.spread], fmt="*", markersize=13, color="black",
                    markeredgecolor="white", capsize=4, label=q.label(), zorder=5)
    numbers = [x for x in plot["x"] if isinstance(x, (int, float))]
    if plot.get("log"):
        ax.set_xscale("log")
        ax.set_yscale("log")
    elif quoted and numbers:
        if max(q.frames for q in quoted) > 3 * max(numbers):
            ax.set_xscale("log")
        everything = values + [q.mean for q in quoted]
        if everything and min(everything) > 0 and max(everything) > 10 * max(values or [1]):
            ax.set_yscale("log")


def plot_png(plot: Mapping[str, Any]) -> bytes:
    """One recorded plot drawn as a PNG (`plot_figure`)."""
    import matplotlib.pyplot as plt

    fig = plot_figure(plot)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    plt.close(fig)
    return out.getvalue()


HISTORY_ROWS = 15
"""Runs the generated history table shows (the newest); the results file keeps up to `KEEP_RUNS`."""
HISTORY_OPEN = 3
"""Of those, the newest shown open; the others are in a block the reader opens ("12 earlier runs")."""


def _targets(verdicts: Sequence[str]) -> str:
    """How many of a run's targets were met: the verdicts that start with `PASS` against those with `MISS`."""
    met = sum(1 for v in verdicts if v.startswith("PASS"))
    missed = sum(1 for v in verdicts if v.startswith("MISS"))
    if not met + missed:
        return "-"
    return f"{met} of {met + missed} met"


def _cpu(machine: Mapping[str, Any]) -> str:
    """A run's CPU as a table shows it: its model without the (R), (TM) and "Processor" noise."""
    return re.sub(r"[(](R|TM)[)]| Processor", "", str(machine.get("cpu")))


def _commit_text(run: Mapping[str, Any]) -> str:
    """A run's commit as code, and "+ changes" where the tree had uncommitted changes."""
    return f"`{run.get('commit')}`" + (" + changes" if run.get("dirty") else "")


def history(benchmark: str, runs: list[dict], rows: int = HISTORY_ROWS) -> str:
    """Every recorded run of `benchmark` as a Markdown table, newest first: the date, the commit, the machine, how
    many targets the run met, and the command (its script and arguments, the widest column, last). The newest
    `HISTORY_OPEN` runs are shown; the older ones are in a collapsed block below them ("12 earlier runs").

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
    header = ["| date | commit | machine | targets | command |", "|---|---|---|---|---|"]
    lines = list(header)
    shown = list(reversed(runs))[:rows]
    for n, run in enumerate(shown):
        if n == HISTORY_OPEN and len(shown) > HISTORY_OPEN + 1:  # the older ones in a block the reader opens
            lines += ["", f'??? note "{len(shown) - n} earlier runs"', ""]
            header = ["    " + line for line in header]
            lines += header
        m = run.get("machine", {})
        words = shlex.split(run.get("command", ""))
        script = next((w for w in words if w.endswith(".py")), "")
        arguments = shlex.join(words[words.index(script) + 1:]) if script else run.get("command", "")
        command = _command(f"{os.path.basename(script)} {arguments}")
        commit_text = _commit_text(run)
        cpu = f"{_cpu(m)}, {m.get('cores')} cores" if m else "-"
        date = str(run.get("date", "-"))[:10]
        indent = header[0][:len(header[0]) - len(header[0].lstrip())]
        lines.append(f'{indent}| <span style="white-space: nowrap">{date}</span> | {commit_text} | {_cell(cpu)} | '
                     f"{_targets(run.get('verdicts', []))} | {command} |")
    older = len(runs) - rows
    lines.append("")
    lines.append(f"{len(runs)} run{'s' if len(runs) > 1 else ''} recorded in `{path}`, newest first" +
                 (f"; the {older} older ones are in the file." if older > 0 else "."))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- headlines
@dataclass(frozen=True)
class Figure:
    """One figure of a benchmark's headline: cells of a row of the newest run's tables, set in a few words.

    Attributes:
        text: the words around the values: `{column}` stands for the row's value in that column, `{column#2}` for
            the second column of that name, `{prefix*}` for the last column whose name starts with `prefix`
            (`{return at *}`: the return at the run's last frame count).
        row: the row: its first cell (a trailing ` *` mark ignored, and a label followed by more words matches, as
            `ppo process/local_policy` matches `ppo process/local_policy (recorded in ...)`), a tuple of its first
            cells, or `None` for the first row.
        table: the table: its index in the run, or the start of its title.
    """

    text: str
    row: str | tuple[str, ...] | None = None
    table: int | str = 0


@dataclass(frozen=True)
class Headline:
    """One row of the benchmarks index: a results file, the page that shows it, and the figures quoted from its
    newest run.

    Attributes:
        results: the results file's name (`atari` for `benchmarks/results/atari.json`).
        page: the page that shows it, relative to the index (`atari.md`).
        title: the page's name in the row.
        measures: what the file's runs measure, against what.
        figures: the figures the headline quotes; where none can be read from the newest run (a rerun renamed its
            rows), its first verdict stands instead.
    """

    results: str
    page: str
    title: str
    measures: str
    figures: tuple[Figure, ...] = ()


def _quoted_mean(env: str) -> str:
    return _cell(float(QUOTED[env].mean))


HEADLINES: tuple[Headline, ...] = (
    Headline("ppo_cartpole", "ppo_cartpole.md", "PPO on CartPole",
             "frames and seconds to solve CartPole-v1 with PPO, per placement",
             (Figure("`direct` {frames/s} frames/s", "direct"),
              Figure("`process/shared_memory` {frames/s}", "process/shared_memory"),
              Figure("`ray` {frames/s}", "ray"),
              Figure("start-up `direct` {start-up s} s", "direct"),
              Figure("`ray` {start-up s} s", "ray"))),
    Headline("impala_cartpole", "impala_cartpole.md", "IMPALA on CartPole",
             "frames to solve CartPole-v1 with IMPALA beside PPO, per placement",
             (Figure("IMPALA on `thread` solves {solved} seeds in {x PPO}x PPO's frames", ("thread", "impala")),
              Figure("on `ray` {x PPO}x", ("ray", "impala")))),
    Headline("atari", "atari.md", "PPO on Atari",
             "PPO-Atari training frames/s per placement, beside a CleanRL-style loop (peer) and the overlap bound",
             (Figure("`direct` {frames/s} [{range}] frames/s, {x loop}x the CleanRL-style loop", "direct"),
              Figure("`process/local_policy async nice` {of the bound} of the bound",
                     "process/local_policy async nice"))),
    Headline("collect_atari", "atari.md", "PPO on Atari",
             "collecting Atari frames with no learning, beside a raw gymnasium loop",
             (Figure("two process workers with policy replicas {frames/s median} frames/s, "
                     "{ratio to raw gymnasium sync}x the raw loop",
                     "Collector process x2 sync=False [policy replica in each worker]"),)),
    Headline("impala_atari", "impala_atari.md", "IMPALA on Atari",
             "IMPALA and APPO on Atari: frames/s and return beside PPO, the overlap bound and Sample Factory (peer)",
             (Figure("APPO {frames/s} [{range}] frames/s, {x best sync PPO}x the best PPO row, return {return} "
                     "[{range#2}]", "appo process/local_policy ale_vector"),
              Figure("PPO `direct` {frames/s} [{range}] frames/s, return {return} [{range#2}]", "ppo direct"),
              Figure("Sample Factory's APPO {frames/s} [{range}] frames/s", "Sample Factory 2.1.1 APPO"))),
    Headline("learning_minatar", "learning.md", "Learning curves",
             "mean return against frames on MinAtar Breakout, per recipe",
             (Figure("final return: APPO {return at *}", "appo process/shared_memory"),
              Figure("PPO {return at *}", "ppo process/shared_memory"),
              Figure("IMPALA {return at *}", "impala process/shared_memory"))),
    Headline("learning_breakout", "learning.md", "Learning curves",
             "mean return against frames on Atari Breakout, per recipe, beside CleanRL's published figure (quoted)",
             (Figure("final return: APPO {return at *}", "appo process/local_policy"),
              Figure("PPO {return at *}", "ppo process/local_policy"))),
    Headline("learning_halfcheetah", "learning.md", "Learning curves",
             "mean return against frames on MuJoCo HalfCheetah with PPO, beside CleanRL's published figure (quoted)",
             (Figure("final return {return at *}, against CleanRL's published "
                     f"{_quoted_mean('HalfCheetah-v5')} (quoted)", "direct"),)),
    Headline("inference", "inference.md", "Inference round trips",
             "inference round trips per placement and transport, beside the mechanism under each (floors)",
             (Figure("28 KB, one client: `process/shared_memory` {p50 us} us", ("process/shared_memory", "1"), "28KB"),
              Figure("`process/queue` {p50 us} us", ("process/queue", "1"), "28KB"),
              Figure("`ray/ray` {p50 us} us", ("ray/ray", "1"), "28KB"),
              Figure("`ray/distributed` {p50 us} us", ("ray/distributed", "1"), "28KB"))),
    Headline("replay", "replay.md", "Replay",
             "replay `extend` and `sample` per placement and transport, beside the direct buffer and floors",
             (Figure("sampling 256 Atari frame stacks: `process/shared_memory` {sample p50 us} us, "
                     "{sample p50 / direct}x the direct buffer", "process/shared_memory", "84x84x4"),
              Figure("`process/queue` {sample p50 / direct}x", "process/queue", "84x84x4"))),
    Headline("logger", "logger.md", "Logger",
             "acknowledged `log_scalar` per logger and placement, beside a bare CSV write and Pipe round trip "
             "(floors) and TorchRL's process logger (peer)",
             (Figure("`csv / process` {p50 us} us", "csv / process"),
              Figure("`tensorboard / process` {p50 us} us", "tensorboard / process"),
              Figure("TorchRL's process logger {p50 us} us in the same run", "peer: TorchRL"))),
    Headline("collect", "collect.md", "Collection",
             "CartPole frames/s with no learning, beside a raw gymnasium loop",
             (Figure("64 envs: two process workers with policy replicas {frames/s median} [{min-max}] frames/s, "
                     "{ratio to raw gymnasium sync}x the raw loop",
                     "Collector process x2 sync=False [policy replica in each worker]", "64 envs"),
              Figure("`direct` {ratio to raw gymnasium sync}x", "Collector direct [direct server]", "64 envs"))),
    Headline("load", "load.md", "Load",
             "many concurrent callers, every answer and row checked, the owner's memory watched"),
    Headline("hosts", "hosts.md", "Several hosts",
             "a `distributed` endpoint between two hosts beside a bare gloo pair; what each endpoint holds",
             (Figure("a frame-stack round trip {p50 us} us, {ratio to the veth floor}x a bare gloo pair's",
                     "distributed, b calls a across the veth"),)),
    Headline("hosts_appo", "hosts.md", "Several hosts",
             "APPO with its collectors on another host, against the same plan on one host",
             (Figure("across hosts {steady frames/s} [{range}] of one host's steady frames/s",
                     "across / one host (per round)"),)),
    Headline("sigterm", "sigterm.md", "SIGTERM",
             "SIGTERM to a Ray run's whole process group: exit status, time to exit, what is left",
             (Figure("{all good} of {tries} tries all good (exit statuses {exit statuses}), {median s to exit} s "
                     "from the signal to the exit (median)", None),)),
    Headline("gpu", "gpu.md", "GPU rows",
             "static-graph and pinned inference batches, the learner on the GPU, APPO against pure simulation"),
)
"""The benchmarks index's rows, in its order: one per results file (a page may show several), with the figures its
headline quotes from the file's newest run (`headlines`)."""

PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


def _find_table(run: Mapping[str, Any], which: int | str) -> Mapping[str, Any] | None:
    tables = run.get("tables", [])
    if isinstance(which, int):
        return tables[which] if which < len(tables) else None
    return next((t for t in tables if str(t.get("title", "")).startswith(which)), None)


def _label(value: Any) -> str:
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return text.strip().removesuffix(" *")


def _find_row(table: Mapping[str, Any], row: str | tuple[str, ...] | None) -> Sequence[Any] | None:
    rows = table.get("rows", [])
    if row is None:
        return rows[0] if rows else None
    keys = (row,) if isinstance(row, str) else row
    for exact in (True, False):
        for candidate in rows:
            cells = [_label(c) for c in candidate[:len(keys)]]
            if all(c == k if exact else (c == k or c.startswith(k + " ")) for c, k in zip(cells, keys)):
                return candidate
    return None


def _column(columns: Sequence[str], name: str) -> int | None:
    """The index of the column `name` names: `x`, `x#2` (the second column called x), `prefix*` (the last column
    whose name starts with prefix)."""
    if name.endswith("*"):
        found = [i for i, c in enumerate(columns) if str(c).startswith(name[:-1])]
        return found[-1] if found else None
    name, _, nth = name.partition("#")
    found = [i for i, c in enumerate(columns) if c == name]
    n = int(nth or 1)
    return found[n - 1] if len(found) >= n else None


def figure_text(run: Mapping[str, Any], figure: Figure) -> str | None:
    """`figure` read from `run`: its text with each placeholder replaced by the cell it names, or `None` where the
    run has no such table, row, column or value."""
    table = _find_table(run, figure.table)
    row = _find_row(table, figure.row) if table else None
    if row is None:
        return None
    values = []
    for name in PLACEHOLDER.findall(figure.text):
        i = _column(table["columns"], name)
        if i is None or i >= len(row) or row[i] is None:
            return None
        values.append(_cell(row[i]))
    parts = PLACEHOLDER.split(figure.text)
    return "".join(part if k % 2 == 0 else values[k // 2] for k, part in enumerate(parts))


def headline(runs: list[dict], figures: Sequence[Figure]) -> str:
    """What the newest of `runs` says in one cell: its figures that can be read from it, joined by `; `, else its
    first verdict (without its PASS or MISS), else `-`."""
    if not runs:
        return "no run recorded yet"
    run = runs[-1]
    found = [text for text in (figure_text(run, f) for f in figures) if text]
    if found:
        return "; ".join(found)
    verdicts = run.get("verdicts", [])
    if verdicts:
        return _cell(re.sub(r"^(PASS|MISS):? ", "", verdicts[0]))
    return "-"


def headlines(results_dir: str = RESULTS_DIR, rows: Sequence[Headline] = HEADLINES) -> str:
    """The benchmarks index's table, one row per results file from its newest run: the page, what it measures,
    when, where and at which commit the run was made with how many of its targets it met, and its headline figures.

    Args:
        results_dir: where the results files are (`benchmarks/results`).
        rows: the rows (`HEADLINES`).

    Returns:
        The Markdown table.
    """
    lines = ["| page | what it measures | newest run | headline |", "|---|---|---|---|"]
    for row in rows:
        runs = load(os.path.join(results_dir, f"{row.results}.json"))
        if runs:
            run, m = runs[-1], runs[-1].get("machine", {})
            targets = _targets(run.get("verdicts", []))
            when = (f'<span class="nowrap">{str(run.get("date", "-"))[:10]}</span> {_commit_text(run)}'
                    + f'<br><span class="nowrap">{_cpu(m)}, {m.get("cores")} cores</span>'
                    + ("" if targets == "-" else f'<br><span class="nowrap">targets {targets}</span>'))
        else:
            when = "-"
        lines.append(f"| [{row.title}]({row.page}) | {row.measures} | {when} | {headline(runs, row.figures)} |")
    return "\n".join(lines) + "\n"
