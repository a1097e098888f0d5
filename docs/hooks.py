"""MkDocs hooks: the tables the code holds, generated into the pages at build time.

A page asks for one with a marker on a line of its own, replaced by the generated Markdown:

    <!-- generated: compatibility -->        the compatibility table (components.compat.render_markdown)
    <!-- generated: configuration -->        every YAML key: type, default, range, meaning (launcher.reference)
    <!-- generated: transports -->           every registered transport's descriptor, one row each
    <!-- generated: transport KIND -->       one transport's descriptor and options
    <!-- generated: benchmark NAME -->       the newest run in benchmarks/results/NAME.json, with its plots
    <!-- generated: history NAME -->         one line per recorded run of benchmarks/results/NAME.json
    <!-- generated: headlines -->            the benchmarks index: each results file's newest run and its figures
    <!-- generated: groups -->               every config group in conf/ and its options (launcher.reference)
    <!-- generated: recipe_envs -->          every recipe x env setting in conf/recipe_env/ (launcher.reference)

A marker that names nothing known fails the build (``mkdocs build --strict``), as does a page a marker points at
that does not exist.
"""

from __future__ import annotations

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _import_paths() -> None:
    """The project and its benchmarks on ``sys.path`` (MkDocs restores ``sys.path`` after loading a hook, so each hook
    function asks again)."""
    for path in (ROOT, os.path.join(ROOT, "benchmarks")):
        if path not in sys.path:
            sys.path.insert(0, path)

MARKER = re.compile(r"^<!-- generated: (\w+)(?: ([\w.-]+))? -->$", re.M)


def _generate(what: str, arg: str | None, page_path: str) -> str:
    _import_paths()
    if what == "compatibility":
        from components.compat import render_markdown

        return render_markdown()
    if what == "configuration":
        from launcher.reference import configuration

        return configuration()
    if what == "transports":
        from launcher.reference import transports_table

        return transports_table()
    if what == "transport" and arg:
        from launcher.reference import transport

        return transport(arg)
    if what == "groups":
        from launcher.reference import groups

        return groups()
    if what == "recipe_envs":
        from launcher.reference import recipe_envs

        return recipe_envs()
    if what == "headlines":
        import _results

        return _results.headlines()
    if what == "history" and arg:
        import _results

        return _results.history(arg, _results.load(os.path.join(_results.RESULTS_DIR, f"{arg}.json")))
    if what == "benchmark" and arg:
        import _results

        runs = _results.load(os.path.join(_results.RESULTS_DIR, f"{arg}.json"))
        depth = page_path.count("/")
        return _results.page(arg, runs, image_dir="../" * depth + "images/")
    raise ValueError(f"{page_path}: unknown generated block {what!r} {arg or ''}".strip())


def on_page_markdown(markdown, page, config, files):
    return MARKER.sub(lambda m: _generate(m.group(1), m.group(2), page.file.src_uri), markdown)


def on_files(files, config):
    """Every recorded benchmark plot, drawn from the newest run of its results file, as images/<bench>_<plot>.png."""
    _import_paths()
    import _results
    from mkdocs.structure.files import File

    if not os.path.isdir(_results.RESULTS_DIR):
        return files
    for name in sorted(os.listdir(_results.RESULTS_DIR)):
        if not name.endswith(".json"):
            continue
        benchmark = name[:-5]
        runs = _results.load(os.path.join(_results.RESULTS_DIR, name))
        for plot in (runs[-1].get("plots", []) if runs else []):
            files.append(File.generated(config, f"images/{benchmark}_{plot['name']}.png",
                                        content=_results.plot_png(plot)))
    return files
