"""How the benchmark pages draw recorded runs (benchmarks/_results.py): plots that read at page-column width, floors
that never look measured, legends off the data, quoted figures on the learning curves, and the history table."""

import json
import os
import re
import sys

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import _results  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    import matplotlib.pyplot as plt

    yield
    plt.close("all")


def bar_plot(rows, series, floors=(), log=False, title="frames/s per row"):
    return {"name": "fps", "title": title, "kind": "bar", "x": list(rows), "series": series,
            "xlabel": "row", "ylabel": "frames/s", "log": log, "floors": list(floors), "bands": {}}


def bars(fig):
    """Each drawn bar with the name of its series (`plot_figure` gives every bar its series' name as its gid)."""
    return [(patch.get_gid(), patch) for patch in fig.axes[0].patches if isinstance(patch, Rectangle)]


def collect_like():
    """38 rows of long labels, two env counts, two raw-loop rows split off as floors (as collect.py records)."""
    rows = ["raw gymnasium sync", "raw gymnasium async"] + [
        f"Collector process x{k} sync={s} groups=2 [process/shared_memory] #{i}"
        for i, (k, s) in enumerate([(k, s) for k in (1, 2) for s in (True, False)] * 9)]
    values = {"16 envs": [40_000.0 + i for i in range(len(rows))], "64 envs": [80_000.0 + i for i in range(len(rows))]}
    series, floors = _results.with_floors(rows, values, lambda row: row.startswith("raw "), " (raw loop)")
    return bar_plot(rows, series, floors)


def test_a_many_row_bar_plot_draws_horizontal_bars_whose_labels_read_unrotated():
    plot = collect_like()
    assert _results.is_horizontal(plot)
    fig = _results.plot_figure(plot)
    ax = fig.axes[0]
    width_px = fig.get_figwidth() * fig.dpi
    assert width_px <= 900, f"a {width_px:.0f}-pixel-wide plot is shrunk into the page column"
    labels = [t.get_text().replace("\n", " ") for t in ax.get_yticklabels()]
    assert labels == plot["x"], "the rows are the y axis, top to bottom in the table's order"
    assert ax.get_ylim()[0] > ax.get_ylim()[1], "the first row on top"
    assert all(t.get_rotation() == 0 and t.get_fontsize() >= 8 for t in ax.get_yticklabels())
    drawn = [patch for _, patch in bars(fig)]
    heights = {round(patch.get_height(), 6) for patch in drawn}
    assert len(heights) == 1, "horizontal bars share one thickness and vary in length"
    assert max(patch.get_width() for patch in drawn) > 80_000


def test_a_short_bar_plot_stays_vertical():
    plot = bar_plot(["direct", "ray"], {"frames/s": [1.0, 2.0]})
    assert not _results.is_horizontal(plot)
    ax = _results.plot_figure(plot).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["direct", "ray"]


def test_floor_bars_never_take_a_measured_bars_colour_and_are_hatched_with_a_dashed_outline():
    fig = _results.plot_figure(collect_like())
    measured = {to_rgba(p.get_facecolor()) for label, p in bars(fig) if not label.endswith("(raw loop)")}
    floors = [p for label, p in bars(fig) if label.endswith("(raw loop)")]
    assert floors and measured
    for patch in floors:
        assert to_rgba(patch.get_facecolor()) not in measured
        assert patch.get_hatch(), "a floor bar is hatched"
        assert patch.get_linestyle() in ("--", "dashed"), patch.get_linestyle()
    assert len({patch.get_hatch() for patch in floors}) == 2, "two floor series, two hatches"


def test_bound_rows_recorded_as_measured_bars_are_drawn_as_the_pages_overlap_bound():
    plot = bar_plot(["direct", "process/local_policy async", "overlap bound"], {"frames/s": [213.0, 230.0, 293.0]},
                    title="PPO on ALE/Breakout-v5: median frames/s per row, and the overlap bound")
    fig = _results.plot_figure(plot)
    by_label = {label: patch for label, patch in bars(fig)}
    assert set(by_label) == {"frames/s", "frames/s (overlap bound)"}
    bound = [patch for label, patch in bars(fig) if label == "frames/s (overlap bound)"]
    assert len(bound) == 1 and bound[0].get_hatch()
    assert to_rgba(bound[0].get_facecolor()) != to_rgba(by_label["frames/s"].get_facecolor())
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["frames/s", "frames/s (overlap bound)"]


def test_a_peer_row_recorded_as_a_measured_bar_is_drawn_as_measured_in_a_colour_of_its_own():
    plot = bar_plot(["ppo direct", "appo process/local_policy", "Sample Factory 2.1.1 APPO", "appo bound"],
                    {"frames/s": [310.0, 443.0, 318.0, 581.0]},
                    title="IMPALA and APPO: median frames/s per row, and each recipe's overlap bound")
    fig = _results.plot_figure(plot)
    by_label = {label: patch for label, patch in bars(fig)}
    assert set(by_label) == {"frames/s", "frames/s (peer)", "frames/s (overlap bound)"}
    peer = by_label["frames/s (peer)"]
    assert not peer.get_hatch(), "a peer is measured, not a floor"
    assert to_rgba(peer.get_facecolor()) != to_rgba(by_label["frames/s"].get_facecolor())
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["frames/s", "frames/s (peer)",
                                                                  "frames/s (overlap bound)"]


def test_a_peer_recorded_in_a_series_of_its_own_keeps_its_name():
    rows = ["floor: Pipe round trip", "csv / process", "peer: TorchRL 0.14.1 ProcessLogger(CSVLogger)"]
    plot = bar_plot(rows, {"p50 us": [None, 190.0, None], "p50 us, TorchRL peer": [None, None, 1500.0],
                           "p50 us (floor)": [36.0, None, None]}, floors=["p50 us (floor)"], log=True)
    fig = _results.plot_figure(plot)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(plot["series"])


def test_floor_lines_never_take_a_measured_lines_colour_and_are_dashed():
    names = [f"cell {i}" for i in range(9)] + [f"floor {i}" for i in range(5)]
    plot = {"name": "round_trip", "title": "p50 round trip", "kind": "line", "x": [16, 28_224, 1_048_576],
            "series": {name: [1.0 + i, 2.0 + i, 3.0 + i] for i, name in enumerate(names)}, "xlabel": "bytes",
            "ylabel": "us", "log": True, "floors": names[9:], "bands": {}}
    ax = _results.plot_figure(plot).axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    measured = {to_rgba(lines[name].get_color()) for name in names[:9]}
    assert len(measured) == 9, "nine measured series, nine colours"
    for name in names[9:]:
        assert to_rgba(lines[name].get_color()) not in measured
        assert lines[name].get_linestyle() not in ("-", "solid")


def overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("plot", [collect_like(), bar_plot(["a", "b"], {"x": [1.0, 2.0], "y": [3.0, 2.0]})],
                         ids=["many rows", "few rows"])
def test_the_legend_sits_outside_the_axes_and_names_every_series(plot):
    fig = _results.plot_figure(plot)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert fig.axes[0].get_legend() is None, "no legend inside the axes"
    (legend,) = fig.legends
    assert not overlaps(legend.get_window_extent(renderer), fig.axes[0].get_window_extent(renderer))
    assert [t.get_text() for t in legend.get_texts()] == list(plot["series"])


def test_every_recorded_plot_keeps_its_legend_off_the_data_and_its_floors_grey():
    drawn = 0
    for name in sorted(os.listdir(_results.RESULTS_DIR)):
        runs = _results.load(os.path.join(_results.RESULTS_DIR, name)) if name.endswith(".json") else []
        for plot in (runs[-1].get("plots", []) if runs else []):
            fig = _results.plot_figure(plot)  # not drawn: the synthetic plots above check where a legend lands
            ax = fig.axes[0]
            assert ax.get_legend() is None, f"{name} {plot['name']}: a legend inside the axes"
            assert len(fig.legends) <= 1, "one figure legend, which constrained layout keeps off the axes"
            assert fig.get_figwidth() * fig.dpi <= 900, f"{name} {plot['name']} is too wide for the page column"
            measured = {to_rgba(p.get_facecolor()) for label, p in bars(fig) if not p.get_hatch()}
            assert not any(to_rgba(p.get_facecolor()) in measured for label, p in bars(fig) if p.get_hatch()), \
                f"{name} {plot['name']}: a floor bar in a measured bar's colour"
            if plot["kind"] == "bar":  # a row that names a floor or bound draws only floor bars
                for _, patch in bars(fig):
                    centre = patch.get_y() + patch.get_height() / 2 if _results.is_horizontal(plot) else \
                        patch.get_x() + patch.get_width() / 2
                    row = str(plot["x"][round(centre)]).lower()
                    if row.startswith("floor") or row.endswith("bound"):
                        assert patch.get_hatch(), f"{name} {plot['name']}: {row} drawn as a measured bar"
            drawn += 1
    assert drawn >= 10, f"only {drawn} recorded plots found"


def learning_plot(env="ALE/Breakout-v5", **extra):
    x = [25_000 * (i + 1) for i in range(20)]
    return {"name": "curves", "title": f"PPO on {env}: median over seeds [0, 1, 2], shaded: their range",
            "kind": "line", "x": x, "series": {"ppo direct": [1.0 + i for i in range(20)]},
            "xlabel": "agent steps", "ylabel": "mean episode return", "log": False, "floors": [], "bands": {}, **extra}


def test_the_learning_curves_draw_the_quoted_figure_they_are_compared_with():
    quoted = _results.QUOTED["ALE/Breakout-v5"]
    fig = _results.plot_figure(learning_plot())
    ax = fig.axes[0]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert quoted.label() in legend and quoted.label().startswith("quoted: CleanRL ppo_atari.py")
    points = [tuple(line.get_xydata()[0]) for line in ax.get_lines() if line.get_marker() == "*"]
    assert points == [(quoted.frames, quoted.mean)]
    assert ax.get_xscale() == "log", "10M agent steps beside a 500k run: a linear axis would squash the run"
    assert _results.quoted_for(learning_plot(references=[])) == []
    assert _results.quoted_for(learning_plot(env="MinAtar/Breakout-v1")) == []
    assert _results.quoted_for(learning_plot(env="MinAtar/Breakout-v1", references=["HalfCheetah-v5"])) == \
        [_results.QUOTED["HalfCheetah-v5"]]


def test_the_learning_benchmark_compares_with_the_same_quoted_figures_the_plots_draw():
    import learning

    published = {preset: p.published for preset, p in learning.PRESETS.items() if p.published is not None}
    assert published == {"breakout": _results.QUOTED["ALE/Breakout-v5"], "pong": _results.QUOTED["ALE/Pong-v5"],
                         "halfcheetah": _results.QUOTED["HalfCheetah-v5"]}


def run(i, verdicts=("PASS a", "MISS b"), dirty=False):
    return {"date": f"2026-12-{i + 1:02d}T10:00:00Z", "commit": f"c{i:06d}", "dirty": dirty,
            "command": f"python benchmarks/collect.py --quick --seed {i}",
            "machine": {"cpu": "AMD EPYC", "cores": 2}, "verdicts": list(verdicts),
            "tables": [{"title": f"16 envs in total, run {i}: frames/s", "columns": [], "rows": []}]}


def test_the_history_table_lists_the_newest_runs_first_and_counts_the_older_ones():
    runs = [run(i) for i in range(20)]
    text = _results.history("collect", runs)
    rows = [line.strip() for line in text.splitlines() if "2026-" in line]
    assert len(rows) == _results.HISTORY_ROWS
    # the newest HISTORY_OPEN rows open, the older ones in a collapsed block of their own table, indented under it
    lines = text.splitlines()
    block = lines.index(f'??? note "{_results.HISTORY_ROWS - _results.HISTORY_OPEN} earlier runs"')
    assert sum(1 for line in lines[:block] if "2026-" in line) == _results.HISTORY_OPEN
    assert all(line.startswith("    |") for line in lines[block + 2:] if "2026-" in line)
    assert lines[block + 2] == "    | date | commit | machine | targets | command |"
    assert [row.split(" | ")[1] for row in rows] == [f"`c{i:06d}`" for i in range(19, 4, -1)]
    command = '<code><span class="nowrap">collect.py</span> <span class="nowrap">--quick</span>'
    assert command in rows[0] and "AMD EPYC, 2 cores" in rows[0]  # each argument kept whole: no break after a "--"
    assert "collect.py --quick --seed 19" in re.sub(r"<[^>]+>", "", rows[0])
    assert "1 of 2 met" in rows[0] and "2026-12-20" in rows[0]
    assert "20 runs recorded in `benchmarks/results/collect.json`" in text and "the 5 older ones" in text
    everything = _results.history("collect", runs, rows=len(runs))
    assert all(f"`c{i:06d}`" in everything for i in range(20))


def test_the_history_table_says_so_when_nothing_is_recorded_and_marks_a_dirty_tree():
    assert "No runs recorded yet" in _results.history("nothing", [])
    text = _results.history("collect", [run(0, verdicts=(), dirty=True)])
    (row,) = [line for line in text.splitlines() if "2026-" in line]
    assert "`c000000` + changes" in row and "| - |" in row
    assert "???" not in text  # nothing to fold away


def test_a_wide_table_of_few_rows_is_turned_to_fit_the_page_column():
    columns = ["cell", "requests", "lost", "duplicated", "misrouted", "wall s", "req/s", "growth"]
    rows = [["process/queue", 16000, 0, 0, 0, 1.51, 10596.0, "0.06%"], ["ray/ray", 16000, 0, 0, 0, 9.0, 1780.0, "1%"]]
    lines = _results.markdown_table({"columns": columns, "rows": rows}).splitlines()
    assert lines[0] == "| cell | process/queue | ray/ray |"
    assert lines[2] == "| requests | 16,000 | 16,000 |" and lines[-1] == "| growth | 0.06% | 1% |"
    assert len(lines) == 2 + len(columns) - 1
    narrow = _results.markdown_table({"columns": columns[:7], "rows": [row[:7] for row in rows]}).splitlines()
    assert narrow[0] == "| cell | requests | lost | duplicated | misrouted | wall s | req/s |"
    many = _results.markdown_table({"columns": columns, "rows": rows * 4}).splitlines()
    assert many[0].startswith("| cell | requests |") and len(many) == 2 + 8


def test_a_range_beside_a_median_stays_on_one_line():
    assert _results._cell("24,576 (24,064-28,672)") == '24,576 <span class="range">(24,064-28,672)</span>'
    assert _results._cell("5.16 [4.86-5.23]") == '5.16 <span class="range">[4.86-5.23]</span>'
    assert _results._cell([45757.0, 50388.0]) == '<span class="range">45,757-50,388</span>'
    assert _results._cell("3,795-6,132") == '<span class="range">3,795-6,132</span>'
    assert _results._cell("2026-12-02") == "2026-12-02"
    assert _results._cell("process/shared_memory async") == "process/shared_memory async"
    assert _results._cell("0.96x of the loop (target 1.0x)") == "0.96x of the loop (target 1.0x)"


def headline_run(date, verdicts, rows):
    return {"date": date, "commit": "abc1234", "dirty": False, "machine": {"cpu": "Intel(R) Xeon(R) Processor",
            "cores": 2}, "verdicts": verdicts,
            "tables": [{"title": "notes", "columns": ["what"], "rows": [["x"]]},
                       {"title": "64 envs in total", "columns": ["row", "frames/s", "range", "ratio", "range"],
                        "rows": rows}]}


def test_the_headlines_quote_the_newest_run_of_each_results_file(tmp_path):
    old = headline_run("2026-12-01T00:00:00Z", ["PASS a"], [["direct", 100.0, [90.0, 110.0], 1.0, None]])
    new = headline_run("2026-12-05T00:00:00Z", ["MISS b: 3 frames/s (target 4)", "PASS a"],
                       [["direct *", 12345.6, [12000.0, 13000.0], 0.95, "0.9-1.0"],
                        ["ppo process/local_policy (recorded in x.json)", 7.5, None, 1.2, "1.1-1.3"]])
    (tmp_path / "fast.json").write_text(json.dumps({"runs": [old, new]}))
    (tmp_path / "renamed.json").write_text(json.dumps({"runs": [new]}))
    rows = (
        _results.Headline("fast", "fast.md", "Fast", "frames/s", (
            _results.Figure("`direct` {frames/s} [{range}] frames/s, {ratio}x ({range#2})", "direct", "64 envs"),
            _results.Figure("PPO {ratio}x", "ppo process/local_policy", 1),
            _results.Figure("first row {frames/s}", None, "64 envs"))),
        _results.Headline("renamed", "renamed.md", "Renamed", "rows renamed", (
            _results.Figure("{frames/s}", "gone"), _results.Figure("{no such column}", "direct", 1))),
        _results.Headline("missing", "missing.md", "Missing", "no file"),
    )
    lines = _results.headlines(str(tmp_path), rows).splitlines()
    assert lines[0] == "| page | what it measures | newest run | headline |" and len(lines) == 2 + 3
    fast, renamed, missing = lines[2:]
    assert fast.startswith("| [Fast](fast.md) | frames/s | ")
    assert "2026-12-05" in fast and "`abc1234`" in fast and "Xeon, 2 cores" in fast and "targets 1 of 2 met" in fast
    text = re.sub(r"<[^>]+>", "", fast.split(" | ")[-1])
    assert text == ("`direct` 12,346 [12,000-13,000] frames/s, 0.95x (0.9-1.0); PPO 1.20x; first row 12,346 |")
    assert renamed.endswith("| b: 3 frames/s (target 4) |")  # nothing read: its first verdict stands
    assert missing.endswith("| - | no run recorded yet |")


def test_every_results_file_has_a_headline_whose_figures_read_from_its_newest_run():
    files = sorted(name[:-5] for name in os.listdir(_results.RESULTS_DIR) if name.endswith(".json"))
    named = [row.results for row in _results.HEADLINES]
    assert sorted(set(named) & set(files)) == files, "a results file without a row in HEADLINES"
    pages = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "pages", "benchmarks")
    unread = []
    for row in _results.HEADLINES:
        assert os.path.exists(os.path.join(pages, row.page)), row.page
        runs = _results.load(os.path.join(_results.RESULTS_DIR, f"{row.results}.json"))
        unread += [(row.results, f.text) for f in row.figures if runs and _results.figure_text(runs[-1], f) is None]
    assert not unread, f"figures a rerun no longer records (rename their rows or columns in HEADLINES): {unread}"
